"""A test app for the autoscaler: a deployed function kept warm with no call (min_containers=1), at
most two; an idle one beyond the minimum goes after 2 s."""
from levers9 import App

app = App("warm-fn")


@app.function(cpu=0.25, memory="128Mi", min_containers=1, max_containers=2, scaledown_window=2, timeout=60)
def warmfn(x):
    return x * 2
