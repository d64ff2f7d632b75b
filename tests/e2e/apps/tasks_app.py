"""Task queues and a schedule (tests/e2e/test_e2e_tasks.py): `levers9 deploy` makes the queues
`square`, `flaky` and `single` (one sandbox, one task at a time, a 5 s TTL) and the every-minute
schedule `minutely`. TASKS_CALLBACK (read at deploy, on the
caller's machine) is where `square` POSTs each outcome."""

import os

from levers9 import App

app = App("tasks")


@app.task_queue(cpu=0.25, memory="128Mi", retries=2, retry_backoff=0.2, timeout=120, max_containers=2,
                concurrency=8, callback_url=os.environ.get("TASKS_CALLBACK", ""))
def square(x, delay=0.0):
    import time

    time.sleep(delay)
    print(f"squaring {x}")
    return x * x


@app.task_queue(cpu=0.25, memory="128Mi", retries=1, retry_backoff=0.1, timeout=30)
def flaky(n):
    raise ValueError(f"always fails {n}")


@app.schedule("* * * * *", timezone="Europe/Berlin", cpu=0.25, memory="128Mi", timeout=30)
def minutely():
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    print(f"tick ran at {now}")
    return now


@app.task_queue(cpu=0.25, memory="128Mi", ttl=5, max_containers=1, concurrency=1, timeout=120)
def single(seconds):
    import time

    time.sleep(seconds)
    return seconds
