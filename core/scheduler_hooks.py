"""`DeviceScheduler`: the scheduler-side hook specification.

A scheduler plugin owns some extended resources (`nvidia.com/gpu`, `gpu.intel.com/*`) and decides, for one node at
a time, whether a pod's request for them fits, how good the fit is, and which concrete devices it gets. The engine
(`kubegpu.scheduler.engine`) calls these hooks; the simulator, the custom scheduler and the extender all drive the
same engine, so a plugin is written once for all three.

Each node gets one state object per plugin (`kubegpu_scheduler_build_node`); every later hook receives that state,
and the engine calls the hook of the plugin that built it only, so the per-node hooks are `firstresult` and a plugin
never has to recognise another plugin's state. Hooks are listed in the order the engine calls them. Every hook uses
the same docstring layout: summary, Args, Returns, Called by.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pluggy

from kubegpu.core.models import NodeInfo, Occupancy, PluginAllocation, PodRequest
from kubegpu.core.status import Status

__all__ = ["PROJECT", "DeviceNodeState", "Headroom", "hookimpl", "hookspec"]

PROJECT = "kubegpu.scheduler"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class DeviceNodeState:
    """Base class of a plugin's private per-node state. The engine reads only `plugin` and `node`."""

    plugin: str = ""

    def __init__(self, node: str) -> None:
        self.node = node


@dataclass(frozen=True, slots=True)
class Headroom:
    """What a node can still offer, for the engine's capacity index and its binpack/spread policy.

    `free` maps each owned resource to the largest amount one container could be given now (an upper bound is
    allowed: `fit` decides exactly); `utilization` is the used fraction of the plugin's devices on the node (0..1).
    """

    free: dict[str, int] = field(default_factory=dict)
    utilization: float = 0.0


# ---------------------------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_scheduler_resources() -> list[str]:
    """Name the extended resources this plugin schedules.

    Args:
        (none)

    Returns:
        Resource names (`aws.amazon.com/neuron`); a name ending in `/*` claims every resource with that prefix
        (`gpu.intel.com/*`). An empty list means the plugin owns nothing and is never asked about pods.

    Called by:
        the plugin manager once at start-up, to route each requested resource to exactly one plugin.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Node lifecycle
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_scheduler_build_node(node: NodeInfo) -> DeviceNodeState | None:
    """Build this plugin's state for one node from its labels, allocatable and advertised inventory.

    Args:
        node: the node; `node.inventories[<plugin>]` is the advertised inventory when an advertiser runs, which
            takes precedence over labels (an unhealthy advertised device is never allocated).

    Returns:
        A fresh state with every device free, or None when the node has none of this plugin's devices.

    Called by:
        the engine when a node is added or changes (simulator input, scheduler and extender node watches); the
        engine then re-applies the allocations of the pods already on the node with `kubegpu_scheduler_take`.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def kubegpu_scheduler_headroom(state: DeviceNodeState) -> Headroom | None:
    """Summarise what the node can still offer, for the engine's capacity index.

    Args:
        state: this plugin's state of the node.

    Returns:
        A `Headroom`. None is treated as "nothing free".

    Called by:
        the engine after the state is built and after every take or release on it; firstresult (the owning plugin).
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Scheduling cycle: pre-check, filter, score, reserve
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_scheduler_validate(pod: PodRequest) -> Status | None:
    """Check the plugin's part of a request before any node is considered (a node-independent pre-check).

    Args:
        pod: the pod; only the resources and annotations this plugin owns are its concern.

    Returns:
        An unresolvable `Status` whose reason says what to change (e.g. mixing whole devices and cores in one
        container), or None (or a success) when the request is well formed.

    Called by:
        the engine at the start of every scheduling cycle, for each plugin owning a resource the pod requests.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def kubegpu_scheduler_fit(state: DeviceNodeState, pod: PodRequest) -> Status | None:
    """Decide whether the pod's request for this plugin's resources fits the node now.

    Args:
        state: this plugin's state of the node.
        pod: the pod.

    Returns:
        A success `Status`, or one that says why not: unresolvable when the node can never take the request (the
        trn1 "does not support requests for device: 7" refusal, a GPU model the node lacks), unschedulable when
        devices in use are in the way.

    The answer must depend only on the state and the pod's containers, resources, selectors and annotations, not on
    its name or UID: the engine reuses it for an equal pod while the node is unchanged.

    Called by:
        the engine's filter phase for candidate nodes; firstresult (the owning plugin).
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def kubegpu_scheduler_score(state: DeviceNodeState, pod: PodRequest) -> float | None:
    """Rate how well the request fits the node's topology, from 0 (poor) to 100 (ideal).

    Args:
        state: this plugin's state of a node where `kubegpu_scheduler_fit` succeeded.
        pod: the pod.

    Returns:
        A score in [0, 100] (e.g. 100 when the GPUs form a connected group, lower when the placement would break
        up the largest free valid set). The engine adds its binpack/spread policy score. None counts as 0.

    Called by:
        the engine's score phase for feasible nodes, and the extender's prioritize verb; firstresult.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def kubegpu_scheduler_allocate(state: DeviceNodeState, pod: PodRequest) -> PluginAllocation | None:
    """Choose concrete devices for every container of the pod that requests this plugin's resources.

    Args:
        state: this plugin's state of the chosen node; not to be changed here.
        pod: the pod.

    Returns:
        The `PluginAllocation`, or None when the request no longer fits (the engine then reports the node's fit
        reason). The choice must be a valid topology set and must leave the state untouched: the engine reserves it
        with `kubegpu_scheduler_take`.

    Called by:
        the engine's reserve phase (simulator, custom scheduler, extender's bind verb); firstresult.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def kubegpu_scheduler_take(state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status | None:
    """Mark the allocation's devices (or device shares) as held by the pod.

    Args:
        state: this plugin's state of the node.
        pod_key: `namespace/name` of the holder.
        allocation: this plugin's part of the pod's allocation, fresh from `kubegpu_scheduler_allocate` or decoded
            from a bound pod's `kubegpu.io/allocation` annotation at restart.

    Returns:
        Success, or an error `Status` naming the device when it is unknown, unhealthy, already held or over its
        share; then nothing is taken.

    Called by:
        the engine's reserve phase and its ledger rebuild; firstresult.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def kubegpu_scheduler_release(state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status | None:
    """Return exactly what `kubegpu_scheduler_take` took for the pod.

    Args:
        state: this plugin's state of the node.
        pod_key: `namespace/name` of the holder.
        allocation: the allocation that was taken.

    Returns:
        Success, or an error `Status` when the pod held none of it (the engine logs it; nothing changes).

    Called by:
        the engine when a pod is deleted, finishes, or its binding is rolled back; firstresult.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def kubegpu_scheduler_describe(state: DeviceNodeState) -> list[Occupancy] | None:
    """Draw the node's devices and their holders for reports and the monitoring API.

    Args:
        state: this plugin's state of the node.

    Returns:
        One `Occupancy` per device family on the node (layout, cells, free and largest-fit counts).

    Called by:
        the simulator's report and the extender's monitoring API; firstresult.
    """
    raise NotImplementedError
