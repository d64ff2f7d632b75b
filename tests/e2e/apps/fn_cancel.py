"""Ctrl-C in the caller cancels the remote call and frees its slot (`long`), then `short` runs."""

import sys

from levers9 import App

app = App("fncancel")


@app.function(cpu=0.25, memory="128Mi", max_containers=1, timeout=600)
def nap(seconds):
    import time

    print("napping", flush=True)
    time.sleep(seconds)
    return seconds


if __name__ == "__main__":
    print("RESULT", nap.remote(600 if sys.argv[1] == "long" else 0), flush=True)
