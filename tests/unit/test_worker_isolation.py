"""Container isolation, the pure parts: the firewall's rules (levers9.worker.network.firewall), the seccomp
profile (levers9.worker.runtime.runc.seccomp) and the hardening of the OCI spec (levers9.worker.runtime.runc.bundle)."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.worker.network import firewall
from levers9.worker.network.bridge import Ipam
from levers9.worker.network.firewall import FirewallError, Member, peer_group, ruleset
from levers9.worker.runtime.interface import ContainerSpec
from levers9.worker.runtime.runc import seccomp
from levers9.worker.runtime.runc.bundle import (
    CAPABILITIES,
    HARDENING,
    MASKED_PATHS,
    PIDS_LIMIT,
    READONLY_PATHS,
    bundle_spec,
    spec_record,
)

# ---- firewall: which container may reach which ---------------------------------------------------

def test_peer_groups_follow_the_policy():
    assert peer_group("none", "acme", "d1") == ""
    assert peer_group("workspace", "acme", "d1") == peer_group("workspace", "acme", "d2") == "w:acme"
    assert peer_group("deployment", "acme", "d1") != peer_group("deployment", "acme", "d2")
    assert peer_group("deployment", "acme", "d1") != peer_group("deployment", "other", "d1")
    assert peer_group("deployment", "acme", "") == ""  # a bare container has no peers
    with pytest.raises(FirewallError, match="container_peers must be one of none, deployment, workspace"):
        peer_group("all", "acme", "d1")


def _chain(script: str, family: str, chain: str) -> list[str]:
    table = script.split(f"table {family} ")[-1]
    body = table.split(f"chain {chain} ")[1].split("\n  }")[0]
    return [line.strip() for line in body.splitlines()[1:]]


def test_host_input_drops_everything_from_the_bridge_but_answers():
    script = ruleset("levers9br0", [Member("l9haaa", "")])
    assert _chain(script, "inet", "input") == ['iifname "levers9br0" ct state established,related accept',
                                               'iifname "levers9br0" drop']
    forward = _chain(script, "inet", "forward")
    assert forward[-3:] == ['iifname "levers9br0" drop', 'oifname "levers9br0" ct state established,related accept',
                            'oifname "levers9br0" drop']
    assert not [r for r in forward if "daddr" in r]  # no egress by default


def test_the_script_replaces_its_tables_atomically():
    script = ruleset("levers9br0", [])
    for family in ("inet", "bridge"):
        i = script.index(f"table {family} levers9_levers9br0\n")
        assert script[i:].startswith(f"table {family} levers9_levers9br0\ndelete table {family} levers9_levers9br0\n"
                                     f"table {family} levers9_levers9br0 {{")
    assert firewall.removal("l9-br.x") == ("table inet levers9_l9_br_x\ndelete table inet levers9_l9_br_x\n"
                                          "table bridge levers9_l9_br_x\ndelete table bridge levers9_l9_br_x\n")


def _allowed_pairs(script: str) -> set[frozenset[str]]:
    """Which pairs of ports the bridge chain lets talk (read back from the script, like nft would)."""
    sets = dict(re.findall(r"set (\S+) \{ type ifname;(?: elements = \{ ([^}]*) \};)? \}", script))
    members = {name: set(re.findall(r'"([^"]+)"', body)) for name, body in sets.items()}
    pairs = set()
    for name in re.findall(r"iifname @(\S+) oifname @\1 accept", script):
        pairs |= {frozenset((a, b)) for a in members[name] for b in members[name] if a != b}
    return pairs


members_st = st.lists(st.tuples(st.sampled_from(["acme", "other", "third"]), st.sampled_from(["d1", "d2", ""])),
                      max_size=8)


@given(members_st, st.sampled_from(firewall.PEER_POLICIES))
def test_containers_reach_only_their_peers(tags, policy):
    members = [Member(f"l9h{i:07d}", peer_group(policy, ws, dep)) for i, (ws, dep) in enumerate(tags)]
    script = ruleset("levers9br0", members)
    pairs = _allowed_pairs(script)
    for i, (ws_a, dep_a) in enumerate(tags):
        for j, (ws_b, dep_b) in enumerate(tags):
            if i >= j:
                continue
            allowed = frozenset((members[i].host_veth, members[j].host_veth)) in pairs
            if ws_a != ws_b or policy == "none":
                assert not allowed  # never across workspaces; never at all by default
            expected = (policy == "workspace" and ws_a == ws_b) or \
                (policy == "deployment" and ws_a == ws_b and dep_a == dep_b and dep_a != "")
            assert allowed == expected
    ports = re.search(r"set ports \{ type ifname;(?: elements = \{ ([^}]*) \};)? \}", script)
    assert ports is not None
    assert set(re.findall(r'"([^"]+)"', ports.group(1) or "")) == {m.host_veth for m in members}
    bridge_chain = _chain(script, "bridge", "forward")
    assert bridge_chain[-2:] == ["iifname @ports drop", "oifname @ports drop"]


def test_egress_is_opt_in_and_never_to_the_platform():
    nets = firewall.parse_egress("203.0.113.0/24, 2001:db8::/32")
    deny = firewall.platform_addresses(["nats://203.0.113.7:4222", "postgresql://u@db.example:5432/x",
                                        "http://[2001:db8::5]:8333", "203.0.113.9:5000", ""])
    assert [str(a) for a in deny] == ["203.0.113.7", "203.0.113.9", "2001:db8::5"]
    forward = _chain(ruleset("br", [], nets, deny), "inet", "forward")
    assert forward[1:6] == ['iifname "br" ip daddr 203.0.113.7 drop', 'iifname "br" ip daddr 203.0.113.9 drop',
                            'iifname "br" ip6 daddr 2001:db8::5 drop', 'iifname "br" ip daddr 203.0.113.0/24 accept',
                            'iifname "br" ip6 daddr 2001:db8::/32 accept']
    assert firewall.parse_egress(" , ") == []
    with pytest.raises(FirewallError, match="'example.com' is not a network"):
        firewall.parse_egress("10.0.0.0/8,example.com")


def test_rules_refuse_names_that_could_inject():
    with pytest.raises(FirewallError, match="cannot go into a rule"):
        ruleset("br0", [Member('x" accept; #', "")])


def test_claims_carry_the_peer_group_to_the_rules(tmp_path):
    ipam = Ipam("br0", "10.77.0.0/29", root=tmp_path)
    ipam.claim("c1", tmp_path / "w", "l9-abc", group="w:acme")
    ipam.claim("c2", tmp_path / "w", "l9-def")
    (ipam.dir / "10.77.0.6").write_text("")  # being written by another worker: no name yet, no rule
    assert sorted(ipam.members(), key=lambda m: m.host_veth) == [Member("l9habc", "w:acme"), Member("l9hdef", "")]


# ---- seccomp -------------------------------------------------------------------------------------

def test_seccomp_is_dockers_default_for_our_capabilities():
    prof = seccomp.profile(CAPABILITIES, "x86_64")
    assert prof["defaultAction"] == "SCMP_ACT_ERRNO" and prof["defaultErrnoRet"] == 1
    assert prof["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    allowed = {n for r in prof["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and "args" not in r for n in r["names"]}
    for needed in ("read", "openat", "mmap", "execve", "wait4", "socketpair", "arch_prctl", "epoll_wait"):
        assert needed in allowed
    for blocked in ("mount", "umount2", "unshare", "setns", "keyctl", "add_key", "bpf", "kexec_load", "reboot",
                    "init_module", "open_by_handle_at", "io_uring_setup", "perf_event_open", "clock_settime",
                    "chroot", "pivot_root", "swapon", "userfaultfd", "ptrace", "process_vm_readv"):
        assert blocked not in allowed
    clone = [r for r in prof["syscalls"] if r["names"] == ["clone"]]
    assert clone == [{"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                      "args": [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]}]
    assert {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38} in prof["syscalls"]
    assert json.loads(json.dumps(prof)) == prof


def test_seccomp_grants_what_a_held_capability_grants():
    admin = seccomp.profile([*CAPABILITIES, "CAP_SYS_ADMIN"], "aarch64")
    allowed = {n for r in admin["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and "args" not in r for n in r["names"]}
    assert {"mount", "unshare", "clone", "set_tls"} <= allowed
    assert not [r for r in admin["syscalls"] if r["names"] == ["clone3"]]
    with pytest.raises(ValueError, match="no seccomp profile for machine 'sparc'"):
        seccomp.profile(CAPABILITIES, "sparc")


# ---- the OCI spec --------------------------------------------------------------------------------

def test_bundle_is_hardened_like_runc_and_docker(tmp_path):
    spec = ContainerSpec(container_id="c1", code_dir=tmp_path, sdk_dir=tmp_path, env={}, cpu_millicores=500,
                         memory_mib=64, workspace="acme", deployment_id="d1")
    config = bundle_spec(spec, tmp_path / "rootfs", Path("/run/netns/l9-x"))
    process, linux = config["process"], config["linux"]
    assert process["noNewPrivileges"] is True
    assert process["user"] == {"uid": 0, "gid": 0}
    for kind in ("bounding", "effective", "permitted", "ambient"):
        assert sorted(process["capabilities"][kind]) == ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    assert linux["seccomp"] == seccomp.profile(CAPABILITIES)
    assert {"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"} <= set(linux["maskedPaths"])
    assert linux["maskedPaths"] == MASKED_PATHS and linux["readonlyPaths"] == READONLY_PATHS
    assert {"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"} <= set(linux["readonlyPaths"])
    assert linux["resources"]["pids"] == {"limit": PIDS_LIMIT}
    assert linux["resources"]["memory"] == {"limit": 64 << 20, "swap": 64 << 20}
    assert linux["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    # CRIU restores fail with a sysfs mount (FACTS.md): none, so /sys inside is an empty directory
    assert not [m for m in config["mounts"] if m["type"] == "sysfs" or m["destination"].startswith("/sys")]
    assert "user" not in {n["type"] for n in linux["namespaces"]}  # see README "Isolation": no userns
    # a checkpoint says what its container ran under: a restore refuses one dumped without seccomp
    assert spec_record(spec)["hardening"] == HARDENING >= 1
    assert ipaddress.ip_network("10.209.0.0/24")  # the default subnet stays a private network
