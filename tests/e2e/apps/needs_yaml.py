"""Imports on the developer's machine (pyyaml is there) but not in the container (bare python3)."""
import yaml  # noqa: F401

from levers9 import App

app = App("needs-yaml")


@app.endpoint(name="needs-yaml", cpu=0.25, memory="128Mi")
def needs_yaml():
    return "never served"
