"""Generated Settings. `any_settings`: every credential set to a recognisable value, for the property
that no platform credential reaches a worker elsewhere (Kubernetes pools, attached clusters).
`settings_values`: any value of every setting, by flat name, for the round trip through the environment."""

from __future__ import annotations

import enum

from hypothesis import strategies as st

from levers9.runtime.config import Settings, Spec

CREDENTIALS = ("database_url", "s3_access_key", "s3_secret_key", "secret_key", "secret_key_file", "nats_issuer",
               "nats_creds", "bus_signing_key", "token", "worker_token", "nats_tls_key", "grpc_tls_key")
MARK = "SECRET-"

_plain = st.text(st.characters(codec="ascii", exclude_characters="S\x00"), max_size=20)


def _value(spec: Spec) -> st.SearchStrategy:
    if isinstance(spec.type, type) and issubclass(spec.type, enum.Enum):
        return st.sampled_from(list(spec.type))
    if spec.type is bool:
        return st.one_of(st.none(), st.booleans())
    if spec.type is int:
        return st.integers(0, 2 ** 40)
    # an empty variable means unset: "" can be passed on only where it is the default
    text = st.text(st.characters(codec="ascii", exclude_characters="\x00"), max_size=20)
    return text if spec.default == "" else text.filter(bool)


@st.composite
def any_settings(draw) -> Settings:
    values: dict[str, object] = {}
    for name, spec in Settings.specs().items():
        if name in CREDENTIALS:
            values[name] = MARK + draw(_plain)
        elif spec.type is str:
            values[name] = draw(_plain)
        elif name != "home":
            values[name] = draw(_value(spec))
    return Settings().with_(**values)


@st.composite
def settings_values(draw) -> dict[str, object]:
    return {name: draw(_value(spec)) for name, spec in Settings.specs().items() if name != "home"}
