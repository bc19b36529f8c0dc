"""The nvidia plugin, scheduler side (DeviceScheduler hooks)."""

from __future__ import annotations

from kubegpu.core.scheduler_hooks import hookimpl

NAME = "nvidia"
RESOURCES = ["nvidia.com/gpu"]


@hookimpl
def kubegpu_scheduler_resources() -> list[str]:
    return list(RESOURCES)
