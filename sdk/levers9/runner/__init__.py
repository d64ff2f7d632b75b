"""The runner: the process inside every container (`python3 -m levers9.runner`).

It listens at once, then imports the user's module and runs on_start in the background, so the
worker can watch `GET /_levers9/health` go from starting (503) to ready (200) or failed (500; the
runner then exits with status 3). Every other request goes to the user's code: an endpoint function
(the JSON body's fields are its keyword arguments, the return value is the JSON answer) or an ASGI
app. At most LEVERS9_RUNNER_CONCURRENCY requests run the code at once. SIGTERM stops accepting,
lets the requests in flight finish (up to STOP_GRACE_SECONDS), and exits 0.

Standard library only: the container is a bare python3 with this package mounted at /opt/levers9.
Modules: config (LEVERS9_RUNNER_* settings), runtime (state, loading and calling the user's code),
server (HTTP/1.1, health and status), endpoint (a function's inputs and answer), asgi (the bridge to
an ASGI app), exchange (what endpoint and asgi need of server's handler), main (the process).
"""
