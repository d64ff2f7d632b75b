"""A test app for hostile bodies: an endpoint that takes any JSON object and says how many fields it had."""
from levers9 import App

app = App("hostile-echo")


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=600, timeout=60)
def hostile_echo(**fields):
    return {"fields": len(fields)}
