"""Sharing a cluster into another workspace puts that workspace's work on a cluster its owner runs:
only a platform admin may, and a refusal says what was refused and who may. Pure."""

from __future__ import annotations

from levers9.gateway.auth import ADMIN_WORKSPACE, Caller
from levers9.gateway.routes_clusters import share_refusal


def test_only_a_platform_admin_shares_a_cluster():
    assert share_refusal(Caller(workspace=ADMIN_WORKSPACE, token_id="t"), "gpu", "teamb") == ""


def test_an_owner_without_the_admin_token_is_refused_with_what_and_why():
    why = share_refusal(Caller(workspace="acme", token_id="t"), "gpu", "victim")
    assert why.startswith("sharing cluster 'gpu' into workspace 'victim' was refused")
    assert "platform admin's token" in why and "--owner acme" in why


def test_a_worker_or_join_token_of_the_admin_workspace_is_refused_too():
    for scope in ("worker:w1", "cluster:gpu"):
        assert share_refusal(Caller(workspace=ADMIN_WORKSPACE, token_id="t", scope=scope), "gpu", "teamb")
