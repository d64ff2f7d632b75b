"""A worker running as a host (levers9.runtime.hosts): its containers are published on its address.

The gateway and the other hosts reach only the host's own address, never its container bridge: each
container is forwarded from `host_address:port` to `container_ip:its port` (DNAT in the host's
namespace, rendered with the container firewall, levers9.worker.network.firewall). The port is a pure
function of the container's address (one per address of the bridge subnet, from
`publish_port_base`), so it needs no allocation of its own: the address claim is the allocation,
and it goes with the claim when the container is torn down.
"""

from __future__ import annotations

import ipaddress


def published_port(subnet: str, ip: str, base: int) -> int:
    """The host port of the container at `ip` on the bridge `subnet`: base + its offset in the subnet."""
    net = ipaddress.IPv4Network(subnet, strict=True)
    addr = ipaddress.IPv4Address(ip)
    if addr not in net:
        raise ValueError(f"{ip} is not in the bridge subnet {subnet}")
    port = base + int(addr) - int(net.network_address)
    if base < 1024 or port > 65535:
        raise ValueError(f"publish_port_base {base} leaves no port for {ip} in {subnet}")
    return port


def container_address(host_address: str, subnet: str, ip: str, port: int, base: int) -> str:
    """Where the gateway reaches a container: through the host when the worker is one, else directly."""
    if not host_address:
        return f"http://{ip}:{port}"
    return f"http://{host_address}:{published_port(subnet, ip, base)}"
