"""The smallest levers9 app: one HTTP endpoint, with a value prepared once per container.

    levers9 deploy examples/hello.py
    curl -X POST "$GATEWAY/endpoint/hello" -H "Authorization: Bearer $LEVERS9_TOKEN" -d '{"name": "levers9"}'
    # {"message": "hello, levers9"}
"""

from levers9 import App

app = App("hello")


def load():
    # runs once per container, before its first request; the value reaches every call as
    # context.on_start_value (load models, open connections, read files here)
    return {"greeting": "hello"}


@app.endpoint(cpu=0.5, memory="256Mi", keep_warm_seconds=30, on_start=load)
def hello(context, name: str = "world"):
    return {"message": f"{context.on_start_value['greeting']}, {name}"}
