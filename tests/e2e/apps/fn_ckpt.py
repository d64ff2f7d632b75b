"""A function whose sandbox is dumped once its imports are done; the next cold start restores it."""

import sys

from levers9 import App

app = App("fnckpt")
STARTED = __import__("time").time()  # noqa: F841 - module state the restored sandbox must not redo


@app.function(cpu=0.5, memory="256Mi", checkpoint_enabled=True, keep_warm_seconds=600)
def double(x):
    import random

    return 2 * x, random.random()  # two restores of one dump must not draw the same numbers


if __name__ == "__main__":
    value, drawn = double.remote(int(sys.argv[1]))
    print("RESULT", value, drawn, flush=True)
