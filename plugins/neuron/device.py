"""The neuron plugin, node side (Device hooks)."""

from __future__ import annotations

from kubegpu.core.device_hooks import hookimpl

NAME = "neuron"
RESOURCES = ["aws.amazon.com/neuron", "aws.amazon.com/neurondevice", "aws.amazon.com/neuroncore"]


@hookimpl
def kubegpu_device_resources() -> list[str]:
    return list(RESOURCES)
