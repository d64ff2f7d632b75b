"""The executor: the part of a function sandbox's runner that runs Python function calls.

The runner (`LEVERS9_RUNNER_KIND=function`) starts it before loading anything; it listens on a unix
socket (wire.SOCKET_DIR/wire.SOCKET_NAME, bound from the worker) and serves one call per connection
in the protocol of wire.py. Standard library only, plus cloudpickle, which the platform puts beside
this package on PYTHONPATH and which is imported when the first call comes.

Modules: wire (frames, generations), server (the socket, one thread per connection, a call's
lifetime), calls (loading the function and its arguments, running it, the answer), sessions (module
globals shared by the calls of a session), capture (a call's stdout/stderr to its caller),
interrupt (stopping a call's thread: cancel, timeout, caller gone), packages (per-sandbox pip
installs).
"""
