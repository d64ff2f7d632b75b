"""An endpoint with its own image: a PyPI package the base lacks, a command step and an env var.

    levers9 deploy examples/with_image.py      # builds the image first (live steps), then deploys
    levers9 images list
"""
import os

from levers9 import App, Image

image = (Image(python_packages=["humanize==4.9.0"])
         .add_commands("mkdir -p /srv/data && date -u +%Y-%m-%dT%H:%M:%SZ > /srv/data/built-at")
         .with_env(GREETING="hello from my image"))

app = App("with-image")


@app.endpoint(image=image, cpu=0.5, memory="256Mi", keep_warm_seconds=30)
def with_image(size: int = 3_000_000):
    import humanize

    with open("/srv/data/built-at") as f:
        built_at = f.read().strip()
    return {"greeting": os.environ["GREETING"], "size": humanize.naturalsize(size), "image_built_at": built_at}
