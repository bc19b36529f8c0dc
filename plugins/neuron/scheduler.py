"""The neuron plugin, scheduler side (DeviceScheduler hooks)."""

from __future__ import annotations

from kubegpu.core.scheduler_hooks import hookimpl

NAME = "neuron"
RESOURCES = ["aws.amazon.com/neuron", "aws.amazon.com/neurondevice", "aws.amazon.com/neuroncore"]


@hookimpl
def kubegpu_scheduler_resources() -> list[str]:
    return list(RESOURCES)
