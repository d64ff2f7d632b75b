"""Where each service's class lives, by the name used on the command line (`levers9 service NAME`)."""

from __future__ import annotations

import importlib

SERVICE_CLASSES = {
    "gateway": "levers9.gateway.service:GatewayService",
    "scheduler": "levers9.scheduler.service:SchedulerService",
    "pool-controller": "levers9.pool_controller.service:PoolControllerService",
    "checkpoint-store": "levers9.checkpoint_store.service:CheckpointStoreService",
    "image-builder": "levers9.image_builder.service:ImageBuilderService",
    "worker": "levers9.worker.service:WorkerService",
    "dashboard": "levers9.dashboard.service:DashboardService",
}


def service_class(name: str):
    try:
        target = SERVICE_CLASSES[name]
    except KeyError:
        raise SystemExit(f"unknown service {name!r}; choose one of: {', '.join(SERVICE_CLASSES)}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)
