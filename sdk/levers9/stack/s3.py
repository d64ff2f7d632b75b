"""The S3 launcher: SeaweedFS (`weed server` with its S3 gateway), its data under home/s3/.

Eight ports are chosen up front (s3, master, volume, filer and their gRPC ports): weed would otherwise
use port+10000 for gRPC without checking it is free. Its identities are this stack's generated keys
(levers9.stack.credentials): the admin's, and one per service role with only the actions that role
uses; no anonymous access, and never a fixed key pair.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from levers9.runtime.catalogues import PLATFORM_BUCKET

from . import credentials, procs
from .home import Home, Launch, Server
from .procs import LOCALHOST, NO_PROXY, Progress, binary, http_status

if TYPE_CHECKING:
    from levers9.runtime.config import Settings

NAMES = ("s3", "master", "volume", "filer")


def launch(home: Home, settings: Settings, progress: Progress) -> Launch:
    ports = dict(zip(NAMES + tuple(f"{n}_grpc" for n in NAMES), procs.free_ports(8), strict=True))
    data = home.path / "s3"
    data.mkdir(parents=True, exist_ok=True)  # weed exits if -dir does not exist
    # the master keeps its raft state in dir/m<port>: with new ports each start it starts afresh
    # (and learns the volumes from the volume server), so old ones are only clutter
    for old in data.glob("m[0-9]*"):
        shutil.rmtree(old, ignore_errors=True)
    cmd = [binary("weed"), "-logtostderr", "server", marker(home.path), f"-ip={LOCALHOST}",
           f"-ip.bind={LOCALHOST}", "-s3", f"-s3.config={_identities(home, settings)}",
           "-master.volumeSizeLimitMB=128",
           "-volume.max=0",  # volumes by free space: the default 8 runs out after a bucket or two
           "-master.telemetry=false",  # it would report to telemetry.seaweedfs.com
           "-s3.port.iceberg=0", "-s3.port.lance=0"]  # fixed ports 8181/9101 by default
    cmd += [f"-{n}.port={ports[n]}" for n in NAMES]
    cmd += [f"-{n}.port.grpc={ports[n + '_grpc']}" for n in NAMES]  # else port+10000, unchecked
    progress(f"s3: starting SeaweedFS on {LOCALHOST}:{ports['s3']}")
    proc, offset = home.spawn("s3", cmd)
    url = f"http://{LOCALHOST}:{ports['s3']}"
    entry = {"pid": proc.pid, "port": ports["s3"], "ports": ports, "external": False, "url": url, "roles": True,
             "home": str(home.path), "buckets": [settings.storage.volumes_bucket, PLATFORM_BUCKET]}
    return Launch("s3", proc, offset, entry, lambda: ready(url, ports["master"]))


def marker(home: Path) -> str:
    return f"-dir={home / 's3'}"


def probe(url: str, entry: dict | None) -> bool:
    return http_status(url.rstrip("/") + "/") > 0


def ready(s3_url: str, master_port: int) -> bool:
    """S3 answers HTTP a second before it can serve objects: until the master knows the volume
    server, reads fail ("volume 5 not found"). So also wait for a data node in the topology."""
    if http_status(s3_url + "/") <= 0:
        return False
    with NO_PROXY.open(f"http://{LOCALHOST}:{master_port}/dir/status", timeout=1.0) as response:
        topology = json.loads(response.read()).get("Topology") or {}
    return any(rack.get("DataNodes") for dc in topology.get("DataCenters") or []
               for rack in dc.get("Racks") or [])


def after_ready(launch: Launch, progress: Progress) -> None:
    """The platform's own buckets, made by the admin: putting into a missing bucket would create it,
    and SeaweedFS lets only an unlimited Admin do that (JuiceFS's format puts before it creates)."""
    key = credentials.ensure(Path(launch.entry["home"]))["s3"][credentials.ADMIN]
    for bucket in create_buckets(launch.entry["url"], key, launch.entry.get("buckets", [])):
        progress(f"s3: created bucket {bucket}")


def create_buckets(endpoint: str, key: dict[str, str], buckets: list[str]) -> list[str]:
    """Create the missing ones of `buckets` with the admin's `key`; those it created."""
    import botocore.session
    from botocore.exceptions import ClientError

    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, aws_access_key_id=key["access_key"],
        aws_secret_access_key=key["secret_key"], region_name="us-east-1")
    created = []
    for bucket in buckets:
        try:
            client.head_bucket(Bucket=bucket)
        except ClientError:
            client.create_bucket(Bucket=bucket)
            created.append(bucket)
    return created


def cleanup(home: Path, state: dict) -> None:
    """weed leaves unix sockets named after its ports in /tmp."""
    for port in state["components"].get("s3", {}).get("ports", {}).values():
        for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            sock.unlink(missing_ok=True)


def identities(creds: dict, volumes_bucket: str) -> dict:
    """The -s3.config document (pure): one identity per role, with its own key and actions."""
    return {"identities": [
        {"name": role, "actions": credentials.s3_actions(role, volumes_bucket),
         "credentials": [{"accessKey": key["access_key"], "secretKey": key["secret_key"]}]}
        for role, key in sorted(creds["s3"].items()) if role in credentials.s3_roles()]}


def _identities(home: Home, settings: Settings) -> Path:
    """The -s3.config file, 0600."""
    doc = identities(credentials.ensure(home.path), settings.storage.volumes_bucket)
    path = home.path / "run" / "s3-identities.json"
    credentials.write_private(path, json.dumps(doc))
    return path


# `weed server` 4.48 stops its filer on SIGTERM/SIGINT but then never exits: SIGKILL it soon. Its
# volumes and filer store are written through the page cache, so a kill loses nothing.
SERVER = Server("s3", launch=launch, marker=marker, probe=probe, max_stop_timeout=2.0, cleanup=cleanup,
                after_ready=after_ready,
                current=lambda entry: bool(entry.get("roles")))
