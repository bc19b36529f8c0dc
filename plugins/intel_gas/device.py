"""The intel-gas plugin, node side (Device hooks)."""

from __future__ import annotations

from kubegpu.core.device_hooks import hookimpl

NAME = "intel-gas"
RESOURCES = ["gpu.intel.com/*"]


@hookimpl
def kubegpu_device_resources() -> list[str]:
    return list(RESOURCES)
