"""A test app whose on_start builds in-memory state worth keeping: a random value and a large table.
A restored container must answer with the same value without running on_start again."""
import os
import random
import time

from levers9 import App

app = App("stateful")


def build():
    time.sleep(2)  # a slow start, so that restoring is worth it
    table = list(range(2_000_000))
    return {"value": random.random(), "table_sum": sum(table), "built_at": time.time(), "pid": os.getpid()}


@app.endpoint(cpu=0.5, memory="512Mi", keep_warm_seconds=10, on_start=build, checkpoint_enabled=True, timeout=120)
def stateful(context):
    state = context.on_start_value
    return {"value": state["value"], "table_sum": state["table_sum"], "built_at": state["built_at"],
            "container_id": os.environ.get("LEVERS9_CONTAINER_ID", "")}
