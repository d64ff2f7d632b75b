"""A test app for two autoscaler replicas: exactly two containers kept warm with no traffic."""
from levers9 import App

app = App("warm-pair")


@app.endpoint(cpu=0.25, memory="128Mi", min_containers=2, max_containers=3, timeout=60)
def warm_pair():
    return {"warm": True}
