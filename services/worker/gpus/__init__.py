"""GPUs of a worker node: the inventory and card grants (cards, pure), CDI edits of a bundle (cdi), and
the node shell the worker service drives (node)."""
