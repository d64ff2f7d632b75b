"""Hostile-tenant cases: burst (collected through test_hostile_tenant.py, which holds the stack)."""
