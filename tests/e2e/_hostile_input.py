"""Hostile-tenant cases: input (collected through test_hostile_tenant.py, which holds the stack)."""
