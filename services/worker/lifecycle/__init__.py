"""What happens to a placed container over its life: the placement read (placement), its start, readiness,
stop, exits and idle stop (containers), its code (code), its secrets (secret_source), the idle rule (idle),
how the worker registers and heartbeats (registration), and what a restarted or fenced worker says and
reaps (restart)."""
