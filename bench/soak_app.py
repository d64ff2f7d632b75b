"""The soak's app: an endpoint and a function with no image of their own (the platform base)."""

from levers9 import App

app = App("soak")


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=30)
def ping(n: int = 0):
    return {"n": n}


@app.function(cpu=0.25, memory="128Mi", timeout=60)
def add(a, b):
    return a + b
