"""Volumes and cloud buckets (pure): names, mount paths, paths inside a volume (no `..`, no absolute
escape, no symlink escape), the mount plan, the spec and SDK checks, the bundle's binds, s3fs's and
JuiceFS's command lines."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9 import App, CloudBucket, ConfigError, Volume
from levers9.contracts.spec import InvalidSpec, decode_spec
from levers9.contracts.volumes import (
    Bind,
    BucketMount,
    InvalidPath,
    VolumeMount,
    VolumeName,
    bucket_binds,
    inside,
    passwd_line,
    relative_path,
    s3fs_args,
    volume_binds,
    volume_dir,
)
from levers9.gateway import volume_files
from levers9.runtime.config import Settings
from levers9.runtime.juicefs import bucket_url, meta_url
from levers9.worker.runtime.interface import ContainerSpec
from levers9.worker.runtime.runc.bundle import bundle_spec

CODE = {"module": "m", "handler": "h"}


def spec(**extra) -> bytes:
    return json.dumps({"name": "web", "code": CODE, **extra}).encode()


# ---- names and mount paths -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["cache", "a", "model-cache-2", "0abc"])
def test_good_volume_names(name):
    assert msgspec.convert(name, VolumeName) == name


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "Cache", "-x", "a_b", "x" * 64, "a.b", "a b"])
def test_bad_volume_names(name):
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(name, VolumeName)


@pytest.mark.parametrize("path", ["/cache", "/data", "/mnt/models", "/home/user/x"])
def test_good_mount_paths(path):
    assert VolumeMount(name="cache", mount_path=path).mount_path == path


@pytest.mark.parametrize("path", ["cache", "/", "/cache/", "/a/../etc", "/a/./b", "//x", "/proc", "/proc/x",
                                  "/dev/shm", "/app", "/app/x", "/opt/levers9", "/etc", "/usr", "/run/levers9/x",
                                  "/var/log/levers9", "/sys/fs"])
def test_bad_mount_paths(path):
    with pytest.raises((ValueError, msgspec.ValidationError)):
        msgspec.convert({"name": "cache", "mount_path": path}, VolumeMount)


def test_old_specs_decode_without_volumes_and_new_ones_validate():
    assert decode_spec(spec()).volumes == [] and decode_spec(spec()).buckets == []
    got = decode_spec(spec(volumes=[{"name": "cache", "mount_path": "/cache"}],
                           buckets=[{"bucket": "raw-data", "mount_path": "/raw", "secret": "S3", "read_only": True}]))
    assert got.volumes == [VolumeMount(name="cache", mount_path="/cache")]
    assert got.buckets[0].read_only and got.buckets[0].endpoint_url == ""
    with pytest.raises(InvalidSpec, match="overlap"):
        decode_spec(spec(volumes=[{"name": "a", "mount_path": "/x"}, {"name": "b", "mount_path": "/x/y"}]))
    with pytest.raises(InvalidSpec, match="overlap"):
        decode_spec(spec(volumes=[{"name": "a", "mount_path": "/x"}],
                         buckets=[{"bucket": "bkt", "mount_path": "/x", "secret": "S"}]))
    with pytest.raises(InvalidSpec, match="volumes"):
        decode_spec(spec(volumes=[{"name": "../etc", "mount_path": "/x"}]))
    with pytest.raises(InvalidSpec, match="at most"):
        decode_spec(spec(volumes=[{"name": "a", "mount_path": f"/m{i}"} for i in range(17)]))


# ---- paths inside a volume -----------------------------------------------------------------------

@pytest.mark.parametrize("given_path, want", [("a/b.txt", "a/b.txt"), ("/a/b.txt", "a/b.txt"), ("", ""),
                                               ("./a//b/", "a/b"), ("/", "")])
def test_relative_paths(given_path, want):
    assert relative_path(given_path) == want


@pytest.mark.parametrize("bad", ["..", "../x", "a/../../x", "a/..", "/..", "a\\b", "a\x00b"])
def test_paths_that_leave_are_refused(bad):
    with pytest.raises(InvalidPath):
        relative_path(bad)


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "c.txt", "/"]), max_size=8))
def test_a_relative_path_never_leaves_its_volume(parts):
    path = "/".join(parts)
    try:
        rel = relative_path(path)
    except InvalidPath:
        assert ".." in path
        return
    joined = os.path.normpath(os.path.join("/data/ws/vol", rel))
    assert inside("/data/ws/vol", joined) and not rel.startswith("/") and ".." not in rel.split("/")


def test_inside_is_not_fooled_by_a_prefix():
    assert inside("/d/ws/vol", "/d/ws/vol/x") and inside("/d/ws/vol", "/d/ws/vol")
    assert not inside("/d/ws/vol", "/d/ws/vol2/x") and not inside("/d/ws/vol", "/d/ws")


def test_files_refuse_symlink_escapes(tmp_path):
    root, outside = tmp_path / "ws" / "vol", tmp_path / "secret"
    root.mkdir(parents=True)
    outside.mkdir()
    (outside / "key").write_text("top secret")
    (root / "link").symlink_to(outside)  # as a container could plant it
    (root / "filelink").symlink_to(outside / "key")
    for op in (lambda: volume_files.open_for_read(root, "link/key"), lambda: volume_files.open_for_read(root, "filelink"),
               lambda: volume_files.write(root, "link/new", [b"x"]), lambda: volume_files.listing(root, "link"),
               lambda: volume_files.remove(root, "link/key", False)):
        with pytest.raises(InvalidPath, match="out of the volume"):
            op()
    assert (outside / "key").read_text() == "top secret" and not (outside / "new").exists()


def test_files_round_trip(tmp_path):
    root = tmp_path / "vol"
    root.mkdir()
    assert volume_files.write(root, "/dir/a.txt", [b"hel", b"lo"]) == 5
    assert volume_files.open_for_read(root, "dir/a.txt").read_bytes() == b"hello"
    assert [e["path"] for e in volume_files.listing(root, "")] == ["dir"]
    assert [(e["path"], e["size"]) for e in volume_files.listing(root, "dir")] == [("dir/a.txt", 5)]
    with pytest.raises(InvalidPath, match="recursive"):
        volume_files.remove(root, "dir", False)
    volume_files.remove(root, "dir", True)
    with pytest.raises(volume_files.NotFound):
        volume_files.open_for_read(root, "dir/a.txt")
    with pytest.raises(InvalidPath):
        volume_files.write(root, "", [b"x"])


# ---- the mount plan --------------------------------------------------------------------------------

def test_volume_binds_are_the_workspaces_own_directories():
    vols = [VolumeMount(name="cache", mount_path="/cache"), VolumeMount(name="models", mount_path="/m")]
    assert volume_binds("/data/w1", "acme", vols) == [Bind("/data/w1/acme/cache", "/cache"),
                                                      Bind("/data/w1/acme/models", "/m")]
    with pytest.raises(msgspec.ValidationError):
        volume_dir("/data", "..", "cache")
    with pytest.raises(msgspec.ValidationError):
        volume_dir("/data", "acme", "../other")


def test_bucket_binds_and_s3fs_command():
    b = BucketMount(bucket="raw-data", mount_path="/raw", secret="S3", read_only=True)
    assert bucket_binds("/st", "c1", [b]) == [Bind("/st/buckets/c1/0", "/raw", True)]
    args = s3fs_args(b, "/st/buckets/c1/0", "/st/private/p", "http://127.0.0.1:9000")
    assert args[:3] == ["s3fs", "raw-data", "/st/buckets/c1/0"]
    options = args[4].split(",")
    assert {"passwd_file=/st/private/p", "url=http://127.0.0.1:9000", "use_path_request_style", "ro"} <= set(options)
    other = BucketMount(bucket="raw-data", mount_path="/raw", secret="S3", endpoint_url="https://s3.example.com")
    assert "url=https://s3.example.com" in s3fs_args(other, "/t", "/p", "http://127.0.0.1:9000")[4]
    assert "ro" not in s3fs_args(other, "/t", "/p", "http://x")[4].split(",")


@pytest.mark.parametrize("value", ["", "onlyaccess", ":secret", "access:"])
def test_bucket_secrets_must_hold_both_keys(value):
    with pytest.raises(ValueError, match="ACCESS_KEY:SECRET_KEY"):
        passwd_line(value)
    assert passwd_line("AK:SK\n") == "AK:SK\n"


def test_bundle_binds_volumes_and_buckets(tmp_path):
    binds = (Bind("/data/w1/acme/cache", "/cache"), Bind("/st/buckets/c/0", "/raw", True))
    cspec = ContainerSpec(container_id=f"t-{uuid.uuid4().hex[:8]}", code_dir=tmp_path, sdk_dir=tmp_path, env={},
                          cpu_millicores=500, memory_mib=64, binds=binds)
    mounts = {m["destination"]: m for m in bundle_spec(cspec, tmp_path / "r", Path("/run/netns/x"))["mounts"]}
    assert mounts["/cache"]["source"] == "/data/w1/acme/cache" and "rw" in mounts["/cache"]["options"]
    assert mounts["/raw"]["type"] == "bind" and "ro" in mounts["/raw"]["options"]
    assert {"nosuid", "nodev"} <= set(mounts["/cache"]["options"])


def test_juicefs_urls():
    assert meta_url("postgresql://postgres@127.0.0.1:5999/levers9") == \
        "postgres://postgres@127.0.0.1:5999/levers9?sslmode=disable&search_path=juicefs"
    assert "sslmode=require" in meta_url("postgres://u:p@db:5432/x?sslmode=require")
    assert bucket_url("http://127.0.0.1:8333/", Settings().storage.volumes_bucket) == "http://127.0.0.1:8333/levers9-volumes"
    with pytest.raises(RuntimeError, match="postgres"):
        meta_url("sqlite:///x.db")


# ---- the SDK -------------------------------------------------------------------------------------

def test_sdk_volumes_become_the_spec():
    app = App("vols")

    @app.endpoint(volumes=[Volume("cache", "/cache"), CloudBucket("raw-data", "/raw", secret="S3", read_only=True)])
    def handler():
        return {}

    s = app.specs()[0]
    assert s["volumes"] == [{"name": "cache", "mount_path": "/cache"}]
    assert s["buckets"][0]["bucket"] == "raw-data" and s["buckets"][0]["read_only"] is True
    assert decode_spec(json.dumps({**s, "code": CODE})).volumes[0].name == "cache"


@pytest.mark.parametrize("make", [lambda: Volume("../x", "/x"), lambda: Volume("cache", "x"),
                                  lambda: Volume("cache", "/a/../b"), lambda: CloudBucket("B", "/b", secret="S"),
                                  lambda: CloudBucket("bkt", "/b", secret="not a name"),
                                  lambda: App("a").endpoint(volumes=["cache"])(lambda: 1),
                                  lambda: App("a").endpoint(volumes=[Volume("a", "/x"), Volume("b", "/x")])(
                                      lambda: 1)])
def test_sdk_refuses_bad_volumes(make):
    with pytest.raises(ConfigError):
        make()


def test_the_juicefs_daemon_gets_no_settings_of_its_parent(monkeypatch):
    from levers9.runtime import juicefs

    monkeypatch.setenv("LEVERS9_SECRET_KEY", "do-not-leak")
    monkeypatch.setenv("LEVERS9_HOME", "/h")
    monkeypatch.setenv("LEVERS9_SERVICE", "worker")
    env = juicefs._env()
    assert "LEVERS9_SECRET_KEY" not in env and env["LEVERS9_HOME"] == "/h" and env["LEVERS9_SERVICE"] == "worker"
    args = juicefs.mount_args(Settings().with_(database_url="postgresql://p@127.0.0.1:1/l"), Path("/m"), Path("/c"),
                              Path("/l"))
    assert {"--no-usage-report", "--no-agent"} <= set(args) and args[args.index("--backup-meta") + 1] == "0"


async def test_a_bucket_endpoint_on_this_host_or_its_containers_is_refused():
    from levers9.runtime.config import Settings
    from levers9.worker.mounts.volumes import endpoint_refusal

    s = Settings().with_(bridge_subnet="10.209.0.0/24")
    assert await endpoint_refusal("", s) == ""  # the platform's own S3
    for url in ("http://127.0.0.1:5432", "http://localhost:4222", "http://169.254.169.254", "http://10.209.0.1:80",
                "http://[::1]:9000", "http://0.0.0.0:2050"):
        assert "may not be used" in await endpoint_refusal(url, s), url
    assert await endpoint_refusal("https://203.0.113.9", s) == ""
