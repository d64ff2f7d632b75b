"""Boxes for tests/e2e/test_e2e_boxes.py: a stock program of the default image (the acceptance
example), checkpointed once its port answers, and a command that exits before its port answers."""
from levers9 import App

app = App("boxes")

# python3's own file server over /app (this directory), on a port that is not the runner's (8000);
# keeps a container 10 s after its last call, longer than its own dump's freeze on a loaded machine
app.box("files", command=["python3", "-m", "http.server", "8123"], port=8123, cpu=0.5, memory="256Mi",
        keep_warm_seconds=10, checkpoint_enabled=True, timeout=60)

app.box("crashes", command=["sh", "-c", "echo box is starting; echo cannot bind port 8000 >&2; exit 3"],
        port=8000, cpu=0.25, memory="128Mi", timeout=30)
