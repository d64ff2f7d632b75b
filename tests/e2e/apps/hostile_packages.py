"""A hostile tenant's function: its packages= (HOSTILE_PACKAGES at deploy, `|`-separated) name a
package it ships in its own code (tests/e2e/_hostile_builds.py writes `evilpkg/` beside this file),
whose setup.py records where it ran into the workspace's install cache (and tries the host).
The function reports that record and whether the package imports."""
import json
import os

from levers9 import App

app = App("hostile-packages")
PACKAGES = [p for p in os.environ.get("HOSTILE_PACKAGES", "").split("|") if p]


@app.function(packages=PACKAGES, cpu=0.25, memory="256Mi", timeout=600)
def probe():
    found = {}  # every record a setup.py left in this workspace's cache, by file name
    for dirpath, _, files in os.walk("/var/lib/levers9/packages"):
        for name in files:
            if name.startswith("hostile-") and name.endswith(".json"):
                with open(os.path.join(dirpath, name)) as f:
                    found[name] = json.load(f)
    try:
        import evilmod  # noqa: F401
        imported = True
    except ImportError:
        imported = False
    return {"records": found, "imported": imported, "hostname": os.uname().nodename}
