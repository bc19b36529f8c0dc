"""The nvidia plugin, node side (Device hooks)."""

from __future__ import annotations

from kubegpu.core.device_hooks import hookimpl

NAME = "nvidia"
RESOURCES = ["nvidia.com/gpu"]


@hookimpl
def kubegpu_device_resources() -> list[str]:
    return list(RESOURCES)
