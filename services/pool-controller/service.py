"""The pool-controller process. Keeps its own view of workers; pools and backends build on it."""

from __future__ import annotations

from levers9.runtime.service import Service
from levers9.runtime.views import WorkersView


class PoolControllerService(Service):
    name = "pool-controller"
    projections = (WorkersView(),)
