"""A hostile tenant's image: a build step probes every target in HOSTILE_TARGETS (JSON, at deploy:
the control plane's ports on the host's addresses) and the package index, and writes what it got
into the image; the function returns it, and uses the package the build installed."""
import os
import shlex

from levers9 import App, Image

app = App("hostile-build")
TARGETS = os.environ.get("HOSTILE_TARGETS", "[]")

PROBE = """
import json, os, socket, ssl, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
def reach(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__
targets = json.loads(sys.argv[1])
# at once: a dropped packet costs its whole timeout, and there are addresses x ports of them
with ThreadPoolExecutor(32) as pool:
    out = dict(zip(targets, pool.map(reach, targets)))
# as pip does, a try that the index (or a loaded worker) leaves unanswered is tried again: each
# attempt's error is kept, so a refusal by the proxy (403/502) shows as such, not as a timeout
from pip._internal.models.index import PyPI
context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
errors = []
for attempt in range(3):
    try:
        with urllib.request.urlopen(PyPI.simple_url.rstrip("/") + "/pip/", timeout=60, context=context) as answer:
            out["index"] = answer.status
        break
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        out["index"] = "; ".join(errors)
out["index_errors"] = errors
os.makedirs("/srv/hostile", exist_ok=True)
with open("/srv/hostile/probe.json", "w") as f:
    json.dump(out, f)
"""

image = Image(python_packages=["humanize==4.9.0"]).add_commands(
    f"python3 -c {shlex.quote(PROBE)} {shlex.quote(TARGETS)}")


@app.function(image=image, cpu=0.25, memory="256Mi", timeout=600)
def probe():
    import json

    import humanize

    with open("/srv/hostile/probe.json") as f:
        return {"probe": json.load(f), "humanize": humanize.naturalsize(3_000_000)}
