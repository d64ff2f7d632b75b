"""A user's script: functions defined in __main__, called remotely with no deploy step (run as
`python fn_script.py`; it prints one JSON line of what it saw, the e2e test checks it)."""

import json
import sys
import time
import traceback

from levers9 import App, FunctionCall

app = App("fnscript")
FACTOR = 3  # a module global the function closes over


class Oops(Exception):
    pass


def helper(x):
    return x * FACTOR


@app.function(cpu=0.5, memory="256Mi", max_containers=2, concurrency=2)
def scaled(x):
    print(f"scaling {x}", flush=True)
    return helper(x)


@app.function(cpu=0.5, memory="256Mi")
def fails(x):
    raise Oops(f"bad input {x}")


@app.function(cpu=0.5, memory="256Mi")
def slow_square(x, delay=0.0):
    time.sleep(delay)
    return x * x


@app.function(cpu=0.5, memory="256Mi")
def words(text):
    for w in text.split():
        yield w.upper()


@app.function(cpu=0.5, memory="256Mi")
def count():
    global COUNTER
    COUNTER = globals().get("COUNTER", 0) + 1
    return COUNTER


def main() -> dict:
    seen: dict = {"remote": scaled.remote(7)}
    seen["map"] = list(slow_square.map([3, 2, 1], [0.6, 0.3, 0.0]))
    try:
        fails.remote(5)
    except Oops as exc:
        text = "".join(traceback.format_exception(exc))
        seen["error"] = {"type": type(exc).__name__, "own_type": isinstance(exc, Oops), "message": str(exc),
                         "remote_frame": "in fails" in text and "bad input" in text}
    handle = slow_square.spawn(9)
    seen["spawn"] = handle.get(timeout=120)
    seen["from_id"] = FunctionCall.from_id(handle.id).get(timeout=60)
    seen["gen"] = list(words.remote_gen("a remote generator"))
    with app.session():
        seen["session"] = [count.remote() for _ in range(3)]
    seen["no_session"] = count.remote()
    return seen


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
    sys.exit(0)
