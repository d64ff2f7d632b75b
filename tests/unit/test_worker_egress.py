"""The pure parts of builds' and installs' confinement: the egress allowlist, how the proxy reads and
refuses a request, the firewall's proxy rules, a step's buildah command and the install container."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.spec import ImageRef
from levers9.worker.builds.buildah import Mount, run_argv
from levers9.worker.network import egress
from levers9.worker.network.egress import Endpoint, Refused
from levers9.worker.network.firewall import EGRESS_MARK, FirewallError, Member, ruleset
from levers9.worker.runtime.interface import ContainerSpec
from levers9.worker.runtime.runc.bundle import JobSpec, bundle_spec, egress_proxy_of
from levers9.worker.sandboxes.sandboxes import cache_name, image_key, install_spec

DEFAULT = ["https://index.example/", "https://files.example/"]


def test_the_default_index_is_allowed_unless_an_index_url_replaces_it():
    assert egress.pip_endpoints([], DEFAULT) == {Endpoint("index.example", 443), Endpoint("files.example", 443)}
    got = egress.pip_endpoints([("index-url", "https://mirror.example:8443/simple"),
                                ("extra-index-url", "file:///opt/pypi/simple http://more.example/simple"),
                                ("find-links", "/opt/wheels https://links.example/wheels"), ("cert", "https://no")],
                               DEFAULT)
    assert got == {Endpoint("mirror.example", 8443), Endpoint("more.example", 80), Endpoint("links.example", 443)}


def test_apt_sources_give_their_hosts():
    files = [("debian.sources", "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm\nComponents: main\n"),
             ("x.list", "deb [arch=amd64] https://apt.example:444/repo stable main\n# deb http://off.example/ x y\n")]
    assert egress.apt_endpoints(files) == {Endpoint("deb.example", 80), Endpoint("apt.example", 444)}


def test_egress_allow_adds_hosts():
    assert egress.parse_allow(" a.example:8080, B.example ,") == {
        Endpoint("a.example", 8080), Endpoint("b.example", 443), Endpoint("b.example", 80)}
    with pytest.raises(ValueError):
        egress.parse_allow("a.example:http")


def test_connect_and_absolute_http_are_read_and_hop_headers_dropped():
    r = egress.parse_head(b"CONNECT Index.Example:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (r.method, r.target, r.tunnel) == ("CONNECT", Endpoint("index.example", 443), True)
    r = egress.parse_head(b"GET http://deb.example/debian/dists?x=1 HTTP/1.1\r\nHost: deb.example\r\n"
                          b"Proxy-Authorization: secret\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n")
    assert r.target == Endpoint("deb.example", 80) and not r.tunnel
    assert r.head == (b"GET /debian/dists?x=1 HTTP/1.1\r\nHost: deb.example\r\nAccept: */*\r\n"
                      b"Connection: close\r\n\r\n")


@pytest.mark.parametrize("head,status", [
    (b"GET /simple/ HTTP/1.1\r\n\r\n", 405),  # origin form: not a proxy request
    (b"GET https://index.example/ HTTP/1.1\r\n\r\n", 405),
    (b"CONNECT index.example HTTP/1.1\r\n\r\n", 400),
    (b"CONNECT index.example:99999 HTTP/1.1\r\n\r\n", 400),
    (b"hello\r\n\r\n", 400),
    (b"GET http:///x HTTP/1.1\r\n\r\n", 400),
])
def test_what_is_not_a_proxy_request_is_refused(head, status):
    with pytest.raises(Refused) as refused:
        egress.parse_head(head)
    assert refused.value.status == status


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_are_refused(data):
    try:
        egress.parse_head(data + b"\r\n\r\n")
    except Refused as exc:
        assert exc.status in (400, 405, 431)


def test_only_allowed_targets_pass_and_the_refusal_says_what_to_do():
    allow = {Endpoint("index.example", 443)}
    egress.check_target(egress.parse_head(b"CONNECT index.example:443 HTTP/1.1\r\n\r\n"), allow)
    for head in (b"CONNECT index.example:22 HTTP/1.1\r\n\r\n", b"CONNECT 127.0.0.1:5432 HTTP/1.1\r\n\r\n",
                 b"GET http://index.example/ HTTP/1.1\r\n\r\n"):
        with pytest.raises(Refused) as refused:
            egress.check_target(egress.parse_head(head), allow)
        assert refused.value.status == 403 and "egress_allow" in refused.value.reason


def test_host_platform_and_special_addresses_are_refused():
    denied = egress.denied_networks(["10.0.0.5", "fe80::1%eth0"], ["10.209.0.0/24", "bad"])
    for text in ("127.0.0.1", "::1", "169.254.169.254", "10.0.0.5", "10.209.0.7", "::ffff:127.0.0.1", "0.0.0.0",
                 "224.0.0.1", "fe80::1"):
        assert egress.address_refusal(ipaddress.ip_address(text), denied), text
    assert egress.address_refusal(ipaddress.ip_address("151.101.0.223"), denied) == ""
    assert egress.address_refusal(ipaddress.ip_address("10.0.0.6"), denied) == ""  # a mirror on a LAN is fine


def test_the_proxy_variables_name_the_proxy_for_pip_and_apt():
    env = egress.proxy_env("10.209.0.1:3128")
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://10.209.0.1:3128"


# ---- the firewall's proxy rules --------------------------------------------------------------------

def _chain(script: str, family: str, chain: str) -> list[str]:
    table = script.split(f"table {family} ")[-1]
    body = table.split(f"chain {chain} {{")[1].split("\n  }")[0]
    return [line.strip() for line in body.splitlines()[1:] if line.strip()]


def test_only_a_proxied_members_packets_to_its_proxy_are_marked_and_accepted():
    script = ruleset("br0", [Member("l9hwork", "w:a"), Member("l9hstep", "", "10.209.0.1:3128")])
    assert _chain(script, "bridge", "input") == [
        f'iifname "l9hstep" ip daddr 10.209.0.1 tcp dport 3128 meta mark set {EGRESS_MARK:#x}']
    assert _chain(script, "inet", "input") == [f'iifname "br0" meta mark {EGRESS_MARK:#x} accept',
                                               'iifname "br0" ct state established,related accept',
                                               'iifname "br0" drop']
    # the step is a port like any container: it reaches no other container
    assert "l9hstep" in script.split("set ports")[1].split("}")[0]
    assert _chain(ruleset("br0", [Member("l9hwork")]), "bridge", "input") == []


@pytest.mark.parametrize("proxy", ["10.209.0.1", "10.209.0.1:0", "x; accept:80", "10.209.0.1:70000"])
def test_a_bad_proxy_never_goes_into_a_rule(proxy):
    with pytest.raises(FirewallError):
        ruleset("br0", [Member("l9hstep", "", proxy)])


# ---- a step's command, the install container ------------------------------------------------------

def test_a_step_runs_in_its_own_namespace_never_the_hosts():
    argv = run_argv("c1", ["sh", "-c", "echo"], netns=Path("/run/netns/l9-x"), env=["A=1"],
                    mounts=[Mount("/etc/pip.conf", "/etc/pip.conf")])
    assert argv[:4] == ["buildah", "run", "--network", "ns:/run/netns/l9-x"] and "host" not in argv
    assert argv[argv.index("c1"):] == ["c1", "--", "sh", "-c", "echo"]
    with pytest.raises(ValueError):
        run_argv("c1", ["true"], netns=Path("host"), env=[], mounts=[])


def _sandbox(image: ImageRef | None = None) -> ContainerSpec:
    return ContainerSpec(container_id="c-123", code_dir=Path("/code"), sdk_dir=Path("/sdk"), env={"SECRET": "x"},
                         cpu_millicores=250, memory_mib=128, image=image, executor_dir=Path("/exec"),
                         vendor_dir=Path("/vendor"), packages_dir=Path("/cache/ws/base"), workspace="ws",
                         deployment_id="d1")


def test_the_install_container_is_confined_like_its_sandbox():
    image = ImageRef(image_id="im-1", digest="sha256:ab")
    job = install_spec(_sandbox(image), ["six==1.16", "evil @ file:///app/evil.tar.gz"], "10.209.0.1:3128",
                       ([Mount("/etc/pip.conf", "/etc/pip.conf")], ["PIP_CERT=/etc/ssl/ca.crt"]))
    assert isinstance(job, JobSpec) and egress_proxy_of(job) == "10.209.0.1:3128"
    assert egress_proxy_of(_sandbox()) == ""
    assert job.image == image and job.code_dir == Path("/code") and job.packages_dir == Path("/cache/ws/base")
    assert job.command == ("python3", "-m", "levers9.executor.install", "--", "six==1.16",
                           "evil @ file:///app/evil.tar.gz")
    assert "SECRET" not in job.env and job.env["PIP_CERT"] == "/etc/ssl/ca.crt"
    assert job.env["HTTPS_PROXY"] == "http://10.209.0.1:3128"
    assert (job.workspace, job.deployment_id, job.executor_dir, job.vendor_dir, job.gpu) == ("", "", None, None, None)
    assert all(b.read_only for b in job.binds)
    config = bundle_spec(job, Path("/root"), Path("/run/netns/x"))
    sandbox = bundle_spec(_sandbox(image), Path("/root"), Path("/run/netns/x"))
    for key in ("capabilities", "noNewPrivileges", "user", "rlimits"):
        assert config["process"][key] == sandbox["process"][key]
    assert config["linux"]["seccomp"] == sandbox["linux"]["seccomp"]
    assert config["linux"]["namespaces"] == sandbox["linux"]["namespaces"]


def test_the_cache_is_per_workspace_and_image():
    assert image_key(None) == "base"
    assert image_key(ImageRef(image_id="a")) != image_key(ImageRef(image_id="b"))
    assert cache_name("acme") == "acme"
    assert cache_name("../etc").startswith("h-") and "/" not in cache_name("a/b")
