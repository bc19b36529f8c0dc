"""nvidia-gpu-scheduler's surfaces on `kubegpu extender`, for users who switch from it.

nvidia-gpu-scheduler (seed 004) is a scheduler extender whose users also watch two lists: `GET
/apis/nvidia-gpu-scheduler/v1/gpupods?watch=true` (which pod holds which GPUs) and `.../gpunodes?watch=true` (each
node's GPUs, by model), and which scores a node by the free GPUs of the model the pod asks for
(`nvidia-gpu-scheduler/gpu.model`). This module describes the engine's NVIDIA devices in those two views, and
gives that score as the extender's `--policy free-model-gpus`. The extender serves the views on the same paths,
behind the same client-certificate authentication as its own monitoring API, and shares each view among its
watchers exactly like `/apis/kubegpu/v1/*` (`extender._Feed`).

The objects are kubegpu's own rendering, shaped like Kubernetes objects (`apiVersion`, `kind`, `metadata`):

* `GpuNode` `{"metadata": {"name"}, "name", "gpus": [{"id", "model", "memory", "healthy", "pod"}], "models": {model:
  {"total", "free"}}, "heldByCount": {pod: count}}`, for every node with NVIDIA GPUs; `pod` is the holder
  (`namespace/name`) or null, `free` counts healthy GPUs nobody holds.
* `GpuPod` `{"metadata": {"namespace", "name", "uid"}, "node", "byCount", "gpus": [{"container", "id", "model"}]}`,
  for every pod holding NVIDIA GPUs.

Only what is known is shown. A pod bound without a verified allocation (another scheduler's, or a claim that does not
verify) is held by count: the kubelet gave it GPUs of its own choosing, and the GPUs the ledger set aside for it are
kubegpu's guess. Its `GpuPod` says `"byCount": true` and gives each of its GPUs `"id": null` (and the node's model
where all its GPUs are of one); its `GpuNode` names no holder on those GPUs, counts them as not free, and lists the
pod under `heldByCount`. Once the node side publishes the ids the kubelet gave it (`kubegpu advertise` reading the
kubelet's PodResources API), the pod holds exactly those and both views name them.

The same paths also answer through the API server's aggregation layer (`examples/deploy/kustomize/overlays/
nvidia-gpu-scheduler`): `GET /apis/nvidia-gpu-scheduler/v1` lists the resources so that the aggregator
finds the APIService available, and the extender verbs answer under `/apis/nvidia-gpu-scheduler/v1/schedule/` (the
last path segment names the verb, as for any `urlPrefix`).

Calls read the engine's state through its queries (`Engine.device_state`, `Engine.placements`): hold the mirror's
lock.
"""

from __future__ import annotations

from typing import Any

from kubegpu.core.models import PodRequest
from kubegpu.plugins.nvidia.scheduler import NAME as NVIDIA
from kubegpu.plugins.nvidia.scheduler import RESOURCE, NvidiaNodeState, read_ask
from kubegpu.scheduler.engine import Engine

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "DISCOVERY",
    "FREE_MODEL_GPUS",
    "GPUNODES",
    "GPUPODS",
    "free_model_gpus",
    "gpu_node_views",
    "gpu_pod_views",
]

API_GROUP = "nvidia-gpu-scheduler"
API_VERSION = f"{API_GROUP}/v1"
PREFIX = f"/apis/{API_VERSION}"
GPUPODS = f"{PREFIX}/gpupods"
GPUNODES = f"{PREFIX}/gpunodes"
FREE_MODEL_GPUS = "free-model-gpus"  # the extender's --policy value

# What the aggregation layer asks for to find the APIService available, and what `kubectl api-resources` lists.
DISCOVERY: dict[str, Any] = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": API_VERSION,
    "resources": [
        {"name": "gpupods", "singularName": "", "namespaced": False, "kind": "GpuPod", "verbs": ["list", "watch"]},
        {"name": "gpunodes", "singularName": "", "namespaced": False, "kind": "GpuNode", "verbs": ["list", "watch"]},
        {"name": "schedule", "singularName": "", "namespaced": False, "kind": "Schedule", "verbs": ["create"]},
    ],
}


def _state(engine: Engine, name: str) -> NvidiaNodeState | None:
    state = engine.device_state(name, NVIDIA)
    return state if isinstance(state, NvidiaNodeState) else None


def gpu_node_views(engine: Engine, changed: set[str] | None) -> dict[str, dict[str, Any] | None]:
    """The `GpuNode` objects of the nodes in `changed` (every node when None); None for a node that is gone or has
    no NVIDIA GPU."""
    views: dict[str, dict[str, Any] | None] = {}
    for name in engine.node_names() if changed is None else changed:
        state = _state(engine, name)
        if state is None:
            views[name] = None
            continue
        gpus = []
        models: dict[str, dict[str, int]] = {}
        by_count = _held_by_count(engine, state)
        counted: dict[str, int] = {}
        for bit, device in enumerate(state.ids):
            model = state.models[bit] or ""
            healthy = bool(state.healthy >> bit & 1)
            holder = state.holders[bit]
            if holder is not None and holder in by_count:  # set aside by count: not this very GPU
                counted[holder] = counted.get(holder, 0) + 1
                holder = None
            gpus.append(
                {
                    "id": device,
                    "model": model,
                    "memory": state.memories[bit],
                    "healthy": healthy,
                    "pod": holder,
                }
            )
            counts = models.setdefault(model, {"total": 0, "free": 0})
            counts["total"] += 1
            counts["free"] += bool(state.free >> bit & 1)
        views[name] = {
            "apiVersion": API_VERSION,
            "kind": "GpuNode",
            "metadata": {"name": name},
            "name": name,
            "gpus": gpus,
            "models": models,
            "heldByCount": counted,
        }
    return views


def _held_by_count(engine: Engine, state: NvidiaNodeState) -> set[str]:
    """The holders of GPUs on the node that hold them by count (`Placement.by_count`)."""
    holders = {holder for holder in state.holders if holder is not None}
    return {key for key in holders if (held := engine.placement(key)) is not None and held.by_count}


def gpu_pod_views(engine: Engine, changed: set[str] | None) -> dict[str, dict[str, Any] | None]:
    """The `GpuPod` objects of the pods holding NVIDIA GPUs on the nodes in `changed` (every node when None)."""
    keys = None if changed is None else [key for name in changed for key in engine.holders(name)]
    views: dict[str, dict[str, Any] | None] = {}
    for pod in engine.placements(keys):
        part = pod.parts.get(NVIDIA)
        if part is None:
            continue
        state = _state(engine, pod.node)
        models = {m or "" for m in state.models} if state is not None else set()
        only = next(iter(models)) if len(models) == 1 else ""
        gpus: list[dict[str, Any]] = []
        for container, resources in part.containers.items():
            for device in resources.get(RESOURCE, ()):
                if pod.by_count:  # the ledger's guess, not the GPU the kubelet gave it
                    gpus.append({"container": container, "id": None, "model": only})
                    continue
                bit = state.index.get(device) if state is not None else None
                model = state.models[bit] if state is not None and bit is not None else None
                gpus.append({"container": container, "id": device, "model": model or ""})
        if not gpus:
            continue
        request = pod.request
        views[request.key] = {
            "apiVersion": API_VERSION,
            "kind": "GpuPod",
            "metadata": {"namespace": request.namespace, "name": request.name, "uid": request.uid},
            "node": pod.node,
            "byCount": pod.by_count,
            "gpus": gpus,
        }
    return views


def free_model_gpus(engine: Engine, name: str, pod: PodRequest) -> int:
    """nvidia-gpu-scheduler's score: the free, healthy GPUs on the node of the model the pod asks for with
    `nvidia-gpu-scheduler/gpu.model` (of any model when it names none), also matching `kubegpu.io/gpu-memory`."""
    state = _state(engine, name)
    if state is None:
        return 0
    ask = read_ask(pod)
    if ask.error:
        return 0
    eligible, reason = state.eligible(ask)
    return 0 if reason else (eligible & state.free).bit_count()
