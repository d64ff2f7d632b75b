"""Hostile-tenant cases: builds (collected through test_hostile_tenant.py, which holds the stack)."""
