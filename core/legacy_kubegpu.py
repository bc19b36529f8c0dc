"""Microsoft KubeGPU's pod annotation, `pod.alpha/DeviceInformation`, for clusters that switch from it.

KubeGPU (seed 003) asked for GPUs, and recorded the GPUs its scheduler gave, in one JSON annotation per pod:
`{"runningcontainer": {NAME: {"requests": {"alpha.gpu/numgpu": 2}, "allocatefrom": {".../gpu/ID/cards": ...}}}}`,
init containers under `initcontainer` alike (DLWorkspace wrote it inside single quotes). Such a pod lists no
`nvidia.com/gpu` in its containers: its GPUs came from KubeGPU's CRI shim, not the kubelet's device manager. kubegpu
reads a container's GPUs from its resources, so without this module

* a pod still running from before the switch held nothing in kubegpu's ledger, and its GPUs were given to the next
  pod that asked: two containers on one GPU. Such a bound pod now holds, by count, the GPUs its annotation says
  KubeGPU gave each container (the `allocatefrom` entries ending in `/cards`), as a pod bound by another scheduler
  does (`Engine.admit_by_count`);
* a pending pod written for KubeGPU was placed with no GPU and ran without one. It is now refused, its
  FailedScheduling Event saying which container asks how many GPUs and what to write instead.

Only a container (init containers and sidecars included) that lists no `nvidia.com/gpu` is read, and only on a pod
without kubegpu's own allocation. The annotation is a tenant's text: one kubegpu cannot read (not JSON, wrong types,
over `MAX_TEXT_BYTES`) is ignored, so it never makes a bound pod unreadable (and so uncounted), and counts are bounded
(`MAX_GPUS`). A tenant who may bind a pod to a node itself (`spec.nodeName`) can set GPUs aside there with a forged
annotation for as long as that pod runs, as it could by asking `nvidia.com/gpu` (security T205).
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["DEVICE_INFORMATION", "GPU_RESOURCE", "kubegpu_gpus"]

DEVICE_INFORMATION = "pod.alpha/DeviceInformation"
GPU_RESOURCE = "nvidia.com/gpu"  # what KubeGPU's NVIDIA plugin scheduled
NUMGPU = "alpha.gpu/numgpu"
MAX_TEXT_BYTES = 64 * 1024  # DLWorkspace's annotations are a few hundred bytes
MAX_GPUS = 1024  # per container: more than any node holds


class _Container(BaseModel):
    model_config = ConfigDict(extra="ignore")
    requests: dict[str, int] = Field(default_factory=dict)
    devrequests: dict[str, int] = Field(default_factory=dict)
    allocatefrom: dict[str, str] = Field(default_factory=dict)


class _PodInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")
    initcontainer: dict[str, _Container] = Field(default_factory=dict)
    runningcontainer: dict[str, _Container] = Field(default_factory=dict)


def _asked(requests: Mapping[str, int]) -> int:
    cards = sum(max(n, 0) for key, n in requests.items() if key.endswith("/cards"))
    return max(requests.get(NUMGPU, 0), cards)


def kubegpu_gpus(annotations: Mapping[str, str], *, bound: bool) -> dict[str, int]:
    """Container name -> the GPUs KubeGPU's annotation gave it (`bound`) or asks for it (pending); empty when the
    pod has no such annotation or it cannot be read."""
    text = annotations.get(DEVICE_INFORMATION)
    if not text or len(text) > MAX_TEXT_BYTES:
        return {}
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        text = text[1:-1]
    try:
        info = _PodInfo.model_validate(orjson.loads(text))
    except (orjson.JSONDecodeError, ValidationError, TypeError):
        return {}
    gpus: dict[str, int] = {}
    # Init containers under their own key (KubeGPU's PodInfo.InitContainers); a pod's container names are unique
    for name, container in [*info.initcontainer.items(), *info.runningcontainer.items()]:
        given = sum(1 for key in container.allocatefrom if "/gpu/" in key and key.endswith("/cards"))
        count = given if bound else max(_asked(container.requests), _asked(container.devrequests))
        if count > 0:
            gpus[name] = max(gpus.get(name, 0), min(count, MAX_GPUS))
    return gpus
