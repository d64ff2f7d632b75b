from levers9 import App
import this_module_does_not_exist  # noqa: F401

app = App("broken")


@app.endpoint(cpu=0.25, memory="128Mi")
def broken():
    return "never"
