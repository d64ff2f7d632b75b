"""A test app whose image asks for a package that does not exist: its build fails with pip's message."""
from levers9 import App, Image

app = App("bad-image")


@app.endpoint(image=Image(python_packages=["levers9-no-such-package-xyz==0.0.1"]), cpu=0.25, memory="128Mi")
def bad_image():
    return {}
