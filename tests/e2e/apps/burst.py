"""A test app for a burst of first calls: at most 2 containers of 4 calls each; each call holds its slot
a moment, so that 20 concurrent calls need both containers, and says which container answered."""
import os
import time

from levers9 import App

app = App("burst")


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=600, timeout=60, concurrency=4, max_containers=2)
def burst():
    time.sleep(0.5)
    return {"container_id": os.environ.get("LEVERS9_CONTAINER_ID", "")}
