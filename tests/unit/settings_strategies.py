"""Settings with every credential set to a recognisable value, for the property that no platform
credential reaches a worker elsewhere (Kubernetes pools, attached clusters)."""

from __future__ import annotations

from dataclasses import fields

from hypothesis import strategies as st

from levers9.runtime.config import Settings

CREDENTIALS = ("database_url", "s3_access_key", "s3_secret_key", "secret_key", "secret_key_file", "nats_issuer",
               "nats_creds", "bus_signing_key", "token", "worker_token", "nats_tls_key", "grpc_tls_key")
MARK = "SECRET-"

_plain = st.text(st.characters(codec="ascii", exclude_characters="S\x00"), max_size=20)


@st.composite
def any_settings(draw) -> Settings:
    values: dict[str, object] = {}
    for f in fields(Settings):
        if f.name in CREDENTIALS:
            values[f.name] = MARK + draw(_plain)
        elif f.type in ("str", str):
            values[f.name] = draw(_plain)
    return Settings(**values)  # type: ignore[arg-type]
