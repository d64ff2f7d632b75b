"""A placed container's code: fetched once per sha256 however many starts of it come at once.

CI (test_sigkill_of_the_worker_holding_a_pending_call_gets_it_served_elsewhere): two containers of
one app (its endpoints share one archive) started together on a worker; both unpacked into the same
`code/SHA.tmpPID`, the first renamed it away under the second, whose container failed with
FileNotFoundError.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path
from types import SimpleNamespace

import httpx

from levers9.runtime.config import Settings
from levers9.worker.lifecycle import code

SHA = "ab" * 32


def archive(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def placed(n: int) -> SimpleNamespace:
    spec = SimpleNamespace(code=SimpleNamespace(sha256=SHA, key="code/x", kind="endpoint"))
    return SimpleNamespace(spec=spec, deployment_id="d1", workspace="w", container_id=f"c{n}", scheduled_seq=7)


def test_starts_of_the_same_code_at_once_fetch_it_once_and_all_get_it_whole(tmp_path, monkeypatch):
    files = {f"pkg/m{i}.py": f"x = {i}\n".encode() * 2000 for i in range(200)}
    body = archive(files)
    asked: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.params["container_id"])
        await asyncio.sleep(0.05)  # the other starts arrive while this one is fetched
        return httpx.Response(200, content=body)

    real = httpx.AsyncClient
    monkeypatch.setattr(code.httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler)))
    settings = Settings.load(env={"LEVERS9_GATEWAY_URL": "http://gw:1", "LEVERS9_WORKER_TOKEN": "t"})

    async def main() -> list[Path]:
        return await asyncio.gather(*(code.fetch_code(settings, tmp_path, placed(n)) for n in range(6)))

    dirs = asyncio.run(main())
    target = tmp_path / "code" / SHA
    assert dirs == [target] * 6 and len(asked) == 1
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*.py")) == sorted(files)
    assert [p.name for p in (tmp_path / "code").iterdir()] == [SHA]  # no temporary dir left behind
    assert asyncio.run(code.fetch_code(settings, tmp_path, placed(9))) == target and len(asked) == 1
