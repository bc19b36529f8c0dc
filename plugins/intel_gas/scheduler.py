"""The intel-gas plugin, scheduler side (DeviceScheduler hooks)."""

from __future__ import annotations

from kubegpu.core.scheduler_hooks import hookimpl

NAME = "intel-gas"
RESOURCES = ["gpu.intel.com/*"]


@hookimpl
def kubegpu_scheduler_resources() -> list[str]:
    return list(RESOURCES)
