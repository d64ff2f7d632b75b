"""Hostile-tenant cases: input (collected through test_hostile_tenant.py, which holds the stack `hostile_env`).

- a decompression bomb as a deploy's code archive (about 1 MB of gzip, 1 GiB of zeros): 413 naming
  the limit, while the gateway's health keeps answering;
- deep JSON (10,000 levels), invalid UTF-8 and an oversized body on every JSON route of the gateway,
  enumerated from its own OpenAPI document: 400 / 413 with a sentence, never a 500, never the input
  echoed back, never a dropped connection;
- the same bodies against a deployed endpoint (the runner behind the gateway's proxy): 4xx;
- a bare container asked for on the `build` pool: refused (403, saying why).
"""

from __future__ import annotations

import io
import json
import tarfile
import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _e2e import api, cli, wait_until

APPS = Path(__file__).parent / "apps"
DEEP = b"[" * 10_000 + b"]" * 10_000
NOT_UTF8 = b'{"name": "\xff\xfe\xfd"}'
OVERSIZED = 17 << 20  # over every JSON limit of the gateway (1 MiB for the API, 16 MiB for a call)
BODY_METHODS = ("post", "put", "patch", "delete")
PARAMS = {"name": "hostile-x", "path": "a.txt", "action": "drain", "app": "hostile-x", "flavor": "cpu"}


def _profile(env: dict) -> dict:
    return tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())


def _client(env: dict) -> httpx.Client:
    p = _profile(env)
    return httpx.Client(base_url=p["gateway_url"], headers={"Authorization": f"Bearer {p['token']}"}, timeout=300)


class _Zeros(io.RawIOBase):
    def __init__(self, n: int):
        self.n = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        k = min(len(b), self.n)
        b[:k] = bytes(k)
        self.n -= k
        return k


def _bomb() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        app = tarfile.TarInfo("app.py")
        app.size = 4
        tar.addfile(app, io.BytesIO(b"x=1\n"))
        zeros = tarfile.TarInfo("zeros.bin")
        zeros.size = 1 << 30
        tar.addfile(zeros, io.BufferedReader(_Zeros(1 << 30)))
    return buf.getvalue()


def test_a_decompression_bomb_deploy_is_413_and_health_answers_meanwhile(hostile_env):
    bomb = _bomb()
    assert len(bomb) < 2 << 20
    spec = json.dumps({"name": "hostile-bomb", "code": {"module": "app", "handler": "f"}})
    done, health = threading.Event(), []

    def watch() -> None:  # the gateway's health, asked again and again while the bombs are in
        with _client(hostile_env) as c:
            while not done.is_set():
                health.append(c.get("/healthz", timeout=60).status_code)

    def deploy(_: int) -> httpx.Response:
        with _client(hostile_env) as c:
            return c.post("/api/v1/deployments", data={"spec": spec},
                          files={"code": ("code.tar.gz", bomb, "application/gzip")})

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(deploy, range(4)))
    finally:
        done.set()
        watcher.join()
    for r in answers:
        assert r.status_code == 413, r.text[:500]
        assert "unpacks to more than 256 MiB" in r.json()["detail"], r.text[:500]
    assert health and set(health) == {200}, health
    assert not [d for d in api(hostile_env, "GET", "/api/v1/deployments").json() if d["name"] == "hostile-bomb"]


def _json_operations(env: dict) -> list[tuple[str, str]]:
    """(METHOD, path with its parameters filled) of every gateway route that takes a JSON body: every
    operation with a body method, but multipart ones (a deploy), raw file puts, bodies documented as
    bytes and proxied calls."""
    spec = httpx.get(_profile(env)["gateway_url"] + "/openapi.json", timeout=60).json()
    ops = []
    for path, item in spec["paths"].items():
        if path.startswith(("/endpoint/", "/box/")) or "{path}" in path:
            continue
        for method, op in item.items():
            content = op.get("requestBody", {}).get("content", {})
            raw = content and "application/json" not in content  # documented bytes (a sandbox's stdin, a file)
            if method in BODY_METHODS and not raw and not any(k.startswith("multipart/") for k in content):
                filled = path
                for name in [seg[1:-1] for seg in path.split("/") if seg.startswith("{")]:
                    filled = filled.replace(f"{{{name}}}", PARAMS.get(name, "hostile1"))
                ops.append((method.upper(), filled))
    return ops


def _assert_refused(r: httpx.Response, status: int, what: str) -> None:
    assert r.status_code == status, (what, r.status_code, r.text[:300])
    assert isinstance(r.json()["detail"], str) and len(r.content) < 4096, (what, r.text[:300])  # a sentence, no echo


def test_every_json_route_refuses_deep_invalid_and_oversized_bodies(hostile_env):
    ops = _json_operations(hostile_env)
    assert len(ops) >= 15 and ("POST", "/api/v1/images") in ops and ("POST", "/function/hostile-x/hostile-x") in ops
    oversized = b'{"name": "' + b"x" * OVERSIZED + b'"}'
    with _client(hostile_env) as c:
        for method, path in ops:
            headers = {"content-type": "application/json"}
            _assert_refused(c.request(method, path, content=DEEP, headers=headers), 400, f"deep {method} {path}")
            _assert_refused(c.request(method, path, content=NOT_UTF8, headers=headers), 400, f"utf-8 {method} {path}")
            _assert_refused(c.request(method, path, content=oversized, headers=headers), 413, f"size {method} {path}")


def test_a_deployed_endpoint_refuses_hostile_bodies(hostile_env):
    cli(hostile_env, "deploy", str(APPS / "hostile_echo.py"))
    with _client(hostile_env) as c:
        ok = wait_until(lambda: (r := c.post("/endpoint/hostile-echo", json={"a": 1})).status_code == 200 and r,
                        timeout=600, every=2)
        assert ok.json() == {"fields": 1}
        for what, body in (("deep", DEEP), ("not UTF-8", NOT_UTF8), ("not JSON", b"{nope")):
            r = c.post("/endpoint/hostile-echo", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (what, r.status_code, r.text[:300])
            assert len(r.content) < 4096, what
        big = c.post("/endpoint/hostile-echo", content=b'{"a": "' + b"x" * OVERSIZED + b'"}')
        assert big.status_code == 413, big.text[:300]
        # the runner is still there and answers the next call
        assert c.post("/endpoint/hostile-echo", json={"a": 1, "b": 2}).json() == {"fields": 2}


def test_a_bare_container_on_the_build_pool_is_refused(hostile_env):
    r = api(hostile_env, "POST", "/api/v1/containers", json={"cpu_millicores": 100, "memory_mib": 64, "pool": "build"})
    assert r.status_code == 403, r.text
    assert "pool 'build' is refused" in r.json()["detail"]
    assert not [c for c in api(hostile_env, "GET", "/api/v1/containers", params={"all": "true"}).json()
                if c.get("pool") == "build"]


def _other_workspace(env: dict, workspace: str) -> dict:
    """A profile for another workspace (its own token), as test_e2e_isolation makes one."""
    import asyncio
    import uuid

    from _e2e import bus_auth

    from levers9.cli import publish_token

    nats = next(c["url"] for c in json.loads(cli(env, "status", "--json").stdout)["components"] if c["name"] == "nats")
    token = "l9_" + uuid.uuid4().hex
    asyncio.run(publish_token(nats, token, "hostile", workspace=workspace, auth=bus_auth(env)))
    other = {**env, "LEVERS9_TOKEN": token}
    wait_until(lambda: httpx.get(_profile(env)["gateway_url"] + "/api/v1/whoami", timeout=10,
                                 headers={"Authorization": f"Bearer {token}"}).status_code == 200, timeout=60)
    return {"env": other, "token": token}


def test_a_workspace_cannot_share_its_cluster_into_another(hostile_env):
    mallory = _other_workspace(hostile_env, "mallory")
    url = _profile(hostile_env)["gateway_url"]
    headers = {"Authorization": f"Bearer {mallory['token']}"}
    attached = httpx.post(url + "/api/v1/clusters", json={"name": "trap"}, headers=headers, timeout=60)
    assert attached.status_code == 201, attached.text
    # mallory's cluster would run the victim's work (its code, its secrets): only a platform admin may share it
    shared = httpx.post(url + "/api/v1/clusters/trap/share", json={"workspace": "default"}, headers=headers, timeout=60)
    assert shared.status_code == 403, shared.text
    assert "sharing cluster 'trap' into workspace 'default' was refused" in shared.json()["detail"]
    assert not [c for c in api(hostile_env, "GET", "/api/v1/clusters").json() if c["name"] == "trap"]
