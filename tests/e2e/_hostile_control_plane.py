"""Hostile-tenant cases: control_plane (collected through test_hostile_tenant.py, which holds the stack)."""
