"""A test app that uses a secret and proves it sees the value without ever showing it: it answers
with the value's sha256. `secret_probe` is checkpointed (a restore keeps the environment it was
dumped with); `secret_plain` never is, so each of its cold starts decrypts the secret again;
`secret_missing` needs a secret nobody set (an error path); `fingerprint` is a function."""
import hashlib
import os

from levers9 import App

app = App("secrets")


def digest() -> dict:
    return {"sha256": hashlib.sha256(os.environ["L9_CANARY"].encode()).hexdigest(),
            "container_id": os.environ.get("LEVERS9_CONTAINER_ID", "")}


def started():
    return os.getpid()


@app.endpoint(cpu=0.25, memory="256Mi", keep_warm_seconds=2, on_start=started, checkpoint_enabled=True,
              secrets=["L9_CANARY"], timeout=120)
def secret_probe(context):
    return digest()


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=2, secrets=["L9_CANARY"], timeout=120)
def secret_plain():
    return digest()


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=2, secrets=["L9_NOT_SET"], timeout=60)
def secret_missing():
    return {"unreachable": True}


@app.function(cpu=0.25, memory="256Mi", secrets=["L9_CANARY"], timeout=60)
def fingerprint():
    return digest()["sha256"]
