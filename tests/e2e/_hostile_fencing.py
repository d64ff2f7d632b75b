"""Hostile-tenant cases: fencing (collected through test_hostile_tenant.py, which holds the stack)."""
