"""Settings: every setting has one name, `LEVERS9_<NAME>` in the environment and `<name>` in the profile.

Precedence: environment, then the profile (`$LEVERS9_HOME/config.toml`), then the default.

In code the settings are grouped by concern (`settings.bus.nats_url`, `settings.worker.criu`); each
field declares its flat name (`nats_url`, `worker_criu`), which is the only name outside the code.
Values are typed at load: integers, on/off as bool, enumerated values as `StrEnum`s; a value that
does not parse stops the load with an error naming the variable and what it may be. `LEVERS9_*`
variables that are neither a setting nor in `NOT_SETTINGS` are collected in `unknown_env`, so each
service and the CLI can say which ones it ignored (a typo would otherwise be silent).

Stdlib only: the SDK's function client and the deploy-file tests import this module alone.
"""

from __future__ import annotations

import enum
import os
import tomllib
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# profile keys a service process ignores: its environment carries the credentials of its role
PROFILE_CREDENTIALS = frozenset({"database_url", "s3_access_key", "s3_secret_key", "token", "worker_token",
                                 "secret_key", "secret_key_file", "nats_creds", "nats_issuer", "bus_signing_key",
                                 "worker_credentials"})
SERVICES = ("gateway", "scheduler", "pool-controller", "checkpoint-store", "image-builder", "worker")
# LEVERS9_* variables that are not settings but are used on purpose: what the worker gives a
# container (the runner, the executor), the attached-cluster agent's options, test and script knobs
NOT_SETTINGS = frozenset({
    "LEVERS9_CONTAINER_ID", "LEVERS9_DEPLOYMENT_ID", "LEVERS9_EXECUTOR_SOCKET", "LEVERS9_EXECUTOR_PACKAGES_DIR",
    "LEVERS9_WORKER_MANAGED_BY", "LEVERS9_AGENT_TOKEN", "LEVERS9_CLUSTER", "LEVERS9_AGENT_NAMESPACE",
    "LEVERS9_E2E_BACKEND", "LEVERS9_TEST_EXAMPLES", "LEVERS9_TEST_LANES", "LEVERS9_BASE_IMAGE",
})
NOT_SETTINGS_PREFIXES = ("LEVERS9_RUNNER_",)  # the runner's options inside a container (runner/config.py)


class SettingError(ValueError):
    """A setting's value does not parse; the message names the variable and what it may be."""


class Choice(enum.StrEnum):
    """An enumerated setting; it parses case-insensitively."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if isinstance(value, str):
            for member in cls:
                if member.value.lower() == value.strip().lower():
                    return member
        return None


class Criu(Choice):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class RuntimeKind(Choice):
    AUTO = "auto"
    RUNC = "runc"
    PROCESS = "process"


class SharedCheckpoints(Choice):
    DROP = "drop"  # drop (and say why) shared checkpoints captured with other sandbox settings
    KEEP = "keep"  # keep them anyway (a restore may then fail and start cold)
    OFF = "off"  # use none


class ContainerPeers(Choice):
    NONE = "none"
    DEPLOYMENT = "deployment"
    WORKSPACE = "workspace"


class ImageMount(Choice):
    LAZY = "lazy"
    UNPACK = "unpack"


class LogLevel(Choice):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class LogFormat(Choice):
    JSON = "json"
    TEXT = "text"


class OtelExporter(Choice):
    NONE = "none"
    CONSOLE = "console"


def setting(name: str, default: Any) -> Any:
    """A grouped field and its one flat name (`LEVERS9_<NAME>`, profile key `<name>`)."""
    return field(default=default, metadata={"name": name})


@dataclass(frozen=True)
class ProcessSettings:
    """One service process: which one, and where its HTTP server listens."""
    service: str = setting("service", "")
    http_host: str = setting("http_host", "127.0.0.1")
    http_port: int = setting("http_port", 0)


@dataclass(frozen=True)
class BusSettings:
    """NATS; an empty URL means `levers9 up` starts its own."""
    nats_url: str = setting("nats_url", "")
    auth: bool | None = setting("nats_auth", None)  # None: not chosen; `levers9 up` turns it on (README)
    creds: str = setting("nats_creds", "")  # this process's NATS user (.creds file); empty: connect without
    issuer: str = setting("nats_issuer", "")  # home/nats/auth: the keys that mint users (pool controller, CLI)
    tls_cert: str = setting("nats_tls_cert", "")  # PEM files: our NATS serves TLS when both are set
    tls_key: str = setting("nats_tls_key", "")
    signing_key: str = setting("bus_signing_key", "")  # this process's key for the power events it owns
    signers: str = setting("bus_signers", "")  # every role's public signing key: unsigned power events rejected


@dataclass(frozen=True)
class DatabaseSettings:
    url: str = setting("database_url", "")


@dataclass(frozen=True)
class StorageSettings:
    """S3, and the volumes' JuiceFS file system (data in volumes_bucket, metadata in the database),
    mounted by each worker and the gateway under data_dir/<its name> (empty: <home>/data)."""
    s3_endpoint: str = setting("s3_endpoint", "")
    s3_access_key: str = setting("s3_access_key", "")  # `levers9 up` generates keys per stack and role
    s3_secret_key: str = setting("s3_secret_key", "")
    s3_region: str = setting("s3_region", "us-east-1")
    volumes_bucket: str = setting("volumes_bucket", "levers9-volumes")
    data_dir: str = setting("data_dir", "")


@dataclass(frozen=True)
class RegistrySettings:
    address: str = setting("registry", "")  # where images are pushed, host:port (plain HTTP: loopback only)


@dataclass(frozen=True)
class ClientSettings:
    """The client profile: which gateway, as whom."""
    gateway_url: str = setting("gateway_url", "")
    token: str = setting("token", "")
    functions_url: str = setting("functions_url", "")  # the function service's host:port; empty: ask the gateway
    ca_file: str = setting("ca_file", "")  # a CA bundle to trust for the function service's TLS


@dataclass(frozen=True)
class GatewaySettings:
    max_body_bytes: int = setting("max_body_bytes", 16 * 1024 * 1024)
    task_runners: int = setting("task_runners", 32)  # tasks one gateway runs at once (task_runner.py)
    # a proxied WebSocket (ws_proxy.py) is closed (1001) after this long with no message either way
    websocket_idle_timeout_s: int = setting("websocket_idle_timeout_s", 300)
    # a proxied WebSocket message larger than this, either way, closes the connection with 1009
    websocket_max_message_bytes: int = setting("websocket_max_message_bytes", 1024 * 1024)


@dataclass(frozen=True)
class FunctionsSettings:
    """Function calls (the gateway's gRPC) and the sandboxes that run them (workers)."""
    grpc_port: int = setting("grpc_port", 0)  # 0: any free port (GET /api/v1/functions/info)
    grpc_tls_cert: str = setting("grpc_tls_cert", "")  # PEM files: the gRPC serves TLS when both are set
    grpc_tls_key: str = setting("grpc_tls_key", "")
    sandbox_python: str = setting("sandbox_python", "3.11")  # the base image's python3; clients must match
    session_idle_seconds: int = setting("session_idle_seconds", 300)  # a session's sandbox stops after this
    relay_port: int = setting("relay_port", 0)  # the worker's executor relay; 0: any free port
    # shared pre-import checkpoints captured with other sandbox settings than this worker's
    shared_checkpoints: SharedCheckpoints = setting("worker_shared_checkpoints", SharedCheckpoints.DROP)


@dataclass(frozen=True)
class WorkerSettings:
    id: str = setting("worker_id", "")
    pool: str = setting("worker_pool", "default")
    token: str = setting("worker_token", "")  # the token the pool controller gave this worker alone
    cpu_millicores: int = setting("worker_cpu_millicores", 0)  # capacity offered; 0: the whole machine
    memory_mib: int = setting("worker_memory_mib", 0)
    gpu_type: str = setting("worker_gpu_type", "")  # the pool's GPU type; the inventory comes from NVML
    gpu_count: int = setting("worker_gpu_count", 0)  # cards configured when NVML detects none
    criu: Criu = setting("worker_criu", Criu.AUTO)  # checkpoint/restore on this worker (the pool's `criu`)
    runtime: RuntimeKind = setting("runtime", RuntimeKind.AUTO)


@dataclass(frozen=True)
class PoolsSettings:
    """The pool controller."""
    file: str = setting("pools_file", "")  # pools (TOML); empty: pool `default`, local backend, 1 warm worker
    worker_credentials: str = setting("worker_credentials", "")  # its workers' credentials (0600 files)


@dataclass(frozen=True)
class NetworkSettings:
    """Containers' networks. Workers as hosts (pool backend "netns"): each worker in its own network
    namespace on the underlay hosts_bridge/hosts_subnet, its containers on its own /24 of
    hosts_container_supernet, published at host_address:publish_port_base+N (levers9.runtime.hosts)."""
    bridge_name: str = setting("bridge_name", "levers9br0")
    bridge_subnet: str = setting("bridge_subnet", "10.209.0.0/24")  # keep it clear of real networks
    hosts_bridge: str = setting("hosts_bridge", "levers9hosts")
    hosts_subnet: str = setting("hosts_subnet", "10.210.0.0/24")
    hosts_container_supernet: str = setting("hosts_container_supernet", "10.209.0.0/16")
    host_address: str = setting("host_address", "")  # empty: containers are reached at their bridge IP
    publish_port_base: int = setting("publish_port_base", 20000)
    container_peers: ContainerPeers = setting("container_peers", ContainerPeers.NONE)  # who may reach whom
    container_egress: str = setting("container_egress", "")  # CIDRs beyond the bridge, comma-separated
    # build steps and installs reach package indexes only, through the worker's egress proxy: the
    # host's pip and apt sources, and these hosts (host[:port], comma-separated)
    egress_allow: str = setting("egress_allow", "")
    egress_proxy_port: int = setting("egress_proxy_port", 0)  # on the bridge's host address; 0: any free


@dataclass(frozen=True)
class ImagesSettings:
    image_cache: str = setting("image_cache", "/var/cache/levers9")  # base root file systems, per machine
    cache_port: int = setting("cache_port", 2050)  # the node content cache
    cache_dir: str = setting("cache_dir", "")  # the node cache's blobs; empty: <image_cache>/blobs
    cache_max_bytes: int = setting("cache_max_bytes", 20 * 1024 ** 3)
    mount: ImageMount = setting("image_mount", ImageMount.LAZY)  # lazy (FUSE) or unpack
    # an image stays mounted this long after its last container (a scale-from-zero finds it warm)
    mount_grace_seconds: int = setting("image_mount_grace_s", 300)


@dataclass(frozen=True)
class ConsumersSettings:
    max_deliver: int = setting("max_deliver", 5)
    fetch_batch: int = setting("fetch_batch", 256)


@dataclass(frozen=True)
class TelemetrySettings:
    log_level: LogLevel = setting("log_level", LogLevel.INFO)
    log_format: LogFormat = setting("log_format", LogFormat.JSON)
    otel_exporter: OtelExporter = setting("otel_exporter", OtelExporter.NONE)


@dataclass(frozen=True)
class SecretsSettings:
    key: str = setting("secret_key", "")  # the secrets keyring inline (levers9.runtime.secrets)
    key_file: str = setting("secret_key_file", "")  # the keyring file; `levers9 up` writes one (0600)


@dataclass(frozen=True)
class Spec:
    """Where one flat setting lives and what it parses to."""
    name: str
    group: str  # "" for home
    attr: str
    type: Any
    default: Any


def default_home() -> Path:
    return Path(os.environ.get("LEVERS9_HOME") or Path.home() / ".levers9").expanduser()


@dataclass(frozen=True)
class Settings:
    home: str = setting("home", "")
    process: ProcessSettings = field(default_factory=ProcessSettings)
    bus: BusSettings = field(default_factory=BusSettings)
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    functions: FunctionsSettings = field(default_factory=FunctionsSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    pools: PoolsSettings = field(default_factory=PoolsSettings)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    images: ImagesSettings = field(default_factory=ImagesSettings)
    consumers: ConsumersSettings = field(default_factory=ConsumersSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    secrets: SecretsSettings = field(default_factory=SecretsSettings)
    # LEVERS9_* variables of the environment that are neither settings nor NOT_SETTINGS (a report)
    unknown_env: tuple[str, ...] = field(default=(), compare=False)
    # the flat names the environment or the profile set (a default is not a choice)
    given: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def specs(cls) -> dict[str, Spec]:
        return _SPECS

    @classmethod
    def names(cls) -> list[str]:
        return list(_SPECS)

    @classmethod
    def env_names(cls) -> list[str]:
        return [f"LEVERS9_{n.upper()}" for n in _SPECS]

    @classmethod
    def load(cls, env: dict[str, str] | None = None, profile: Path | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        home = Path(env.get("LEVERS9_HOME") or Path.home() / ".levers9").expanduser()
        profile = profile or home / "config.toml"
        values: dict[str, Any] = {}
        if profile.exists():
            with profile.open("rb") as f:
                data = tomllib.load(f)
            # a service's credentials are those its environment gives its role, never the profile's
            # (the client's: its token, the admin's S3 keys)
            service = bool(env.get("LEVERS9_SERVICE"))
            for key, raw in data.items():
                if key in _SPECS and not (service and key in PROFILE_CREDENTIALS):
                    values[key] = _parse(_SPECS[key], raw, f"{key} in {profile}")
        for name, spec in _SPECS.items():
            variable = f"LEVERS9_{name.upper()}"
            raw = env.get(variable)
            if raw is not None and raw != "":
                values[name] = _parse(spec, raw, variable)
        given = frozenset(values)
        values["home"] = str(home)
        return _build(cls(unknown_env=unknown_variables(env), given=given), values)

    def with_(self, **changes: object) -> "Settings":
        """A copy with these settings changed, by flat name (`s.with_(service="worker", nats_url=…)`)."""
        unknown = sorted(set(changes) - set(_SPECS))
        if unknown:
            raise TypeError(f"not settings: {', '.join(unknown)}")
        return _build(self, {k: _parse(_SPECS[k], v, k) for k, v in changes.items()})

    def get(self, name: str) -> Any:
        """One setting's value by its flat name."""
        spec = _SPECS[name]
        return getattr(getattr(self, spec.group), spec.attr) if spec.group else getattr(self, spec.attr)

    @property
    def home_path(self) -> Path:
        return Path(self.home)

    def as_env(self) -> dict[str, str]:
        """The settings as LEVERS9_* variables, for a child process: every value but an unset one
        (None, or "" / 0 where that is the default too)."""
        env = {}
        for name, spec in _SPECS.items():
            value = self.get(name)
            unset = value is None or (value in ("", 0) and value == spec.default and name != "http_port")
            if not unset:
                env[f"LEVERS9_{name.upper()}"] = format_setting(value)
        return env


def unknown_variables(env: dict[str, str]) -> tuple[str, ...]:
    """The LEVERS9_* names in env that are neither settings nor declared in NOT_SETTINGS."""
    known = {f"LEVERS9_{n.upper()}" for n in _SPECS} | NOT_SETTINGS
    return tuple(sorted(k for k in env if k.startswith("LEVERS9_") and k not in known
                        and not k.startswith(NOT_SETTINGS_PREFIXES)))


def unknown_warning(s: Settings) -> str:
    """One line naming the ignored variables ("" when none)."""
    if not s.unknown_env:
        return ""
    return f"ignoring unknown variables {', '.join(s.unknown_env)} (not levers9 settings; see README \"Settings\")"


_TRUE, _FALSE = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


def _parse(spec: Spec, raw: object, where: str) -> Any:
    kind = spec.type
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(raw)
        except ValueError:
            allowed = " | ".join(m.value for m in kind)  # type: ignore[attr-defined]
            raise SettingError(f"{where} = {raw!r}: use one of {allowed}") from None
    if kind is bool:
        if isinstance(raw, bool) or raw is None:
            return raw
        if str(raw).strip().lower() in _TRUE + _FALSE:
            return str(raw).strip().lower() in _TRUE
        raise SettingError(f"{where} = {raw!r}: use one of on | off")
    if kind is int:
        if isinstance(raw, bool):
            raise SettingError(f"{where} = {raw!r}: use a whole number")
        try:
            return int(raw)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise SettingError(f"{where} = {raw!r}: use a whole number") from None
    return str(raw)


def format_setting(value: Any) -> str:
    """A value as its variable holds it (on/off for booleans)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _build(base: Settings, values: dict[str, Any]) -> Settings:
    """base with these flat values set, group by group."""
    groups: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for name, value in values.items():
        spec = _SPECS[name]
        (groups.setdefault(spec.group, {}) if spec.group else top)[spec.attr] = value
    for group, changes in groups.items():
        top[group] = replace(getattr(base, group), **changes)
    return replace(base, **top)


def _specs() -> dict[str, Spec]:
    specs: dict[str, Spec] = {}
    for group in fields(Settings):
        if "name" in group.metadata:  # home
            specs[group.metadata["name"]] = Spec(group.metadata["name"], "", group.name, str, group.default)
            continue
        kind = typing.get_type_hints(Settings).get(group.name)
        if not (isinstance(kind, type) and hasattr(kind, "__dataclass_fields__")):
            continue
        hints = typing.get_type_hints(kind)
        for f in fields(kind):
            hint = hints[f.name]
            base = bool if hint == bool | None else hint
            specs[f.metadata["name"]] = Spec(f.metadata["name"], group.name, f.name, base, f.default)
    return specs


_SPECS = _specs()


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
