"""A test app: reports where it runs, so tests can tell a runc container from a plain process."""
import os
import time

from levers9 import App

app = App("probe")


def warm_up():
    return {"loaded_at": time.time(), "secret": os.environ.get("PROBE_SECRET", "")}


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=20, on_start=warm_up, timeout=60)
def probe(context, echo: str = ""):
    return {"pid": os.getpid(), "container_id": os.environ.get("LEVERS9_CONTAINER_ID", ""),
            "hostname": os.uname().nodename, "echo": echo, "on_start": context.on_start_value,
            "app_files": sorted(os.listdir("/app")) if os.path.isdir("/app") else []}


@app.endpoint(name="boom", cpu=0.25, memory="128Mi", keep_warm_seconds=30)
def boom(x: int = 0):
    raise ValueError(f"boom {x}")


@app.endpoint(name="hog", cpu=0.25, memory="64Mi", keep_warm_seconds=30)
def hog():
    blocks = []
    while True:
        blocks.append(bytearray(16 * 1024 * 1024))


def slow_start():
    time.sleep(4)
    return "slow"


@app.endpoint(name="slow", cpu=0.25, memory="128Mi", keep_warm_seconds=60, on_start=slow_start, timeout=90)
def slow():
    return {"worker_started": True}
