"""A test app for volumes: a writer and a reader of the workspace's volume `cache` (each takes most
of a 2-core worker, so with two workers they run on different ones), and a cloud bucket round trip."""
import os
from pathlib import Path

from levers9 import App, CloudBucket, Volume

app = App("volumes")
cache = Volume("cache", "/cache")


@app.endpoint(volumes=[cache], cpu=1.5, memory="128Mi", keep_warm_seconds=600, timeout=120)
def writer(name: str, text: str):
    Path("/cache", name).write_text(text)
    return {"read_back": Path("/cache", name).read_text(), "container_id": os.environ["LEVERS9_CONTAINER_ID"],
            "files": sorted(os.listdir("/cache"))}


@app.endpoint(volumes=[cache], cpu=1.5, memory="128Mi", keep_warm_seconds=600, timeout=120)
def reader(name: str):
    path = Path("/cache", name)
    return {"text": path.read_text() if path.exists() else None,
            "container_id": os.environ["LEVERS9_CONTAINER_ID"]}


@app.endpoint(volumes=[CloudBucket("l9-volumes-test", "/bucket", secret="BUCKET_CREDS")], cpu=0.25,
              memory="128Mi", keep_warm_seconds=5, timeout=120)
def bucket(read: str, write: str, text: str):
    got = Path("/bucket", read).read_text()
    Path("/bucket", write).write_text(text)
    return {"read": got, "listing": sorted(os.listdir("/bucket"))}
