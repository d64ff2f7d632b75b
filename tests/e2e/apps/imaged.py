"""A test app whose image adds a PyPI package that is not in the base, runs a command and sets an
environment variable; the endpoint answers with all three. IMAGED_LAST_COMMAND changes the last
command (a rebuild of that step only)."""
import os

from levers9 import App, Image

app = App("imaged")

image = (Image(python_packages=["humanize==4.9.0"])
         .add_commands("mkdir -p /srv/imaged && echo built-by-levers9 > /srv/imaged/marker",
                       os.environ.get("IMAGED_LAST_COMMAND", "echo first > /srv/imaged/last"))
         .with_env(GREETING="hello from the image"))


@app.endpoint(image=image, cpu=0.25, memory="256Mi", keep_warm_seconds=60, timeout=120)
def imaged():
    import humanize

    with open("/srv/imaged/marker") as marker, open("/srv/imaged/last") as last:
        return {"size": humanize.naturalsize(3_000_000), "marker": marker.read().strip(),
                "last": last.read().strip(), "greeting": os.environ.get("GREETING", ""),
                "container_id": os.environ.get("LEVERS9_CONTAINER_ID", "")}
