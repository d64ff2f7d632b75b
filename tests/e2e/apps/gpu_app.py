"""A test app for GPU pools: endpoints on the pool `gpu` (H100) that report the cards they were given
and what each rank of levers9.distributed sees."""
import os

import levers9.distributed
from levers9 import App

app = App("gpus")
RANK_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")


def rank_view():
    return {k: os.environ.get(k, "") for k in RANK_KEYS}


def cards():
    return {"devices": os.environ.get("NVIDIA_VISIBLE_DEVICES", "")}


@app.endpoint(name="gpu-pair", cpu=0.25, memory="256Mi", gpu="H100", gpu_count=2, pool="gpu", keep_warm_seconds=60,
              timeout=60)
def pair():
    return {**cards(), "ranks": levers9.distributed.run(rank_view)}


@app.endpoint(name="gpu-one-a", cpu=0.25, memory="128Mi", gpu="H100", gpu_count=1, pool="gpu", keep_warm_seconds=60,
              checkpoint_enabled=True, timeout=60)
def one_a():
    return cards()


@app.endpoint(name="gpu-one-b", cpu=0.25, memory="128Mi", gpu="H100", gpu_count=1, pool="gpu", keep_warm_seconds=60,
              timeout=60)
def one_b():
    return cards()


@app.endpoint(name="gpu-three", cpu=0.25, memory="128Mi", gpu="H100", gpu_count=3, pool="gpu", timeout=60)
def three():
    return cards()
