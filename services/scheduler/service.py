"""The scheduler process. Keeps its projection of requested containers and known workers; placement
(decide -> append ContainerScheduled / PlacementDeferred) builds on these tables."""

from __future__ import annotations

from levers9.runtime.service import Service
from levers9.runtime.views import ContainersView, WorkersView


class SchedulerService(Service):
    name = "scheduler"
    projections = (ContainersView(), WorkersView())
