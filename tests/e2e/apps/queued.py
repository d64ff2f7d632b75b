"""A test app for the wait queue and Server-Timing: one container, one call at a time, at most one call
waiting; `hold` keeps its slot for the seconds asked."""
import time

from levers9 import App

app = App("queued")


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=600, timeout=60, concurrency=1, max_containers=1,
              max_pending=1)
def queued(hold: float = 0.0):
    time.sleep(min(float(hold), 30.0))
    return {"held": hold}
