"""Notebooks: a box running Jupyter Server (JupyterLab) that comes back with its kernels' memory.

`app.notebook(NAME)` (and `levers9 notebook NAME`) deploys a box whose program is JupyterLab, in an
image that adds the pinned `jupyterlab` to the one given. It is reached through the dashboard at
`/nb/NAME/` with the dashboard's session (never a token in the URL): the dashboard forwards
`/nb/NAME/...` to the gateway's `/box/NAME/nb/NAME/...`, so Jupyter's base URL is `/nb/NAME/`.
Jupyter asks for no token or password of its own and accepts any Origin: the dashboard has checked
the session and the Origin before anything reaches it, and the box is reachable only through the
gateway with a token of its workspace.

Left idle for `idle_timeout` seconds (no request, no open WebSocket: a kernel's page keeps one open),
the autoscaler stops it and the worker dumps it first (BoxOptions.idle_checkpoint); opening it again
restores that dump, so variables defined before are still there. Kernels talk to the server over
Unix sockets (`KernelManager.transport=ipc`): TCP connections inside the container would be dumped
too, but Unix ones need nothing from the network.

Standard library only (this package is mounted alone inside containers).
"""

from __future__ import annotations

import re
from typing import Any

from levers9.options import ConfigError, Image

JUPYTERLAB = "jupyterlab==4.6.6"
PORT = 8888
ROOT_DIR = "/notebooks"  # where its notebooks are saved (in the container's own layer, kept by its dumps)
IDLE_TIMEOUT_S = 600
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a deployment's name (levers9.contracts.spec)
# defaults a notebook's box differs in: one container (one kernel's memory), many requests at once
# (a JupyterLab page loads dozens of files and keeps WebSockets open), dumps on
DEFAULTS: dict[str, Any] = {"max_containers": 1, "concurrency": 64, "checkpoint_enabled": True, "memory": "1Gi"}
REFUSED = ("min_containers", "max_containers", "on_start", "function", "command", "port", "ready_path")


def base_url(name: str) -> str:
    return f"/nb/{name}/"


def command(name: str) -> list[str]:
    """JupyterLab on PORT under /nb/NAME/, without a token of its own, kernels over Unix sockets."""
    return ["python3", "-m", "jupyterlab", "--ip=0.0.0.0", f"--port={PORT}", "--no-browser", "--allow-root",
            f"--ServerApp.base_url={base_url(name)}", f"--ServerApp.root_dir={ROOT_DIR}",
            "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.allow_origin=*",
            "--ServerApp.allow_remote_access=True", "--KernelManager.transport=ipc",
            "--LabApp.news_url=", "--LabApp.check_for_updates_class="
            "jupyterlab.NeverCheckForUpdate"]


def notebook_image(image: Any) -> Image:
    """`image` (None: the platform's base) with JupyterLab added and its notebooks' folder made."""
    if image is None:
        image = Image()
    if not isinstance(image, Image):
        raise ConfigError(f"image {image!r} is not valid: use Image(python_packages=[...]) (from levers9 import "
                          "Image) or None; JupyterLab is added to it")
    if not any(p.split("==")[0].strip().lower() == "jupyterlab" for p in image.python_packages):
        image = image.add_python_packages(JUPYTERLAB)
    return image.add_commands(f"mkdir -p {ROOT_DIR}").with_env(JUPYTER_RUNTIME_DIR="/tmp/jupyter-runtime")


def notebook_options(name: Any, image: Any, idle_timeout: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of app._register("box", ...) for notebook `name` (ConfigError on a mistake)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"notebook name {name!r} is not valid: lowercase letters, digits and '-', "
                          "at most 63 characters, e.g. 'analysis'")
    for key in REFUSED:
        if key in options:
            raise ConfigError(f"app.notebook takes no {key}: a notebook is one JupyterLab container "
                              "(use app.box for another program)")
    for key in ("keep_warm_seconds", "scaledown_window"):
        if key in options:
            raise ConfigError(f"app.notebook takes no {key}: say how long it may stay idle before it is dumped "
                              "and stopped with idle_timeout=SECONDS")
    if isinstance(idle_timeout, bool) or not isinstance(idle_timeout, int) or not 10 <= idle_timeout <= 7 * 86400:
        raise ConfigError(f"idle_timeout {idle_timeout!r} is not valid: seconds without a request or an open "
                          "page before it is dumped and stopped, 10 to 604800, e.g. idle_timeout=600")
    if options.get("checkpoint_enabled") is False:
        raise ConfigError("a notebook keeps its kernels' memory by its checkpoints: checkpoint_enabled=False "
                          "is refused (use app.box for a program that starts afresh)")
    box = {"command": command(name), "port": PORT, "ready_path": base_url(name) + "api", "idle_checkpoint": True}
    return {**DEFAULTS, **options, "name": name, "box": box, "image": notebook_image(image),
            "keep_warm_seconds": idle_timeout}
