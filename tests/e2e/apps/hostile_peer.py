"""The hostile test's target in another workspace: says which address it has (from its /etc/hosts)."""
import os

from levers9 import App

app = App("hostile-peer")


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=120, timeout=60)
def peer():
    with open("/etc/hosts") as f:
        last = [line.split() for line in f if line.strip()][-1]
    return {"ip": last[0], "port": int(os.environ.get("LEVERS9_RUNNER_PORT", "8000"))}
