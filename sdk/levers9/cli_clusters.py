"""CLI commands for attached clusters: `levers9 clusters attach|list|share|detach` and `levers9 agent`.

attach prints the join token once (on stderr) and the manifest to apply in the cluster (on stdout, so
`levers9 clusters attach c1 > c1.yaml` keeps it); README "Attached clusters" says what it holds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional
from urllib.parse import quote

import typer

from levers9.cli_output import JSON_OPTION, client, console, errors, print_json, show_rows

clusters_app = typer.Typer(help="Clusters a workspace attaches: its own Kubernetes, running levers9 workers.",
                           no_args_is_help=True)


def _call(method: str, path: str, what: str, **kwargs: Any) -> Any:
    return client()._call(method, path, what, "levers9 clusters list", **kwargs)


@clusters_app.command("attach")
def attach(name: str = typer.Argument(..., help="1-40 of a-z, 0-9 and '-'; unique on the platform"),
           namespace: str = typer.Option("levers9-agent", help="the cluster's namespace for the agent and workers"),
           image: str = typer.Option("levers9:0.1.0", help="the levers9 image the agent runs"),
           gateway_url: Optional[str] = typer.Option(None, "--gateway-url",
                                                     help="the gateway URL as the cluster reaches it "
                                                          "(default: this profile's)"),
           json_out: bool = JSON_OPTION) -> None:
    """Attach cluster NAME to this workspace: print its agent's join token and the manifest to apply."""
    from levers9.agent_manifest import render

    with errors():
        c = client()
        doc = c._call("POST", "/api/v1/clusters", f"attaching cluster {name!r}", "levers9 clusters list",
                      json={"name": name})
    manifest = render(doc["name"], doc["token"], gateway_url or c.gateway_url, namespace, image)
    if json_out:
        print_json({**doc, "manifest": manifest})
        return
    console.print(f"cluster {doc['name']} attached to workspace {doc['workspace']}; its join token (shown once, "
                  f"also in the manifest's Secret): {doc['token']}")
    console.print("apply the manifest below in that cluster (kubectl apply -f -), then create the pool's Secret")
    typer.echo(manifest)


@clusters_app.command("list")
def list_clusters(json_out: bool = JSON_OPTION) -> None:
    """Clusters this workspace attached or was shared, and whether their agent is connected."""
    with errors():
        rows = _call("GET", "/api/v1/clusters", "listing clusters")
    show_rows(rows, ["name", "workspace", "shared_with", "agent", "agent_last_seen", "attached_at"], json_out)


@clusters_app.command("share")
def share(name: str, workspace: str = typer.Option(..., "--workspace", help="the workspace to share it with"),
          owner: str = typer.Option("", "--owner", help="the workspace that attached it (default: this profile's)"),
          json_out: bool = JSON_OPTION) -> None:
    """Let WORKSPACE's work run on cluster NAME too (a platform admin's token only: the admin workspace's)."""
    with errors():
        doc = _call("POST", f"/api/v1/clusters/{quote(name, safe='')}/share", f"sharing cluster {name!r}",
                    json={"workspace": workspace, **({"owner": owner} if owner else {})})
    print_json(doc) if json_out else console.print(f"cluster {name} shared with workspace {workspace}")


@clusters_app.command("detach")
def detach(name: str, json_out: bool = JSON_OPTION) -> None:
    """Detach cluster NAME: no more work goes there, its join token is revoked, its agent cut off."""
    with errors():
        doc = _call("DELETE", f"/api/v1/clusters/{quote(name, safe='')}", f"detaching cluster {name!r}")
    print_json(doc) if json_out else console.print(f"cluster {name} detached")


def agent(gateway: str = typer.Option(..., "--gateway", envvar="LEVERS9_GATEWAY_URL", help="the gateway's URL"),
          token: str = typer.Option(..., "--token", envvar="LEVERS9_AGENT_TOKEN", help="the cluster's join token"),
          cluster: str = typer.Option(..., "--cluster", envvar="LEVERS9_CLUSTER", help="the cluster's name"),
          namespace: str = typer.Option("levers9-agent", "--namespace", envvar="LEVERS9_AGENT_NAMESPACE",
                                        help="where worker pods are created"),
          kubeconfig: str = typer.Option("", "--kubeconfig", envvar="KUBECONFIG",
                                         help="default: in-cluster (the agent's ServiceAccount)")) -> None:
    """Run an attached cluster's agent: dial out to the gateway, run worker pods when asked."""
    from levers9.agent import AgentConfig, Refused, run
    from levers9.agent_pods import Pods, load_api

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = AgentConfig(gateway, token, cluster, namespace)
    try:
        asyncio.run(run(cfg, Pods(load_api(kubeconfig), namespace)))
    except KeyboardInterrupt:
        pass
    except Refused as e:
        console.print(str(e))
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    app.add_typer(clusters_app, name="clusters")
    app.command("agent")(agent)
