"""Checkpoints on a worker: the archive format (archive), CRIU found or made for this machine
(criu_install), the CUDA side of GPU checkpoints (gpu), and the orchestration of dumps and restores
through the node cache with their events (orchestration)."""
