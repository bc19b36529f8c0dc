"""The nvidia plugin, scheduler side (DeviceScheduler hooks): whole NVIDIA GPUs, `nvidia.com/gpu: n`.

What a node has comes from the advertised inventory `node.inventories["nvidia"]` when the advertiser runs
(device ids `"0"`.., model, memory in bytes, health, and a topology in the format
`topology.tree_from_inventory` documents), otherwise from NVIDIA GPU Feature Discovery labels:
`nvidia.com/gpu.count` (capped by allocatable `nvidia.com/gpu`, which is also the fallback),
`nvidia.com/gpu.product` and `nvidia.com/gpu.memory` (MiB). The instance type
(`node.kubernetes.io/instance-type`) looks the node up in `topology.CATALOG` for its group tree (DGX-1
cube-mesh, NVSwitch) and for default model and memory; an unknown instance type, or one whose GPU count does
not match the node's, is flat: any set of GPUs is as good as any other.

What a pod asks: `nvidia.com/gpu: n` per container; the pod annotation `nvidia-gpu-scheduler/gpu.model`
restricts every container to GPUs of that model (compared by `topology.normalize_model`: trimmed,
case-insensitive, spaces, `-` and `_` alike); `kubegpu.io/gpu-memory` (a quantity, e.g. `32Gi`) to GPUs with
at least that much memory (a GPU whose memory is unknown does not qualify). Unhealthy GPUs are never given
out.

Which GPUs: `topology.choose`, container by container in spec order, each from what the previous ones left.
The score is the GPU-weighted mean of `topology.placement_score` over the containers (100: every container
inside the smallest group that can hold it). Fit itself needs no placement: any count of free eligible GPUs
can be placed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from kubegpu.core.limits import check_device_count
from kubegpu.core.models import (
    ContainerRequest,
    DeviceCell,
    DeviceInfo,
    DeviceInventory,
    NodeInfo,
    Occupancy,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.quantity import QuantityError, to_int
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom, hookimpl
from kubegpu.core.status import Status
from kubegpu.plugins.nvidia import COUNT_LABEL, MEMORY_LABEL, NAME, PRODUCT_LABEL, RESOURCE, RESOURCES
from kubegpu.plugins.nvidia.topology import (
    CATALOG,
    CUBE_MESH,
    FLAT,
    NVSWITCH,
    GroupTree,
    InstanceType,
    TopologyError,
    build_tree,
    choose,
    ids_of,
    link_pairs,
    normalize_model,
    placement_score,
    tree_from_inventory,
)

__all__ = ["NAME", "RESOURCE", "RESOURCES", "Ask", "NvidiaNodeState", "parse_ask", "read_ask"]

MODEL_ANNOTATION = "nvidia-gpu-scheduler/gpu.model"
MEMORY_ANNOTATION = "kubegpu.io/gpu-memory"
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")

INSUFFICIENT = f"Insufficient {RESOURCE}"
MIB = 1024 * 1024

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------
# Private state
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ask:
    """The nvidia part of one pod: GPU counts per requesting container (spec order), pod-wide refinements.

    `error` is set when an annotation is malformed; `model` and `memory_text` are kept as written (trimmed)
    for reasons, `model_key` and `memory` are what is compared.
    """

    containers: tuple[tuple[str, int], ...] = ()
    total: int = 0
    model: str | None = None
    model_key: str | None = None
    memory: int | None = None
    memory_text: str | None = None
    error: str | None = None


Plan = tuple[tuple[str, int, int, int], ...]
"""Per container: (name, GPU count, chosen mask, size of the group the GPUs lie in)."""


class NvidiaNodeState(DeviceNodeState):
    """One node's GPUs. GPU i (in id order) is bit i of the masks; `free` holds healthy GPUs nobody holds."""

    plugin = NAME

    def __init__(
        self,
        node: str,
        ids: list[str],
        models: list[str | None],
        memories: list[int | None],
        healthy: list[bool],
        tree: GroupTree,
    ) -> None:
        super().__init__(node)
        self.ids = tuple(ids)
        self.index = {device: bit for bit, device in enumerate(ids)}
        self.models = tuple(models)
        self.model_keys = tuple(None if m is None else normalize_model(m) for m in models)
        self.memories = tuple(memories)
        self.healthy = sum(1 << bit for bit, ok in enumerate(healthy) if ok)
        self.tree = tree
        self.free = self.healthy
        self.holders: list[str | None] = [None] * len(ids)
        self.version = 0
        self._eligible: dict[tuple[str | None, str | None], tuple[int, str | None]] = {}
        self._plan: tuple[int, Ask, Plan | None] | None = None

    def eligible(self, ask: Ask) -> tuple[int, str | None]:
        """(healthy GPUs of the asked model and memory, the unresolvable reason when the node has none)."""
        key = (ask.model, ask.memory_text)  # as written: the reason quotes them
        cached = self._eligible.get(key)
        if cached is None:
            if len(self._eligible) >= 64:
                self._eligible.clear()
            cached = self._eligible[key] = eligible_gpus(self, ask)
        return cached

    def plan(self, ask: Ask) -> Plan | None:
        """The placement for the ask on the current state, computed once per (state version, ask)."""
        cached = self._plan
        if cached is not None and cached[0] == self.version and cached[1] == ask:
            return cached[2]
        mask, reason = self.eligible(ask)
        result = None if reason else plan_containers(self.tree, mask & self.free, ask.containers)
        self._plan = (self.version, ask, result)
        return result


# ----------------------------------------------------------------------------------------------------------
# Hook implementations
# ----------------------------------------------------------------------------------------------------------


@hookimpl
def kubegpu_scheduler_resources() -> list[str]:
    return list(RESOURCES)


@hookimpl
def kubegpu_scheduler_build_node(node: NodeInfo) -> NvidiaNodeState | None:
    inventory = node.inventories.get(NAME)
    if inventory is not None:
        return state_from_inventory(node.name, inventory, instance_type(node.labels))
    return state_from_labels(node.name, node.labels, node.allocatable)


@hookimpl
def kubegpu_scheduler_headroom(state: DeviceNodeState) -> Headroom | None:
    assert isinstance(state, NvidiaNodeState)
    free = state.free.bit_count()
    healthy = state.healthy.bit_count()
    return Headroom(free={RESOURCE: free}, utilization=(healthy - free) / healthy if healthy else 0.0)


@hookimpl
def kubegpu_scheduler_validate(pod: PodRequest) -> Status | None:
    error = read_ask(pod).error
    return Status.unresolvable(error, plugin=NAME) if error else None


@hookimpl
def kubegpu_scheduler_prepare(pod: PodRequest) -> Ask:
    return read_ask(pod)


@hookimpl
def kubegpu_scheduler_fit(state: DeviceNodeState, pod: PodRequest, prepared: Ask) -> Status:
    assert isinstance(state, NvidiaNodeState)
    ask = prepared
    if ask.error:
        return Status.unresolvable(ask.error, plugin=NAME)
    if not ask.total:
        return Status.success()
    mask, reason = state.eligible(ask)
    if reason:
        return Status.unresolvable(reason, plugin=NAME)
    if ask.total > mask.bit_count():
        return Status.unresolvable(INSUFFICIENT, plugin=NAME)
    if ask.total > (mask & state.free).bit_count():
        return Status.unschedulable(INSUFFICIENT, plugin=NAME)
    return Status.success()


@hookimpl
def kubegpu_scheduler_score(state: DeviceNodeState, pod: PodRequest, prepared: Ask) -> float | None:
    assert isinstance(state, NvidiaNodeState)
    ask = prepared
    if ask.error or not ask.total:
        return 0.0 if ask.error else 100.0
    plan = state.plan(ask)
    return 0.0 if plan is None else plan_score(state.tree, plan)


@hookimpl
def kubegpu_scheduler_allocate(state: DeviceNodeState, pod: PodRequest, prepared: Ask) -> PluginAllocation | None:
    assert isinstance(state, NvidiaNodeState)
    ask = prepared
    if ask.error:
        return None
    plan = state.plan(ask) if ask.total else ()
    if plan is None:
        return None
    chosen = 0
    containers: dict[str, dict[str, list[str]]] = {}
    for name, _, mask, _ in plan:
        containers[name] = {RESOURCE: ids_of(mask, state.ids)}
        chosen |= mask
    models = {state.models[bit] for bit in range(len(state.ids)) if chosen >> bit & 1}
    fields = {"model": models.pop()} if len(models) == 1 and None not in models else {}
    return PluginAllocation(plugin=NAME, containers=containers, fields=fields)


@hookimpl
def kubegpu_scheduler_take(state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status | None:
    assert isinstance(state, NvidiaNodeState)
    bits, error = allocation_bits(state, allocation)
    # An unhealthy GPU is never allocated (it is not free), but a pod that already holds one keeps it: the engine
    # re-takes running pods when a node's inventory changes, and dropping them would free their other GPUs.
    if error is None:
        for bit in bits:
            if state.holders[bit] is not None:
                error = f"device {state.ids[bit]} is already held by {state.holders[bit]}"
                break
    if error:
        return Status.error(error, plugin=NAME)
    for bit in bits:
        state.holders[bit] = pod_key
        state.free &= ~(1 << bit)
    state.version += 1
    return Status.success()


@hookimpl
def kubegpu_scheduler_release(state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status | None:
    assert isinstance(state, NvidiaNodeState)
    bits, error = allocation_bits(state, allocation)
    if error:
        return Status.error(error, plugin=NAME)
    for bit in bits:
        if state.holders[bit] != pod_key:  # idempotent (Unreserve): what the pod no longer holds is left alone
            continue
        state.holders[bit] = None
        state.free |= (1 << bit) & state.healthy
    state.version += 1
    return Status.success()


@hookimpl
def kubegpu_scheduler_describe(state: DeviceNodeState) -> list[Occupancy] | None:
    assert isinstance(state, NvidiaNodeState)
    cells = []
    for bit, device in enumerate(state.ids):
        holder = state.holders[bit]
        cells.append(
            DeviceCell(
                id=device,
                holders=[holder] if holder else [],
                used=1.0 if holder else 0.0,
                healthy=bool(state.healthy >> bit & 1),
            )
        )
    free = state.free.bit_count()
    grid = state.tree.kind == CUBE_MESH and len(cells) == 8
    return [
        Occupancy(
            family=NAME,
            layout="grid" if grid else "cells",
            columns=4 if grid else 0,
            cells=cells,
            total=len(cells),
            free=free,
            largest_fit=free,
            topology=state.tree.kind if state.tree.kind in (CUBE_MESH, NVSWITCH) else "",
            links=list(link_pairs(state.tree)),
        )
    ]


# ----------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------


def owns(resource: str) -> bool:
    return resource == RESOURCE


def read_ask(pod: PodRequest) -> Ask:
    """The nvidia part of a pod (the engine reads it once per pod signature: `kubegpu_scheduler_prepare`)."""
    return parse_ask(pod.containers, pod.annotations)


def parse_ask(containers: Sequence[ContainerRequest], annotations: Mapping[str, str]) -> Ask:
    """`Ask` from a pod's containers and annotations."""
    wanted: list[tuple[str, int]] = []
    for container in containers:
        amount = container.resources.get(RESOURCE, 0)
        if amount > 0:
            wanted.append((container.name, amount))
    model = (annotations.get(MODEL_ANNOTATION) or "").strip() or None
    memory_text = (annotations.get(MEMORY_ANNOTATION) or "").strip() or None
    memory = None
    error = None
    if memory_text is not None:
        try:
            memory = to_int(memory_text)
        except QuantityError as exc:
            error = f"annotation {MEMORY_ANNOTATION}: {exc}"
        else:
            if memory < 0:
                error = f"annotation {MEMORY_ANNOTATION}: {memory_text!r} is negative (give a size: 16Gi)"
    return Ask(
        containers=tuple(wanted),
        total=sum(n for _, n in wanted),
        model=model,
        model_key=normalize_model(model) if model else None,
        memory=memory,
        memory_text=memory_text,
        error=error,
    )


def eligible_gpus(state: NvidiaNodeState, ask: Ask) -> tuple[int, str | None]:
    """(healthy GPUs matching the ask's model and memory, the reason when no GPU of the node matches at all).

    Reasons name the model and memory as the pod wrote them and never the node, so identical situations on
    different nodes aggregate into one line.
    """
    matching = 0
    of_model = 0
    for bit in range(len(state.ids)):
        if ask.model_key is not None and state.model_keys[bit] != ask.model_key:
            continue
        of_model |= 1 << bit
        memory = state.memories[bit]
        if ask.memory is not None and (memory is None or memory < ask.memory):
            continue
        matching |= 1 << bit
    if not of_model:
        return 0, f'node(s) have no GPU of model "{ask.model}"'
    if not matching:
        model = f' of model "{ask.model}"' if ask.model else ""
        return 0, f"node(s) have no GPU{model} with at least {ask.memory_text} of memory"
    return matching & state.healthy, None


def plan_containers(tree: GroupTree, available: int, containers: tuple[tuple[str, int], ...]) -> Plan | None:
    """Choose GPUs for each container in order from `available`, each from what the previous ones left."""
    plan = []
    for name, n in containers:
        chosen = choose(tree, available, n)
        if chosen is None:
            return None
        mask, size = chosen
        plan.append((name, n, mask, size))
        available &= ~mask
    return tuple(plan)


def plan_score(tree: GroupTree, plan: Plan) -> float:
    """The GPU-weighted mean placement score of a plan's containers."""
    total = sum(n for _, n, _, _ in plan)
    if not total:
        return 100.0
    return sum(n * placement_score(tree, n, size) for _, n, _, size in plan) / total


def allocation_bits(state: NvidiaNodeState, allocation: PluginAllocation) -> tuple[list[int], str | None]:
    """The GPU positions an allocation names, or the error that makes it unusable on this node (garbage in a
    decoded annotation included): another resource, shares, an unknown id, an id named twice."""
    if allocation.shares:
        return [], "nvidia GPUs are whole devices; the allocation must not carry shares"
    bits: list[int] = []
    seen: set[int] = set()
    for container, resources in allocation.containers.items():
        for resource, ids in resources.items():
            if not owns(resource):
                return [], f"container {container}: resource {resource} is not scheduled by plugin {NAME}"
            for device in ids:
                bit = state.index.get(device)
                if bit is None:
                    return [], f"device {device} does not exist on this node"
                if bit in seen:
                    return [], f"device {device} appears twice in the allocation"
                seen.add(bit)
                bits.append(bit)
    return bits, None


def instance_type(labels: Mapping[str, str]) -> str | None:
    for label in INSTANCE_TYPE_LABELS:
        value = labels.get(label)
        if value:
            return value.strip()
    return None


@dataclass(frozen=True, slots=True)
class LabelInventory:
    """What GPU Feature Discovery labels (and allocatable) say: GPU count, model, memory per GPU in bytes."""

    count: int
    model: str | None
    memory: int | None


def gpus_from_labels(labels: Mapping[str, str], allocatable: Mapping[str, int]) -> LabelInventory | None:
    """Read GFD labels: `nvidia.com/gpu.count` (capped by allocatable `nvidia.com/gpu`, which is also the
    fallback: the kubelet admits no more), `nvidia.com/gpu.product`, `nvidia.com/gpu.memory` (MiB). A
    malformed number is ignored as if absent. None when the node has no GPUs."""
    count = _label_int(labels.get(COUNT_LABEL))
    offered = allocatable.get(RESOURCE)
    if count is None or (offered is not None and offered < count):
        count = offered
    if not count or count < 1:
        return None
    model = (labels.get(PRODUCT_LABEL) or "").strip() or None
    memory_mib = _label_int(labels.get(MEMORY_LABEL))
    return LabelInventory(count, model, memory_mib * MIB if memory_mib is not None else None)


def _label_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


@lru_cache(maxsize=256)
def catalog_tree(kind: str | None, gpus: int) -> GroupTree:
    """The catalog's tree for an instance type when it has exactly `gpus` GPUs, else flat (trees are
    immutable, so nodes of one shape share one)."""
    entry = CATALOG.get(kind) if kind else None
    if entry is None or entry.gpus != gpus:
        return build_tree(FLAT, gpus)
    return build_tree(entry.kind, gpus, entry.groups)


def state_from_labels(node: str, labels: Mapping[str, str], allocatable: Mapping[str, int]) -> NvidiaNodeState | None:
    found = gpus_from_labels(labels, allocatable)
    if found is None:
        return None
    kind = instance_type(labels)
    entry: InstanceType | None = CATALOG.get(kind) if kind else None
    model = found.model or (entry.model if entry else None)
    memory = found.memory if found.memory is not None else (entry.memory_mib * MIB if entry else None)
    n = found.count
    check_device_count(node, "NVIDIA GPUs", n)
    return NvidiaNodeState(
        node, [str(i) for i in range(n)], [model] * n, [memory] * n, [True] * n, catalog_tree(kind, n)
    )


def _id_order(device: DeviceInfo) -> tuple[bool, int, str]:
    """GPU indices in numeric order ("2" before "10"), any other ids after them."""
    numeric = device.id.isdigit()
    return (not numeric, int(device.id) if numeric else 0, device.id)


def state_from_inventory(node: str, inventory: DeviceInventory, kind: str | None) -> NvidiaNodeState | None:
    """The state from an advertised inventory; its topology wins over the catalog, a malformed one is flat."""
    check_device_count(node, "advertised NVIDIA GPUs", len(inventory.devices))
    if not inventory.devices:
        return None
    devices = sorted(inventory.devices, key=_id_order)
    ids = [d.id for d in devices]
    try:
        tree = tree_from_inventory(inventory.topology, ids)
    except TopologyError as exc:
        log.warning("node %s: nvidia topology ignored, GPUs treated as flat: %s", node, exc)
        tree = build_tree(FLAT, len(ids))
    if tree is None:
        tree = catalog_tree(kind, len(ids))
    return NvidiaNodeState(
        node, ids, [d.model for d in devices], [d.memory for d in devices], [d.healthy for d in devices], tree
    )
