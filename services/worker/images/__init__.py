"""Images on a worker node: the read-only lower layer of a container (layers), its lazy FUSE mount
(lazyfs, a process of its own), and the node content cache every worker of the node shares (node_cache),
served by the node's first worker (cache_server)."""
