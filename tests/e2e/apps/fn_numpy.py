"""Functions importing what the catalogue holds: started from the shared checkpoint when on."""

import json
import sys

from levers9 import App

app = App("fnnumpy")
SHARED = sys.argv[1] == "on"


@app.function(cpu=0.5, memory="512Mi", max_containers=4, shared_checkpoints=SHARED)
def draw(i):
    import os
    import random
    import time

    import numpy

    drawn = [i, os.getpid(), random.random(), float(numpy.random.random())]
    time.sleep(1.0)  # each input keeps its sandbox busy: the four start (restore) at once
    return drawn


if __name__ == "__main__":
    print("RESULT " + json.dumps(list(draw.map(range(int(sys.argv[2]))))), flush=True)
