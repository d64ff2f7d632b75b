"""Python function sandboxes: their containers and package installs (sandboxes), the relay from the
gateway to their executor (executor_relay), and which shared checkpoints this worker can restore
(catalogue_check)."""
