"""The builder's pure parts: the host's pip config as mounts, a step as argv, log batching, mount points."""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath

from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.images import build_steps
from levers9.contracts.spec import ImageSpec
from levers9.worker.builds.buildah import Mount, pip_config_paths, pip_env, pip_mounts, registry_of, tls_flags
from levers9.worker.builds.builder import APT_SCRIPT, Batcher, missing_chain, step_argv

HOME = Path("/root")


def mounts_for(files: dict[str, str], env: dict[str, str], dirs: set[str] = frozenset()) -> list[Mount]:
    """pip_mounts over a pretend host: `files` (path -> text) and `dirs` exist, nothing else."""
    configs = pip_config_paths(HOME, env)
    texts = [files[str(h)] for h, _ in configs if str(h) in files]
    texts += [text for path, text in files.items() if path.startswith("/etc/xdg/pip/") and path.endswith(".conf")]
    existing = set(files) | set(dirs)
    return pip_mounts(configs, texts, env, lambda p: p in existing)


# ---- pip configuration -> mounts -------------------------------------------------------------------

def test_this_machines_layout_gives_its_config_files_wheels_indexes_and_cert():
    files = {"/etc/pip.conf": "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n",
             "/etc/xdg/pip/pip.conf": "[global]\nconstraint = /etc/xdg/pip/constraints.txt\n",
             "/etc/xdg/pip/constraints.txt": "torch<=2\n",
             "/root/.config/pip/pip.conf": "[global]\nfind-links = /opt/wheels\nextra-index-url = "
                                           "file:///opt/pypi/simple file:///opt/pypi-more/simple\n",
             "/etc/ssl/certs/ca-certificates.crt": "x"}
    got = mounts_for(files, {"PIP_FIND_LINKS": "/opt/wheels", "PIP_DEFAULT_TIMEOUT": "180"},
                     dirs={"/etc/xdg/pip", "/opt/wheels", "/opt/pypi", "/opt/pypi-more"})
    assert {(m.source, m.target) for m in got} == {
        ("/etc/pip.conf", "/etc/pip.conf"), ("/etc/xdg/pip", "/etc/xdg/pip"),
        ("/root/.config/pip/pip.conf", "/root/.config/pip/pip.conf"), ("/opt/wheels", "/opt/wheels"),
        ("/opt/pypi", "/opt/pypi"), ("/opt/pypi-more", "/opt/pypi-more"),
        ("/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt")}
    # the constraints file is already visible through /etc/xdg/pip: not mounted twice


def test_user_config_lands_in_roots_home_and_remote_indexes_mount_nothing():
    files = {"/home/u/.pip/pip.conf": "[install]\nindex_url = https://mirror.example/simple\n"
                                      "find_links = relative/dir https://x/y /srv/wheels\n"}
    configs = pip_config_paths(Path("/home/u"), {})
    got = pip_mounts(configs, list(files.values()), {}, lambda p: p in files or p == "/srv/wheels")
    assert set(got) == {Mount("/srv/wheels", "/srv/wheels"), Mount("/home/u/.pip/pip.conf", "/root/.pip/pip.conf")}


def test_a_named_path_that_does_not_exist_is_not_mounted_and_pip_config_file_keeps_its_path():
    env = {"PIP_CONFIG_FILE": "/cfg/pip.ini", "PIP_EXTRA_INDEX_URL": "file:///gone/simple file:///idx"}
    got = mounts_for({"/cfg/pip.ini": "[global]\nfind-links = /nope\n"}, env, dirs={"/idx"})
    assert {(m.source, m.target) for m in got} == {("/cfg/pip.ini", "/cfg/pip.ini"), ("/idx", "/idx")}


def test_a_broken_config_file_is_skipped_not_fatal():
    assert mounts_for({"/etc/pip.conf": "this is [not ini"}, {}) == [Mount("/etc/pip.conf", "/etc/pip.conf")]


paths = st.lists(st.sampled_from(["/opt", "/opt/a", "/opt/a/b", "/srv/w", "/srv/w/x.whl", "/etc/c.crt"]),
                 max_size=6)


@given(paths)
def test_mounts_are_unique_and_none_hides_inside_another(named):
    env = {"PIP_FIND_LINKS": " ".join(named)}
    got = mounts_for({}, env, dirs=set(named))
    targets = [m.target for m in got]
    assert len(targets) == len(set(targets))
    for m in got:
        assert not any(PurePosixPath(m.target).is_relative_to(o.target) for o in got if o is not m)
    for p in named:  # every named path is visible through some mount
        assert any(PurePosixPath(p).is_relative_to(m.target) for m in got)


def test_pip_env_passes_only_pip_variables():
    assert pip_env({"PIP_CERT": "/c", "HOME": "/root", "PIP_A": "1", "PIPX": "no"}) == ["PIP_A=1", "PIP_CERT=/c"]


# ---- steps -> argv ---------------------------------------------------------------------------------

def test_each_kind_of_step_runs_as_an_argument_list():
    spec = ImageSpec(apt_packages=["curl", "libpq-dev"], python_packages=["humanize==4.9.0", "six"],
                     commands=["echo 'a b' > /x && ls"])
    base, apt, pip, run = build_steps(spec)
    assert step_argv(apt) == ["sh", "-c", APT_SCRIPT, "sh", "curl", "libpq-dev"]
    assert step_argv(pip) == ["python3", "-m", "pip", "install", "--no-cache-dir", "--root-user-action=ignore",
                              "humanize==4.9.0", "six"]
    assert step_argv(run) == ["sh", "-c", "echo 'a b' > /x && ls"]
    try:
        step_argv(base)
    except ValueError as exc:
        assert "pulled" in str(exc)
    else:
        raise AssertionError("the base step has no command")


def test_the_apt_script_takes_packages_as_arguments_not_shell_text(tmp_path):
    """Run the script with apt-get replaced by a recorder: each package arrives as one argument."""
    fake = tmp_path / "apt-get"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done >> "$OUT"\n')
    fake.chmod(0o755)
    out = tmp_path / "calls"
    weird = "pkg;touch$IFS/tmp/pwned"
    script = APT_SCRIPT.replace(" && rm -rf /var/lib/apt/lists/*", "")
    subprocess.run(["sh", "-c", script, "sh", "curl", weird], check=True,
                   env={"PATH": f"{tmp_path}:/usr/bin:/bin", "OUT": str(out)})
    calls = out.read_text().splitlines()
    assert calls[0] == "[update]"
    assert calls[-2:] == ["[curl]", f"[{weird}]"]
    assert "[--no-install-recommends]" in calls


# ---- log batching ------------------------------------------------------------------------------------

@given(st.lists(st.floats(0, 0.2), max_size=300), st.integers(1, 60), st.floats(0.05, 1.0))
def test_batches_keep_every_line_in_order_within_the_limits(gaps, max_lines, max_wait):
    b = Batcher(max_lines=max_lines, max_wait=max_wait)
    now, sent, batches = 0.0, [], []
    for i, gap in enumerate(gaps):
        now += gap
        for batch in (b.due(now), b.add(f"l{i}", now)):
            if batch:
                batches.append(batch)
                sent += batch
        # what waits is fewer than a batch, and younger than the wait (the ticker calls due())
        assert len(b.lines) < max_lines and (not b.lines or now - b.first_at < max_wait)
    sent += b.take()
    assert sent == [f"l{i}" for i in range(len(gaps))]
    assert all(0 < len(batch) <= max_lines for batch in batches)


def test_a_quiet_line_goes_out_after_the_wait():
    b = Batcher(max_lines=50, max_wait=0.5)
    assert b.add("one", 10.0) == []
    assert b.due(10.4) == []
    assert b.due(10.5) == ["one"]
    assert b.due(20.0) == []


# ---- mount points a run creates ------------------------------------------------------------------------

def test_missing_chain_is_the_missing_ancestors_outermost_first():
    have = {"/", "/root", "/etc"}
    assert missing_chain("/root/.config/pip/pip.conf", lambda p: p in have) == [
        "/root/.config", "/root/.config/pip", "/root/.config/pip/pip.conf"]
    assert missing_chain("/etc", lambda p: p in have) == []
    assert missing_chain("/opt/wheels", lambda p: p in have) == ["/opt", "/opt/wheels"]


# ---- registries ----------------------------------------------------------------------------------------

def test_only_loopback_registries_skip_tls():
    assert registry_of("levers9/cache:abc") == ""
    assert registry_of("127.0.0.1:5000/levers9/base:x") == "127.0.0.1:5000"
    assert tls_flags("127.0.0.1:5000/levers9/base:x") == ["--tls-verify=false"]
    assert tls_flags("localhost:5000/a:b") == ["--tls-verify=false"]
    assert tls_flags("[::1]:5000/a:b") == ["--tls-verify=false"]
    assert tls_flags("docker.io/library/python:3.11") == []
    assert tls_flags("127.0.0.1.example.com/a:b") == []
    assert tls_flags("python:3.11") == []
