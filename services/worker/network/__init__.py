"""Container networking: the bridge, namespaces and address claims (bridge), the firewall (firewall), the
published ports of netns hosts (hosts), the egress allow-list (egress) and the egress proxy (egress_proxy)."""
