"""Settings: every setting has one name, `LEVERS9_<NAME>` in the environment and `<name>` in the profile.

Precedence: environment, then the profile (`$LEVERS9_HOME/config.toml`), then the default.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path

# profile keys a service process ignores: its environment carries the credentials of its role
PROFILE_CREDENTIALS = frozenset({"database_url", "s3_access_key", "s3_secret_key", "token", "worker_token",
                                 "secret_key", "secret_key_file", "nats_creds", "nats_issuer", "bus_signing_key",
                                 "worker_credentials"})
SERVICES = ("gateway", "scheduler", "pool-controller", "checkpoint-store", "image-builder", "worker")


def default_home() -> Path:
    return Path(os.environ.get("LEVERS9_HOME") or Path.home() / ".levers9").expanduser()


@dataclass(frozen=True)
class Settings:
    home: str = ""
    # servers; empty means "levers9 up starts its own"
    nats_url: str = ""
    nats_auth: str = ""  # on | off; `levers9 up` turns it on (README "Credentials on the bus")
    nats_creds: str = ""  # this process's NATS user (.creds file); empty: connect without
    nats_issuer: str = ""  # home/nats/auth: the keys that mint users (the pool controller, the CLI)
    nats_tls_cert: str = ""  # PEM files: our NATS serves TLS when both are set
    nats_tls_key: str = ""
    bus_signing_key: str = ""  # this process's key for the power events it owns (bus_signing.py)
    bus_signers: str = ""  # every role's public signing key: consumers reject unsigned power events
    database_url: str = ""
    s3_endpoint: str = ""
    s3_access_key: str = ""  # `levers9 up` generates keys per stack and per role (levers9.stack.credentials)
    s3_secret_key: str = ""
    s3_region: str = "us-east-1"
    registry: str = ""  # the OCI registry images are pushed to, host:port (plain HTTP: loopback only)
    # the client profile
    gateway_url: str = ""
    token: str = ""
    # one service process
    service: str = ""
    http_host: str = "127.0.0.1"
    http_port: int = 0
    worker_id: str = ""
    worker_pool: str = "default"
    worker_cpu_millicores: int = 0  # capacity a worker offers; 0: the whole machine
    worker_memory_mib: int = 0
    worker_token: str = ""
    worker_credentials: str = ""  # the pool controller: the directory of its workers' credentials (0600 files)
    worker_gpu_type: str = ""  # the pool's GPU type; the inventory comes from NVML when present
    worker_gpu_count: int = 0  # cards configured for this worker when NVML detects none
    worker_criu: str = "auto"  # auto | on | off: checkpoint/restore on this worker (the pool's `criu`)
    cache_port: int = 2050  # the node content cache
    relay_port: int = 0  # the worker's executor relay (function sandboxes); 0: any free port
    grpc_port: int = 0  # the gateway's gRPC for function calls; 0: any free port (GET /api/v1/functions/info)
    sandbox_python: str = "3.11"  # the platform base image's python3 (Debian 12); function clients must match
    grpc_tls_cert: str = ""  # PEM files: the gateway's gRPC serves TLS when both are set
    grpc_tls_key: str = ""
    session_idle_seconds: int = 300
    # shared pre-import checkpoints captured with other sandbox settings than this worker's: "drop"
    # them (and say why), "keep" them anyway (a restore may then fail and start cold), or "off"
    worker_shared_checkpoints: str = "drop"  # a function session's sandbox stops after this long without a call
    cache_max_bytes: int = 20 * 1024 ** 3  # the token the pool controller gave this worker alone
    runtime: str = "auto"  # auto | runc | process
    bridge_name: str = "levers9br0"
    bridge_subnet: str = "10.209.0.0/24"  # containers' addresses; keep it clear of real networks
    # workers as hosts (pool backend "netns"): each worker in its own network namespace on this
    # underlay bridge and subnet (host side = its first address), its containers on its own /24 of
    # hosts_container_supernet, published at host_address:publish_port_base+N (levers9.runtime.hosts)
    hosts_bridge: str = "levers9hosts"
    hosts_subnet: str = "10.210.0.0/24"
    hosts_container_supernet: str = "10.209.0.0/16"
    host_address: str = ""  # this worker's address as a host; empty: containers are reached at their bridge IP
    publish_port_base: int = 20000
    cache_dir: str = ""  # the node cache's blobs; empty: <image_cache>/blobs (shared by the machine's workers)
    container_peers: str = "none"  # which containers may reach each other: none | deployment | workspace
    container_egress: str = ""  # networks containers may connect to beyond the bridge (CIDRs, comma-separated)
    # build steps and package installs reach package indexes only, through the worker's egress proxy
    # (levers9.worker.network.egress): the host's pip and apt sources, and these hosts (host[:port], comma-separated)
    egress_allow: str = ""
    egress_proxy_port: int = 0  # where that proxy listens on the bridge's host address; 0: any free port
    image_cache: str = "/var/cache/levers9"  # base root file systems, shared by workers of a machine
    pools_file: str = ""  # pools config (TOML); empty: one pool `default`, local backend, 1 warm worker
    secret_key: str = ""  # the secrets keyring inline (levers9.runtime.secrets); else secret_key_file
    secret_key_file: str = ""  # the secrets keyring file; `levers9 up` writes one (0600) and names it here
    max_body_bytes: int = 16 * 1024 * 1024
    # volumes: the JuiceFS file system (data in this S3 bucket, metadata in the database), mounted
    # by each worker and the gateway under data_dir/<its name> (empty: <home>/data)
    volumes_bucket: str = "levers9-volumes"
    data_dir: str = ""
    # consumers
    max_deliver: int = 5
    fetch_batch: int = 256
    # telemetry
    log_level: str = "INFO"
    log_format: str = "json"
    otel_exporter: str = "none"  # none | console

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def env_names(cls) -> list[str]:
        return [f"LEVERS9_{n.upper()}" for n in cls.names()]

    @classmethod
    def load(cls, env: dict[str, str] | None = None, profile: Path | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        home = Path(env.get("LEVERS9_HOME") or Path.home() / ".levers9").expanduser()
        profile = profile or home / "config.toml"
        values: dict[str, object] = {}
        if profile.exists():
            with profile.open("rb") as f:
                data = tomllib.load(f)
            # a service's credentials are those its environment gives its role, never the profile's
            # (the client's: its token, the admin's S3 keys)
            service = bool(env.get("LEVERS9_SERVICE"))
            values.update({k: v for k, v in data.items() if k in cls.names()
                           and not (service and k in PROFILE_CREDENTIALS)})
        for field in fields(cls):
            raw = env.get(f"LEVERS9_{field.name.upper()}")
            if raw is not None and raw != "":
                values[field.name] = int(raw) if field.type in ("int", int) else raw
        values["home"] = str(home)
        return cls(**values)  # type: ignore[arg-type]

    def with_(self, **changes: object) -> "Settings":
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def home_path(self) -> Path:
        return Path(self.home)

    def as_env(self) -> dict[str, str]:
        """The settings as LEVERS9_* variables, for a child process."""
        return {f"LEVERS9_{f.name.upper()}": str(getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) not in ("", 0) or f.name in ("http_port",)}


def write_profile(path: Path, values: dict[str, object]) -> None:
    """Write a flat TOML profile (strings and ints only), keeping keys already there."""
    current: dict[str, object] = {}
    if path.exists():
        with path.open("rb") as f:
            current = tomllib.load(f)
    current.update(values)
    lines = []
    for key, value in current.items():
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            continue
        lines.append(f"{key} = {value}" if isinstance(value, int) else f'{key} = "{_toml_escape(value)}"')
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)


def _toml_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
