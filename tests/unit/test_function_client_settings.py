"""The function client reads its settings again only when their source changed (the LEVERS9_*
variables, the home, the profile file): every `.remote` used to read and parse them."""

from __future__ import annotations

import os

from levers9 import function_client
from levers9.runtime.config import Settings


def test_settings_are_read_again_exactly_when_their_source_changes(tmp_path, monkeypatch):
    for name in [n for n in os.environ if n.startswith("LEVERS9_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path))
    profile = tmp_path / "config.toml"
    profile.write_text('gateway_url = "http://127.0.0.1:1"\ntoken = "first"\n')
    reads = []
    real = Settings.load.__func__

    def counted(cls, *a, **kw):
        reads.append(1)
        return real(cls, *a, **kw)

    monkeypatch.setattr(Settings, "load", classmethod(counted))
    monkeypatch.setattr(function_client, "_loaded", None)

    assert function_client._settings().client.token == "first"
    assert function_client._settings().client.token == "first"
    assert len(reads) == 1  # nothing changed: no second read

    profile.write_text('gateway_url = "http://127.0.0.1:1"\ntoken = "second, longer"\n')  # `levers9 up` again
    assert function_client._settings().client.token == "second, longer"
    monkeypatch.setenv("LEVERS9_TOKEN", "from-env")
    assert function_client._settings().client.token == "from-env"
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.delenv("LEVERS9_TOKEN")
    monkeypatch.setenv("LEVERS9_HOME", str(other))  # another home: its profile (none) is read
    assert function_client._settings().client.token == ""
    assert len(reads) == 4
