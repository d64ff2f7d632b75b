"""What happens to a placed container over its life: the placement read (placement), its code (code), its
secrets (secret_source), the idle rule (idle), and what a restarted or fenced worker says and reaps (restart)."""
