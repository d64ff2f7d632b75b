"""The runc container's OCI bundle, its init script, exit reasons and cgroup parsing (pure)."""

from __future__ import annotations

import shlex
import uuid
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from levers9.worker.runtime.interface import ContainerSpec, Exit, exit_of
from levers9.worker.runtime.runc.bundle import EXIT_FILE, LOG_FILE, bundle_spec, init_script, upper_files
from levers9.worker.runtime.runc.cgroups import memory_cgroup_dir, oom_kills

MiB = 1024 * 1024


def spec_of(code_dir: Path, sdk_dir: Path, command: tuple[str, ...], **kw) -> ContainerSpec:
    values = dict(container_id=f"t-{uuid.uuid4().hex[:12]}", code_dir=code_dir, sdk_dir=sdk_dir,
                  env={"HELLO": "world"}, cpu_millicores=500, memory_mib=64, command=command)
    values.update(kw)
    return ContainerSpec(**values)


def test_bundle_has_no_sys_and_points_stdio_inside(tmp_path):
    spec = spec_of(tmp_path, tmp_path, ("python3", "-m", "levers9.runner"))
    config = bundle_spec(spec, tmp_path / "rootfs", Path("/run/netns/l9-x"))
    assert not [m for m in config["mounts"] if m["destination"].startswith("/sys")]
    assert not [m for m in config["mounts"] if m["type"] in ("sysfs", "cgroup")]
    args = config["process"]["args"]
    assert args[:2] == ["/bin/sh", "-c"]
    assert args[2].startswith(f"exec </dev/null >>{LOG_FILE} 2>&1\n")
    assert "python3 -m levers9.runner &" in args[2]
    assert f">{EXIT_FILE}" in args[2]
    assert config["process"]["terminal"] is False
    assert config["process"]["cwd"] == "/app"
    assert config["root"] == {"path": str(tmp_path / "rootfs"), "readonly": False}


def test_bundle_limits_namespaces_and_privileges(tmp_path):
    spec = spec_of(tmp_path, tmp_path, ("true",), cpu_millicores=1500, memory_mib=64)
    config = bundle_spec(spec, tmp_path, Path("/run/netns/l9-x"))
    linux = config["linux"]
    assert linux["resources"]["memory"] == {"limit": 64 * MiB, "swap": 64 * MiB}
    assert linux["resources"]["cpu"] == {"quota": 150_000, "period": 100_000}
    assert linux["cgroupsPath"] == f"/levers9/{spec.container_id}"
    assert {"type": "network", "path": "/run/netns/l9-x"} in linux["namespaces"]
    assert {n["type"] for n in linux["namespaces"]} == {"pid", "ipc", "uts", "mount", "network"}
    assert config["process"]["noNewPrivileges"] is True
    assert config["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
    assert "CAP_SYS_ADMIN" not in config["process"]["capabilities"]["bounding"]
    tiny = bundle_spec(spec_of(tmp_path, tmp_path, ("true",), cpu_millicores=1), tmp_path, Path("/n"))
    assert tiny["linux"]["resources"]["cpu"]["quota"] == 1000  # the kernel's minimum


def test_bundle_mounts_app_and_sdk_read_only_and_sets_env(tmp_path):
    code, sdk = tmp_path / "code", tmp_path / "sdk"
    spec = spec_of(code, sdk, ("true",), env={"HELLO": "world", "PYTHONPATH": "/app/lib"})
    config = bundle_spec(spec, tmp_path, Path("/n"))
    mounts = {m["destination"]: m for m in config["mounts"]}
    for dest, src in (("/app", code), ("/opt/levers9", sdk)):
        assert mounts[dest]["type"] == "bind" and mounts[dest]["source"] == str(src.resolve())
        assert "ro" in mounts[dest]["options"]
    assert {"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue"} <= set(mounts)
    env = dict(e.split("=", 1) for e in config["process"]["env"])
    assert env["HELLO"] == "world" and env["HOME"] == "/root" and "/usr/bin" in env["PATH"]
    assert env["PYTHONPATH"] == "/opt/levers9:/app/lib"
    assert env["LEVERS9_RUNNER_PORT"] == "8000" and env["LEVERS9_RUNNER_HOST"] == "0.0.0.0"


@given(memory=st.integers(16, 1 << 22), cpu=st.integers(1, 256_000))
def test_bundle_limits_follow_the_spec(memory, cpu):
    spec = ContainerSpec(container_id="c", code_dir=Path("/c"), sdk_dir=Path("/s"), env={}, cpu_millicores=cpu,
                         memory_mib=memory)
    resources = bundle_spec(spec, Path("/r"), Path("/n"))["linux"]["resources"]
    assert resources["memory"]["limit"] == resources["memory"]["swap"] == memory * MiB
    assert resources["cpu"]["quota"] == max(1000, cpu * 100)  # a period of 100 ms
    assert resources["devices"] == [{"allow": False, "access": "rwm"}]


def test_upper_files_name_the_address_and_no_dns():
    spec = spec_of(Path("/c"), Path("/s"), ("true",), container_id="x" * 100)
    files = upper_files(spec, "10.0.0.7")
    assert files["/etc/hosts"].endswith(f"10.0.0.7\t{'x' * 63}\n")
    assert "nameserver" not in files["/etc/resolv.conf"]
    assert files[LOG_FILE] == ""


def test_init_script_quotes_the_command():
    script = init_script(("python3", "-c", "print('a b'); import sys; sys.exit(3)"))
    app_line = [line for line in script.splitlines() if line.endswith(" &")][0]
    assert shlex.split(app_line[:-2]) == ["python3", "-c", "print('a b'); import sys; sys.exit(3)"]


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\0\n"), min_size=1), min_size=1, max_size=5))
def test_init_script_runs_exactly_the_command(command):
    # the shell splits lines at \n only (not at \r, which splitlines would)
    app_line = [line for line in init_script(command).split("\n") if line.endswith(" &")][0]
    assert shlex.split(app_line[:-2]) == command


def test_exit_reasons():
    assert exit_of(3) == Exit(3, "exited with status 3")
    assert exit_of(0) == Exit(0, "exited with status 0")
    assert exit_of(137, oom=True, memory_mib=64) == Exit(137, "killed: out of memory (limit 64 MiB)", True)
    assert exit_of(143, stop_requested=True) == Exit(143, "stopped")
    assert exit_of(137).reason == "killed by signal 9 (SIGKILL)"
    assert exit_of(None).code is None


def test_memory_cgroup_dir_v1_and_v2():
    v1 = ("30 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory\n"
          "35 25 0:32 / /sys/fs/cgroup/unified rw,relatime shared:17 - cgroup2 cgroup2 rw\n")
    assert memory_cgroup_dir("/levers9/a", v1) == Path("/sys/fs/cgroup/memory/levers9/a")
    v2 = "35 25 0:32 / /sys/fs/cgroup rw,relatime shared:17 - cgroup2 cgroup2 rw\n"
    assert memory_cgroup_dir("/levers9/a", v2) == Path("/sys/fs/cgroup/levers9/a")


def test_oom_kills_reads_v1_and_v2(tmp_path):
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_kills(tmp_path) == 2
    (tmp_path / "memory.oom_control").unlink()
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert oom_kills(tmp_path) == 1
    assert oom_kills(tmp_path / "missing") == 0


def test_a_log_the_container_made_a_symlink_is_not_a_plain_file(tmp_path):
    from levers9.worker.runtime.runc.bundle import LOG_FILE, plain_file

    upper = tmp_path / "upper"
    log = upper / LOG_FILE.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text("ok")
    assert plain_file(upper, LOG_FILE)
    secret = tmp_path / "host-secret"
    secret.write_text("secret")
    log.unlink()
    log.symlink_to(secret)  # what a container's root can do to its own log
    assert not plain_file(upper, LOG_FILE)
    log.unlink()
    log.parent.rmdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "container.log").write_text("not the container's")
    log.parent.symlink_to(tmp_path / "elsewhere")  # or its directory
    assert not plain_file(upper, LOG_FILE) and not plain_file(upper, "/var/log/levers9/missing")


def test_open_plain_reads_the_log_and_never_a_link_the_container_planted(tmp_path):
    """open_plain walks the container's directories itself: a link as the log, as one of its
    directories, or a fifo is refused, whatever was there when plain_file looked."""
    import os

    import pytest

    from levers9.worker.runtime.runc.bundle import LOG_FILE, open_plain

    upper = tmp_path / "upper"
    log = upper / LOG_FILE.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text("ok")
    with open_plain(upper, LOG_FILE) as f:
        assert f.read() == b"ok"
    secret = tmp_path / "host-secret"
    secret.write_text("secret")
    log.unlink()
    log.symlink_to(secret)
    with pytest.raises(OSError):
        open_plain(upper, LOG_FILE)
    log.unlink()
    os.mkfifo(log)  # opened without blocking, then refused
    with pytest.raises(OSError):
        open_plain(upper, LOG_FILE)
    log.unlink()
    log.parent.rmdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "container.log").write_text("not the container's")
    log.parent.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        open_plain(upper, LOG_FILE)
