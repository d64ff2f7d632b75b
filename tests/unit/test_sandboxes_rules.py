"""A sandbox's pure rules: path confinement (hostile paths first), the size limit, exit codes, the
create request and its deployment, the lifetime rule."""

from __future__ import annotations

import errno
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.sandboxes import decode_request, expired, sandbox_spec, session_of, status_of
from levers9.contracts.spec import InvalidSpec
from levers9.executor.sandbox_rules import (
    MAX_FILE_BYTES,
    Refused,
    check_argv,
    check_size,
    confine,
    exit_code,
    inside,
    resolved_inside,
    spawn_failure,
)

ROOT = "/sandbox"


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../../etc", "/sandbox/../etc/shadow",
                                  "/sandboxx/a", "..", "/", "//etc", "a/b/../../../x", "/sandbox/a/../../root"])
def test_a_path_that_leaves_the_root_is_refused_with_403_and_a_sentence(path):
    with pytest.raises(Refused) as exc:
        confine(ROOT, path)
    assert exc.value.status == 403 and "leaves the sandbox's root /sandbox" in str(exc.value)


@pytest.mark.parametrize("path", ["", "a\x00b", "x" * 5000])
def test_a_malformed_path_is_refused_with_400(path):
    with pytest.raises(Refused) as exc:
        confine(ROOT, path)
    assert exc.value.status == 400


@pytest.mark.parametrize(("path", "where"), [("a.txt", "/sandbox/a.txt"), ("/sandbox/d/x", "/sandbox/d/x"),
                                             ("d/../e", "/sandbox/e"), (".", "/sandbox"), ("/sandbox/", "/sandbox"),
                                             ("./a//b/", "/sandbox/a/b")])
def test_a_path_inside_the_root_is_normalized(path, where):
    assert confine(ROOT, path) == where


segments = st.sampled_from(["..", ".", "a", "b", "sandbox", "etc", "", "sandboxx", "..."])


@given(parts=st.lists(segments, max_size=8), absolute=st.booleans(), root=st.sampled_from(["/sandbox", "/a/b", "/"]))
def test_whatever_the_path_the_answer_is_inside_the_root_or_a_refusal(parts, absolute, root):
    path = ("/" if absolute else "") + "/".join(parts)
    try:
        got = confine(root, path)
    except Refused as exc:
        assert exc.status in (400, 403)
        return
    assert got == posixpath.normpath(got) and inside(root, got)
    assert got.startswith("/") and not got.startswith("//")


@given(path=st.text(max_size=60))
def test_any_text_is_confined_or_refused_never_an_exception_of_another_kind(path):
    try:
        assert inside(ROOT, confine(ROOT, path))
    except Refused:
        pass


def test_a_symbolic_link_that_leads_out_is_refused():
    resolved_inside("/sandbox", "/sandbox/real", "link")  # inside: no refusal
    with pytest.raises(Refused) as exc:
        resolved_inside("/sandbox", "/etc/passwd", "link")
    assert exc.value.status == 403 and "symbolic link" in str(exc.value)


def test_a_file_over_the_limit_is_413():
    check_size(MAX_FILE_BYTES)
    with pytest.raises(Refused) as exc:
        check_size(MAX_FILE_BYTES + 1)
    assert exc.value.status == 413 and "file limit" in str(exc.value)


def test_exit_codes_are_the_shells():
    assert exit_code(0) == 0 and exit_code(3) == 3 and exit_code(-9) == 137
    assert spawn_failure("nope", FileNotFoundError(errno.ENOENT, "No such file")) == (127, "nope: command not found\n")
    assert spawn_failure("/etc", PermissionError(errno.EACCES, "Permission denied"))[0] == 126


@pytest.mark.parametrize("argv", [[], "echo hi", [""], ["a\x00"], [1], None])
def test_bad_argv_is_400(argv):
    with pytest.raises(Refused) as exc:
        check_argv(argv)
    assert exc.value.status == 400


def test_the_create_request_is_checked_naming_the_field():
    assert decode_request(b"").workdir == "/sandbox"
    for body, field in ((b'{"cpu_millicores": 0}', "cpu_millicores"), (b'{"workdir": "rel"}', "workdir"),
                        (b'{"workdir": "/a/../b"}', "workdir"), (b'{"bogus": 1}', "bogus"),
                        (b'{"env": {"1x": "y"}}', "env")):
        with pytest.raises(InvalidSpec) as exc:
            decode_request(body)
        assert field in str(exc.value)
    with pytest.raises(InvalidSpec):
        decode_request(b"[")


def test_sandboxes_with_the_same_options_share_their_deployment():
    a, b = sandbox_spec(decode_request(b'{"memory_mib": 256}')), sandbox_spec(decode_request(b'{"memory_mib": 256}'))
    c = sandbox_spec(decode_request(b'{"memory_mib": 512}'))
    assert a.name == b.name != c.name and a.name.startswith("sb-")
    assert a.code.kind == "function" and not a.code.module and a.sandbox is not None
    assert a.function is not None and not a.function.shared_checkpoints
    assert a.scaling.keep_warm_seconds == 600  # the idle timeout: the worker's keep-warm


def test_status_and_lifetime():
    assert [status_of(s) for s in ("requested", "ready", "stopping", "stopped", "failed")] == \
        ["starting", "running", "terminated", "terminated", "failed"]
    assert expired(100.0, 0.0, 101) is None
    assert "lifetime of 100 s" in (expired(100.0, 0.0, 100) or "")
    assert session_of("x") == "sandbox-x"
