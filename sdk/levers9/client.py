"""The gateway's REST API as Python calls (`Client`), and packaging an app's code for a deploy.

Every failure is a `ClientError` whose message is one sentence: what failed, what the gateway said,
and what to do about it. Never imported inside a container (it uses httpx).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any, Iterator

import httpx

from levers9.app import SKIP_DIRS

MAX_CODE_BYTES = 16 * 1024 * 1024
CODE_MTIME = 1_700_000_000  # fixed, so the same code makes the same archive (and the same sha256)
DEFAULT_TIMEOUT = 30.0
DEPLOY_TIMEOUT = 120.0

FIXES = {
    401: "run `levers9 up` or set LEVERS9_TOKEN",
    403: "use a token of a workspace allowed to do this (`levers9 token create`)",
    413: "keep large files out of the app's directory: only *.py files are sent, at most 16 MiB compressed",
}


class ClientError(Exception):
    """A call to the gateway failed; the message says why and what to do."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


# ---- code packaging ------------------------------------------------------------------------------

def code_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The files a deploy sends: every *.py under directory, skipping virtual environments,
    __pycache__, hidden files and hidden dirs; sorted, so archives are reproducible."""
    root = Path(directory)
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not (d.startswith(".") or d in SKIP_DIRS
                                                         or (here / d / "pyvenv.cfg").exists()))
        found.extend(here / f for f in sorted(filenames) if f.endswith(".py") and not f.startswith("."))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def package_code(directory: str | os.PathLike[str], limit: int = MAX_CODE_BYTES) -> bytes:
    """A tar.gz of code_files(directory), paths relative to it; at most `limit` bytes."""
    root = Path(directory)
    if not root.is_dir():
        raise ClientError(f"there is no directory {root} to package: pass the app file's directory")
    files = code_files(root)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=CODE_MTIME) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = path.read_bytes()  # follows a symlinked file: the container gets its contents
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, CODE_MTIME
            tar.addfile(info, io.BytesIO(data))
            if buf.tell() > limit:
                break
    size = buf.tell()
    if size > limit:
        largest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:3]
        names = ", ".join(f"{p.relative_to(root)} ({_size(p.stat().st_size)})" for p in largest)
        raise ClientError(f"the code in {root} is over the limit of {_size(limit)} compressed (largest files: "
                          f"{names}): keep large or generated .py files out of the app's directory")
    return buf.getvalue()


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# ---- the client ----------------------------------------------------------------------------------

class Client:
    """One method per gateway call. `Client.from_profile()` uses the profile `levers9 up` wrote."""

    def __init__(self, gateway_url: str, token: str = "", *, timeout: float = DEFAULT_TIMEOUT,
                 transport: httpx.BaseTransport | None = None):
        if not gateway_url:
            raise ClientError("no gateway is known: run `levers9 up`, or set LEVERS9_GATEWAY_URL")
        self.gateway_url = gateway_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.gateway_url, headers=headers, timeout=timeout, transport=transport)

    @classmethod
    def from_profile(cls) -> "Client":
        from levers9.runtime.config import Settings

        s = Settings.load()
        return cls(s.client.gateway_url, s.client.token)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def invocation_url(self, name: str, kind: str = "endpoint") -> str:
        """Where an endpoint is called (a box: /box/NAME/, any path below it)."""
        return f"{self.gateway_url}/box/{name}/" if kind == "box" else f"{self.gateway_url}/endpoint/{name}"

    # -- deployments --

    def deploy(self, spec: dict[str, Any], code: bytes) -> dict[str, Any]:
        """Deploy one endpoint: its spec (JSON of levers9.contracts.spec.DeploymentSpec, as
        `load_app_file` returns it) and the code archive. -> {"deployment_id", "name", "version", "url"}"""
        return self._call("POST", "/api/v1/deployments", f"deploying {spec.get('name')!r}",
                          data={"spec": json.dumps(spec)},
                          files={"code": ("code.tar.gz", code, "application/gzip")}, timeout=DEPLOY_TIMEOUT)

    def list_deployments(self, sandboxes: bool = False) -> list[dict[str, Any]]:
        return self._call("GET", "/api/v1/deployments", "listing deployments",
                          params={"sandboxes": "true"} if sandboxes else None)

    def stop_deployment(self, name: str) -> Any:
        return self._call("POST", f"/api/v1/deployments/{name}/stop", f"stopping deployment {name!r}",
                          see="levers9 deployments list")

    def scale_deployment(self, name: str, *, min: int | None = None, max: int | None = None,
                         buffer: int | None = None, target_concurrency: int | None = None) -> dict[str, Any]:
        """Change a live deployment's scaling (None: unchanged); the autoscaler applies it within a
        second. -> {"name", "deployment_id", "scaling"}"""
        body = {k: v for k, v in {"min": min, "max": max, "buffer": buffer,
                                  "target_concurrency": target_concurrency}.items() if v is not None}
        return self._call("POST", f"/api/v1/deployments/{name}/scale", f"scaling deployment {name!r}", json=body,
                          see="levers9 deployments list")

    def delete_deployment(self, name: str) -> Any:
        return self._call("DELETE", f"/api/v1/deployments/{name}", f"deleting deployment {name!r}",
                          see="levers9 deployments list")

    # -- images --

    def request_image(self, blueprint: dict[str, Any], requested_by: str = "") -> dict[str, Any]:
        """Ask for a blueprint's image (levers9.contracts.spec.ImageSpec JSON, as Image.to_dict()
        gives it). -> {"image_id", "status": built|requested|building|pushed, "cached", ...}: built
        at once when it exists; otherwise follow image_events(image_id, follow=True)."""
        return self._call("POST", "/api/v1/images", "asking for an image",
                          json={"blueprint": blueprint, "requested_by": requested_by})

    def list_images(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/v1/images", "listing images")

    def get_image(self, image_id: str) -> dict[str, Any]:
        """The image's blueprint, steps with their states, reason, failing step and log tail."""
        return self._call("GET", f"/api/v1/images/{image_id}", f"reading image {image_id}",
                          see="levers9 images list")

    def delete_image(self, image_id: str) -> Any:
        return self._call("DELETE", f"/api/v1/images/{image_id}", f"deleting image {image_id}",
                          see="levers9 images list")

    def image_events(self, image_id: str, follow: bool = False) -> Iterator[dict[str, Any]]:
        """The image's events (envelopes as dicts) from its first; with follow, until its build ends."""
        what = f"reading the events of image {image_id}"
        timeout = httpx.Timeout(self.timeout, read=None) if follow else self.timeout
        try:
            with self._http.stream("GET", f"/api/v1/images/{image_id}/events",
                                   params={"follow": "true" if follow else "false"}, timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    raise self._status_error(r, what, "levers9 images list")
                for line in r.iter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, what) from None

    # -- containers --

    def list_containers(self, all: bool = False, page: int = 1000) -> list[dict[str, Any]]:
        """Every container, a page at a time (a page may repeat or miss a container that changed
        while paging: the list is ordered by last change)."""
        rows: list[dict[str, Any]] = []
        while True:
            batch = self._call("GET", "/api/v1/containers", "listing containers",
                               params={"all": "true" if all else "false", "limit": page, "offset": len(rows)})
            rows += batch
            if len(batch) < page:
                return rows

    def list_checkpoints(self, all: bool = False) -> list[dict[str, Any]]:
        return self._call("GET", "/api/v1/checkpoints", "listing checkpoints",
                          params={"all": "true" if all else "false"})

    def delete_checkpoint(self, checkpoint_id: str) -> Any:
        return self._call("DELETE", f"/api/v1/checkpoints/{checkpoint_id}", f"deleting checkpoint {checkpoint_id}",
                          see="levers9 checkpoints list")

    def checkpoint_container(self, container_id: str) -> Any:
        return self._call("POST", f"/api/v1/containers/{container_id}/checkpoint",
                          f"checkpointing container {container_id}", see="levers9 containers list")

    def stop_container(self, container_id: str) -> Any:
        return self._call("POST", f"/api/v1/containers/{container_id}/stop", f"stopping container {container_id}",
                          see="levers9 containers list")

    def container_logs(self, container_id: str, follow: bool = False) -> Iterator[str]:
        """The container's log as text chunks; with follow, until the container ends or the caller stops."""
        what = f"reading the logs of container {container_id}"
        timeout = httpx.Timeout(self.timeout, read=None) if follow else self.timeout
        try:
            with self._http.stream("GET", f"/api/v1/containers/{container_id}/logs",
                                   params={"follow": "true"} if follow else None, timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    raise self._status_error(r, what, "levers9 containers list")
                yield from r.iter_text()
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, what) from None

    # -- workers --

    def list_workers(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/v1/workers", "listing workers")

    def cordon_worker(self, worker_id: str) -> Any:
        return self._call("POST", f"/api/v1/workers/{worker_id}/cordon", f"cordoning worker {worker_id}",
                          see="levers9 workers list")

    def drain_worker(self, worker_id: str) -> Any:
        return self._call("POST", f"/api/v1/workers/{worker_id}/drain", f"draining worker {worker_id}",
                          see="levers9 workers list")

    # -- tokens --

    def create_token(self, name: str) -> dict[str, Any]:
        """-> {"token_id", "token"}; the token is shown this once."""
        return self._call("POST", "/api/v1/tokens", "creating a token", json={"name": name})

    def list_tokens(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/v1/tokens", "listing tokens")

    def revoke_token(self, token_id: str) -> Any:
        return self._call("DELETE", f"/api/v1/tokens/{token_id}", f"revoking token {token_id}",
                          see="levers9 token list")

    # -- secrets --

    def create_secret(self, name: str, value: str) -> Any:
        return self._call("POST", "/api/v1/secrets", f"storing secret {name!r}", json={"name": name, "value": value})

    def list_secrets(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/v1/secrets", "listing secrets")

    def delete_secret(self, name: str) -> Any:
        return self._call("DELETE", f"/api/v1/secrets/{name}", f"deleting secret {name!r}",
                          see="levers9 secret list")

    def secret_keys(self) -> dict[str, Any]:
        return self._call("GET", "/api/v1/secrets/keys", "reading the secrets keyring's use")

    def rewrap_secrets(self) -> dict[str, Any]:
        return self._call("POST", "/api/v1/secrets/rewrap", "rewrapping the stored secrets")

    # -- plumbing --

    # -- catalogues of shared pre-import checkpoints --

    def publish_catalogue(self, document: bytes) -> dict[str, Any]:
        return self._call("POST", "/api/v1/catalogues", "publishing the catalogue", content=document,
                          headers={"Content-Type": "application/json"})

    def catalogue(self, flavor: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/catalogues/{flavor}", f"reading the {flavor} catalogue")

    def _call(self, method: str, path: str, what: str, see: str = "", **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, what) from None
        if r.status_code >= 400:
            raise self._status_error(r, what, see)
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise ClientError(f"{what} failed: the gateway at {self.gateway_url} answered {r.status_code} with "
                              f"something that is not JSON ({r.text[:100]!r}): is LEVERS9_GATEWAY_URL the "
                              "levers9 gateway?", r.status_code) from None

    def _transport_error(self, exc: httpx.HTTPError, what: str) -> ClientError:
        if isinstance(exc, httpx.ConnectError):
            return ClientError(f"{what} failed: cannot reach the gateway at {self.gateway_url} ({exc}): is levers9 "
                               "running? `levers9 status`")
        if isinstance(exc, httpx.TimeoutException):
            return ClientError(f"{what} failed: the gateway at {self.gateway_url} did not answer in time: is "
                               "levers9 running? `levers9 status`")
        return ClientError(f"{what} failed: {type(exc).__name__}: {exc}: is levers9 running? `levers9 status`")

    def _status_error(self, r: httpx.Response, what: str, see: str) -> ClientError:
        detail = _detail(r)
        fix = FIXES.get(r.status_code)
        if fix is None and r.status_code == 404 and see:
            fix = f"check the name or id with `{see}`"
        if fix is None and r.status_code >= 500:
            fix = "see the gateway's log (`levers9 status` shows where levers9 runs)"
        reason = f"{r.status_code} {r.reason_phrase}".strip()
        text = f"{what} failed: the gateway answered {reason}" + (f": {detail}" if detail else "")
        return ClientError(text + (f": {fix}" if fix else ""), r.status_code)


def _detail(r: httpx.Response) -> str:
    """The gateway's {"detail": ...}, FastAPI's validation lists included, as one line."""
    try:
        detail = r.json().get("detail", "")
    except (ValueError, AttributeError):
        return r.text.strip()[:200]
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(x) for x in item.get("loc", []) if x != "body")
                parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return detail if isinstance(detail, str) else json.dumps(detail)
