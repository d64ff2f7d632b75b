"""The worker's side of boxes: a box is refused by a runtime that would run its command on the host;
its command and port become the container's process and port, its environment holds none of the
runner's settings; it is ready when its port answers (a TCP connect, or ready_path answering 2xx);
a command that exits, or a port that never answers, fails it with the exit code or the reason."""

from __future__ import annotations

import asyncio
import shlex

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_worker_placements import FakeRuntime, delivery, gateway, published, scheduled, settle, worker  # noqa: F401

from levers9.contracts import events as E
from levers9.contracts.spec import BoxOptions, Code, DeploymentSpec, ImageSpec
from levers9.worker.lifecycle import boxes
from levers9.worker.lifecycle.box_probe import probe
from levers9.worker.runtime.interface import Capabilities, ContainerSpec, Exit, Started, exit_of
from levers9.worker.runtime.runc.bundle import bundle_spec, init_script

WEB = BoxOptions(command=["python3", "-m", "http.server", "8000"], port=8000)
BOX = DeploymentSpec(name="web", code=Code(kind="box", module="", handler="", sha256="ab" * 32, key="code/x"),
                     box=WEB, env={"MODE": "x", "PORT": "9"}, image=ImageSpec(env={"FROM_IMAGE": "1"}),
                     timeout_seconds=30)
ISOLATED = Capabilities(isolation=True, memory_limit=True)


# ---- bad input and hostile cases ------------------------------------------------------------------

def test_a_runtime_without_isolation_refuses_a_box_and_only_a_box():
    why = boxes.refusal(BOX, Capabilities(), "process")
    assert "isolated container" in why and "process runtime" in why
    assert boxes.refusal(BOX, ISOLATED, "runc") == ""
    endpoint = DeploymentSpec(name="e", code=Code(module="app", handler="h"))
    assert boxes.refusal(endpoint, Capabilities(), "process") == "" and boxes.box_of(endpoint) is None


async def test_a_box_placed_on_a_worker_without_isolation_fails_and_starts_nothing(worker, gateway):  # noqa: F811
    worker.runtime.capabilities = Capabilities()
    await worker.on_container_event(delivery(scheduled(spec=BOX), seq=3))
    await settle(worker)
    [failed] = published(worker, E.ContainerFailed)
    assert "isolated container" in failed.reason and worker.runtime.started == []


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))),
                min_size=1, max_size=6))
def test_the_command_reaches_the_init_script_as_argv_never_as_shell_text(argv):
    script = init_script(tuple(argv))
    app_line = script.split(" HUP\n", 1)[1].split(" &\nchild=$!", 1)[0]  # between the traps and the pid
    assert shlex.split(app_line) == argv  # each argument quoted: no word of it is the shell's


def test_a_command_that_exits_names_its_program_its_status_and_the_port_it_never_answered_on():
    e = boxes.ended(WEB, exit_of(3), was_ready=False)
    assert e.code == 3 and e.reason == "the box's command (python3) exited with status 3 before port 8000 answered"
    later = boxes.ended(WEB, exit_of(137), was_ready=True)
    assert "killed by signal 9" in later.reason and "after it answered on port 8000" in later.reason
    oom = exit_of(137, oom=True, memory_mib=64)
    assert boxes.ended(WEB, oom, was_ready=True) == oom
    assert boxes.ended(WEB, exit_of(0, stop_requested=True), was_ready=True).reason == "stopped"


def test_a_port_that_never_answers_says_what_was_tried_and_for_how_long():
    assert boxes.not_ready(WEB, 30, boxes.Probe(False, error="ConnectionRefusedError")) == (
        "the box's command (python3) runs but port 8000 did not accept a connection within 30 s "
        "(last try: ConnectionRefusedError)")
    health = BoxOptions(command=["srv"], port=80, ready_path="/health")
    why = boxes.not_ready(health, 45, boxes.Probe(True, status=503))
    assert "GET /health on port 80 did not answer 2xx within 45 s (last answer: 503)" in why


@given(st.integers(min_value=100, max_value=599))
def test_ready_path_counts_only_2xx_and_a_bare_port_counts_a_connection(status):
    health = BoxOptions(command=["srv"], port=80, ready_path="/health")
    assert boxes.ready(health, boxes.Probe(True, status=status)) == (200 <= status < 300)
    assert not boxes.ready(health, boxes.Probe(True))  # connected, no answer yet
    assert boxes.ready(WEB, boxes.Probe(True)) and not boxes.ready(WEB, boxes.Probe(False, error="refused"))


@pytest.mark.parametrize("address", ["", "http://", "http://10.0.0.2", "not a url"])
def test_an_address_without_host_and_port_is_no_target(address):
    with pytest.raises(ValueError):
        boxes.target(address)


# ---- what a box's container is ----------------------------------------------------------------------

def test_the_container_runs_the_command_on_the_port_with_the_boxs_environment(tmp_path):
    env = boxes.box_env(BOX, {"API_KEY": "s"}, container_id="c1", deployment_id="web-v1")
    assert env == {"PORT": "9", "FROM_IMAGE": "1", "MODE": "x", "API_KEY": "s", "LEVERS9_CONTAINER_ID": "c1",
                   "LEVERS9_DEPLOYMENT_ID": "web-v1"}  # spec env over PORT; no runner settings
    spec = ContainerSpec(container_id="c1", code_dir=tmp_path, sdk_dir=tmp_path, env=env, cpu_millicores=500,
                         memory_mib=256, **boxes.container_fields(WEB))
    assert (spec.command, spec.port) == (tuple(WEB.command), 8000)
    config = bundle_spec(spec, tmp_path / "rootfs", tmp_path / "netns")
    assert "python3 -m http.server 8000 &" in config["process"]["args"][2]
    assert config["linux"]["seccomp"] and config["process"]["noNewPrivileges"]  # confined as every container


class AnsweringRuntime(FakeRuntime):
    """Its container runs on, at `address` (a port a test opened)."""

    def __init__(self, tmp, address: str) -> None:
        super().__init__(tmp)
        self.address = address
        self.capabilities = ISOLATED

    async def start(self, spec: ContainerSpec) -> Started:
        self.started.append(spec)
        return Started(address=self.address, pid=1, log_path=self.tmp / "log")

    async def poll(self, container_id: str) -> Exit | None:
        return None


async def test_a_box_whose_port_answers_is_ready_at_its_address(worker, gateway, tmp_path):  # noqa: F811
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    worker.runtime = AnsweringRuntime(tmp_path, f"http://127.0.0.1:{port}")
    async with server:
        await worker.on_container_event(delivery(scheduled(spec=BOX), seq=4))
        await settle(worker)
    [spec] = worker.runtime.started
    assert spec.command == tuple(WEB.command) and spec.port == 8000 and "LEVERS9_RUNNER_MODULE" not in spec.env
    [ready] = published(worker, E.ContainerReady)
    assert ready.address == f"http://127.0.0.1:{port}" and not published(worker, E.ContainerFailed)


async def test_a_box_whose_command_exits_fails_with_its_status_and_log(worker, gateway, tmp_path):  # noqa: F811
    worker.runtime.capabilities = ISOLATED
    (tmp_path / "c1.log").write_text("starting\nTraceback: no such module\n")
    await worker.on_container_event(delivery(scheduled(spec=BOX), seq=5))
    await settle(worker)
    [failed] = published(worker, E.ContainerFailed)
    assert failed.exit_code == 1
    assert failed.reason.startswith("the box's command (python3) exited with status 1 before port 8000 answered")
    assert "Traceback: no such module" in failed.reason  # the log's last lines


# ---- the probe, against real sockets ------------------------------------------------------------------

async def test_the_probe_connects_to_a_listening_port_and_not_to_a_closed_one():
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with httpx.AsyncClient() as client:
        async with server:
            assert (await probe(client, f"http://127.0.0.1:{port}", WEB)).connected
        closed = await probe(client, f"http://127.0.0.1:{port}", WEB)
    assert not closed.connected and closed.error


async def test_the_probe_gets_ready_path_and_reports_its_status():
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = (await reader.readuntil(b"\r\n\r\n")).decode()
        status = "204 No Content" if request.startswith("GET /health?deep=1 ") else "404 Not Found"
        writer.write(f"HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    address = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server, httpx.AsyncClient() as client:
        good = await probe(client, address, BoxOptions(command=["s"], port=1, ready_path="/health?deep=1"))
        bad = await probe(client, address, BoxOptions(command=["s"], port=1, ready_path="/nope"))
    assert good.status == 204 and bad.status == 404
