"""A hostile tenant's function: its packages= (HOSTILE_PACKAGES at deploy, `|`-separated) name a
package it ships in its own code (tests/e2e/_hostile_builds.py writes `evilpkg/` beside this file),
whose setup.py records where it ran into the workspace's install cache (and tries the host).
The function reports that record and whether the package imports."""
import json
import os

from levers9 import App

app = App("hostile-packages")
PACKAGES = [p for p in os.environ.get("HOSTILE_PACKAGES", "").split("|") if p]
RECORD = os.environ.get("HOSTILE_RECORD", "record.json")


@app.function(packages=PACKAGES, cpu=0.25, memory="256Mi", timeout=600)
def probe():
    found = {}
    for dirpath, _, files in os.walk("/var/lib/levers9/packages"):
        if RECORD in files:
            with open(os.path.join(dirpath, RECORD)) as f:
                found = json.load(f)
    try:
        import evilmod  # noqa: F401
        imported = True
    except ImportError:
        imported = False
    return {"record": found, "imported": imported, "hostname": os.uname().nodename}
