"""`DeviceScheduler`: the scheduler-side hook specification.

A scheduler plugin owns some extended resources (`nvidia.com/gpu`, `gpu.intel.com/*`) and decides, for one node at
a time, whether a pod's request for them fits, how good the fit is, and which concrete devices it gets. The engine
(`kubegpu.scheduler.engine`) calls these hooks; the simulator, the custom scheduler and the extender all drive the
same engine, so a plugin is written once for all three.

Each node gets one state object per plugin (`kubegpu_scheduler_build_node`); every later hook receives that state.
Dispatch: kubegpu never broadcasts a hook. The plugin manager calls one plugin's implementation at a time
(`KubegpuPluginManager.call(plugin, hook, ...)`): the registration hook for every plugin, every other hook for the
plugin that owns the resources of the pod (and built the state it is handed) only, so a plugin never sees another
plugin's state and no pluggy ordering (`firstresult`, `tryfirst`, wrappers) applies; the manager refuses wrappers and
ordering markers at registration. Every answer is checked against its hook's contract (`kubegpu.core.answers`): a
wrong answer is reported like an exception, naming the plugin and the hook.

`DeviceScheduler` is the same contract as a `typing.Protocol`, for a plugin written as a class (the kit's
`WholeDevicePlugin` is one) and for type checkers. Hooks are listed in the order the engine calls them, each with its
Kubernetes scheduling-framework extension point; every hook uses the same docstring layout: summary, Args, Returns,
Called by.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import pluggy

from kubegpu.core.models import NodeInfo, Occupancy, PluginAllocation, PodRequest
from kubegpu.core.status import Status

__all__ = [
    "PROJECT",
    "SETTINGS_KEY",
    "DeviceNodeState",
    "DeviceScheduler",
    "FilterRule",
    "Headroom",
    "ProfileSettings",
    "ScoreRule",
    "hookimpl",
    "hookspec",
]

PROJECT = "kubegpu.scheduler"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class DeviceNodeState:
    """Base class of a plugin's private per-node state.

    The engine keeps each state with the plugin that built it and hands it back to that plugin only; it reads neither
    `plugin` nor `node`, which are there for the plugin's own messages and for debugging.
    """

    plugin: str = ""

    def __init__(self, node: str) -> None:
        self.node = node


SETTINGS_KEY = "kubegpu.settings"  # in every plugin's `shared` dict (`kubegpu_scheduler_build_node`)


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What the scheduler's profile sets for the device plugins (its pluginConfig), validated; the engine puts it in
    each plugin's `shared` dict under `SETTINGS_KEY` before it builds a node.

    `share_policy`: how a plugin that shares devices chooses among a node's devices (KubegpuDevices' `sharePolicy`:
    "fgd" or "bestfit"); None: the plugin's own default. `mix`: the pods a fragmentation measure should expect, as
    (devices, thousandths of each device, cpu millicores, weight) (KubegpuFragmentation's `mix`); empty: the plugin
    learns the mix from the pods it places. `model_access`: whether the mix learned keeps the device models each kind
    of pod may use, so that a node's free devices count as lost to the kinds barred from its model
    (KubegpuFragmentation's `modelAccess`, off by default: on the FGD paper's trace family it costs about a point of
    capacity where a fifth of the GPU pods name a model, docs/benchmarks.md).
    """

    share_policy: str | None = None
    mix: tuple[tuple[int, int, int, float], ...] = ()
    model_access: bool = False


@dataclass(frozen=True, slots=True)
class Headroom:
    """What a node can still offer, for the engine's capacity index and its binpack/spread policy.

    `free` maps each owned resource to the largest amount one container could be given now (an upper bound is
    allowed: `fit` decides exactly); `utilization` is the used fraction of the plugin's devices on the node (0..1).
    `unlisted`: owned resources the node need not list in its allocatable, because the plugin's own books count
    them (the kubelet admits a request for an extended resource its node does not list: 1.20's
    `removeMissingExtendedResources`); NodeResourcesFit then leaves them to `fit`, as kube-scheduler leaves an
    extender's `ignoredByScheduler` resources. HAMi's nodes list `nvidia.com/gpu` but not `nvidia.com/gpucores`.
    """

    free: dict[str, int] = field(default_factory=dict)
    utilization: float = 0.0
    unlisted: frozenset[str] = frozenset()


# ---------------------------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_scheduler_resources() -> list[str]:
    """Name the extended resources this plugin schedules.

    Args:
        (none)

    Returns:
        A list of resource names (`aws.amazon.com/neuron`); a name ending in `/*` claims every resource with that
        prefix (`gpu.intel.com/*`). An empty list (or None) means the plugin owns nothing and is never asked about
        pods. A string is refused (it would claim each of its characters).

    Called by:
        the plugin manager once at start-up, to route each requested resource to exactly one plugin; every plugin.
        Kubernetes: none (the scheduler profile's plugin list).
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_qualifiers() -> dict[str, str] | None:
    """Name the resources that qualify another of this plugin's: amounts of each device of it, no device alone.

    Args:
        (none)

    Returns:
        A mapping from each qualifying resource to the resource it qualifies, both owned by this plugin
        (`{"nvidia.com/gpucores": "nvidia.com/gpu"}`: a container asking `gpucores: 30` asks 30 % of each GPU it
        asks, and a container asking `gpucores` alone asks nothing it can be given). Core never makes a container
        hold a qualifier without its device: a classic init container asking more of a qualifier than the app
        containers hold, of devices they hold, holds nothing; it is given its share of the pod's devices, its
        qualifiers' amounts of each lent to it in the allocation's `shares` (`kubegpu.core.manifests`,
        `kubegpu.core.annotations.init_devices`). None or an empty mapping: no resource of the plugin qualifies
        another (every one is a device alone, as `example.com/fpga`). A qualified resource is never itself a
        qualifier.

    Called by:
        the plugin manager once at start-up, after `kubegpu_scheduler_resources`; every plugin. A wrong answer is a
        failure of this plugin's declaration alone: it is recorded and the plugin keeps its resources.
        Kubernetes: none (HAMi's scheduler knows its own share resources).
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Node lifecycle
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_scheduler_build_node(node: NodeInfo, shared: dict[str, object] | None) -> DeviceNodeState | None:
    """Build this plugin's state for one node from its labels, allocatable and advertised inventory.

    Args:
        node: the node; `node.inventories[<plugin>]` is the advertised inventory when an advertiser runs, which
            takes precedence over labels (an unhealthy advertised device is never allocated). An inventory of more
            than `kubegpu.core.limits.MAX_DEVICES_PER_NODE` devices never gets here: the engine refuses the node
            for this plugin.
        shared: a dict the engine keeps for this plugin, the same one for every node of that engine and another
            for every other engine (None from a caller without an engine, e.g. a test): what the plugin learns
            across a cluster (the mix of pods it places) lives here, never in a module global, so two engines in
            one process (a simulator beside a scheduler, two tests) learn apart. It holds the profile's settings
            for device plugins under `SETTINGS_KEY` (a `ProfileSettings`). Optional: take it or leave it out.

    Returns:
        A fresh `DeviceNodeState` (subclass) with every device free, or None when the node has none of this
        plugin's devices. Raise `ValueError` for a node that claims more devices than kubegpu handles, before
        building anything (`kubegpu.core.limits.check_device_count`, `bounded_count` for a count label).

    Called by:
        the engine when a node is added or changes (simulator input, scheduler and extender node watches); every
        plugin. The engine then re-applies the allocations of the pods already on the node with
        `kubegpu_scheduler_take`. A failure here is recorded for the node: pods that need the plugin get the reason
        "plugin NAME failed on node X in kubegpu_scheduler_build_node: ...". Read the node's labels,
        allocatable and inventories; anything else the state reads (an annotation another component writes) must
        be what `kubegpu_scheduler_node_digest` answers, or nodes that differ in it are taken for alike and a change
        to it does not bring back the pods that fit nowhere. Kubernetes: the scheduler cache's NodeInfo update.
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_node_digest(node: NodeInfo) -> Hashable | None:
    """Say what of a node, beyond its labels, allocatable and advertised inventories, this plugin's state reads.

    The engine takes nodes alike in their labels (but the hostname), allocatable, taints and inventories for one
    class: one refusal that does not depend on what is in use settles every node of the class in a cycle, and a
    change to a node wakes the pods that fit nowhere only when it changes one of those. A plugin whose
    `kubegpu_scheduler_build_node` also reads something else of the node (the nvidia plugin reads HAMi's GPU
    registration annotation where GPU Feature Discovery's labels are absent) answers it here, so that nodes that
    differ in it are not one class and a change to it wakes the waiting pods.

    Args:
        node: the node, as `kubegpu_scheduler_build_node` gets it.

    Returns:
        A hashable value, equal for two nodes whenever the plugin would build them alike from it (leave out what the
        state does not read: HAMi's handshake, rewritten every 30 seconds, is read only as stale or not), or None
        when the state reads nothing else of this node. An answer that is not hashable is the plugin's failure:
        logged naming it, and the node is then a class of its own.

    Called by:
        the engine each time a node is added or changes (and once more for its previous version when the cluster
        mirror judges whether the change may help a waiting pod); only the plugins that implement it.
        Kubernetes: none (kube-scheduler's plugins read the Node object itself in each cycle).
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_headroom(state: DeviceNodeState) -> Headroom | None:
    """Summarise what the node can still offer, for the engine's capacity index.

    Args:
        state: this plugin's state of the node.

    Returns:
        A `Headroom`: `free` maps resources this plugin owns to whole numbers >= 0, `utilization` is in [0, 1].
        None is treated as "nothing free".

    Called by:
        the engine after the state is built and after every take or release on it; the owning plugin only. A
        failure is recorded for the node like one of `kubegpu_scheduler_build_node`. Kubernetes: the node's
        allocatable and requested sums (NodeResourcesFit's pre-computation).
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Scheduling cycle: pre-check, prepare, filter, score, reserve
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
        the engine at the start of every scheduling cycle; the plugins owning a resource the pod requests only.
        Kubernetes: PreFilter (its rejection half).
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_prepare(pod: PodRequest) -> object | None:
    """Read the plugin's part of a request once, for every node of the cycle (optional).

    Args:
        pod: the pod, already validated.

    Returns:
        Anything: the plugin's parsed request (container counts, a model, a memory floor). It is handed, unchanged,
        as `prepared` to `kubegpu_scheduler_fit`, `kubegpu_scheduler_score` and `kubegpu_scheduler_allocate` of
        this pod on every node. None is handed on too. It must depend only on what the pod signature covers (the
        pod's containers and their resources, annotations, labels, namespace, priority, selectors), never on its
        name or UID, and must not be changed by the hooks it is handed to.

    Called by:
        the engine once per pod signature, before the filter phase; the plugins owning a resource the pod requests
        only. The engine remembers the answer for pods with an equal signature, replacing any per-pod cache of the
        plugin's own. A caller that calls fit, score or allocate without `prepared` (a test) gets it computed by
        the plugin manager. Kubernetes: PreFilter, writing its result into CycleState.
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_fit(state: DeviceNodeState, pod: PodRequest, prepared: object) -> Status:
    """Decide whether the pod's request for this plugin's resources fits the node now.

    Args:
        state: this plugin's state of the node.
        pod: the pod.
        prepared: the answer of this plugin's `kubegpu_scheduler_prepare` for the pod (None without one).

    Returns:
        A success `Status`, or one that says why not: unresolvable when the node can never take the request (the
        trn1 "does not support requests for device: 7" refusal, a GPU model the node lacks), unschedulable when
        devices in use are in the way. None is a wrong answer.

    The answer must depend only on the state and what the pod signature covers, not on the pod's name or UID: the
    engine reuses it for an equal pod while the node is unchanged, and an unresolvable answer settles every node of
    the same class (equal labels but the hostname, allocatable, taints and inventories) in that cycle.

    Called by:
        the engine's filter phase for candidate nodes (those whose headroom is large enough), after Kubernetes' own
        filters passed; the owning plugin only. Kubernetes: Filter.
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_score(state: DeviceNodeState, pod: PodRequest, prepared: object) -> float | None:
    """Rate how well the request fits the node's topology, from 0 (poor) to 100 (ideal).

    Args:
        state: this plugin's state of a node where `kubegpu_scheduler_fit` succeeded.
        pod: the pod.
        prepared: the answer of this plugin's `kubegpu_scheduler_prepare` for the pod (None without one).

    Returns:
        A finite number in [0, 100] (e.g. 100 when the GPUs form a connected group, lower when the placement would
        break up the largest free valid set). The engine adds its binpack/spread policy score. None counts as 0.

    Called by:
        the engine's score phase for feasible nodes, and the extender's prioritize verb; the owning plugin only.
        Kubernetes: Score (with NormalizeScore done by the engine).
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_fragmentation(
    state: DeviceNodeState, pod: PodRequest, prepared: object, free: Mapping[str, int]
) -> float | None:
    """Measure how much of the node's free devices placing the pod there would leave unusable (optional).

    Args:
        state: this plugin's state of the node.
        pod: the pod: one that asks for this plugin's resources (on a node where `kubegpu_scheduler_fit`
            succeeded), or one that asks for none of them and would take only cpu and memory beside the devices.
        prepared: the answer of this plugin's `kubegpu_scheduler_prepare` for the pod; None for a pod that asks for
            none of the plugin's resources.
        free: what the node has left before the pod, as NodeResourcesFit counts it: `cpu` in millicores and
            `memory` in bytes (allocatable less the requests of the pods on it).

    Returns:
        The growth of the node's stranded devices, in devices (0.5: half a device more could not be used by the
        pods the cluster sees; negative: the placement makes free capacity usable again), a finite number; None
        when the plugin has nothing to say (counts 0). The kit's whole-device plugins and neuron answer the growth of
        the chance that the node turns away the next request of their learned mix, times twice its mean request
        (`kubegpu.core.kit.fragmentation_growth`). The engine scores 50 less 50 per device (0..100) under the
        profile's `KubegpuFragmentation` weight: a pod goes where it strands least, a cpu-only pod off the node
        whose devices its cpu would strand.

    Called by:
        the engine's score phase for feasible nodes that hold a state of this plugin, for every pod; every plugin
        with a state on the node. Kubernetes: Score (with NormalizeScore done by the engine).
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_fragmentation_epoch(shared: dict[str, object]) -> int | None:
    """Say which mix of pods the plugin's fragmentation answers are measured against now (optional).

    Args:
        shared: the dict this plugin's states share across the engine's nodes (`kubegpu_scheduler_build_node`'s).

    Returns:
        A whole number that changes whenever `kubegpu_scheduler_fragmentation` may answer otherwise for a node whose
        state did not change (a mix of pods learned from the pods placed moved on); None when its answers follow
        from the node's state and the pod alone. The engine remembers fragmentation answers per node version, pod
        shape and this number.

    Called by:
        the engine's score phase, once per cycle that ranks nodes (and once per extender prioritize); every plugin
        implementing `kubegpu_scheduler_fragmentation` with a state on a node the pod may be ranked on (beside its
        device plugins' states; any node for a pod without devices). Kubernetes: PreScore.
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_allocate(state: DeviceNodeState, pod: PodRequest, prepared: object) -> PluginAllocation | None:
    """Choose concrete devices for every container of the pod that requests this plugin's resources.

    Args:
        state: this plugin's state of the chosen node; not to be changed here.
        pod: the pod.
        prepared: the answer of this plugin's `kubegpu_scheduler_prepare` for the pod (None without one).

    Returns:
        The `PluginAllocation`, or None when the request no longer fits (the engine then reports the node's fit
        reason). It may name only containers of the pod and resources this plugin owns, device ids as strings;
        `plugin` is the entry-point name (another name is corrected, with a warning). The choice must be a valid
        topology set and must leave the state untouched: the engine reserves it with `kubegpu_scheduler_take`.

    Called by:
        the engine's reserve phase (simulator, custom scheduler, extender's bind verb); the owning plugin only.
        Kubernetes: Reserve (the choosing half).
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_take(
    state: DeviceNodeState, pod_key: str, allocation: PluginAllocation, pod: PodRequest | None
) -> Status:
    """Mark the allocation's devices (or device shares) as held by the pod.

    Args:
        state: this plugin's state of the node.
        pod_key: `namespace/name` of the holder.
        allocation: this plugin's part of the pod's allocation, fresh from `kubegpu_scheduler_allocate` or decoded
            from a bound pod's `kubegpu.io/allocation` annotation at restart.
        pod: the holder's request (its cpu and memory, for a plugin that learns the mix of pods it places). None
            when the take teaches nothing: a what-if the engine undoes (a filter on a node held for a preemptor), a
            pod held before held again (put back after a preemption's search, or on its node's new state), or a
            caller that has only the allocation. Optional: take it or leave it out.

    Returns:
        Success, or an error `Status` naming the device when it is unknown, unhealthy, already held or over its
        share; then nothing is taken. None is a wrong answer.

    Called by:
        the engine's reserve phase and its ledger rebuild; the owning plugin only. Kubernetes: Reserve.
    """
    raise NotImplementedError


@hookspec
def kubegpu_scheduler_release(state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status | None:
    """Return what `kubegpu_scheduler_take` took for the pod; idempotent.

    Args:
        state: this plugin's state of the node.
        pod_key: `namespace/name` of the holder.
        allocation: the allocation that was taken.

    Returns:
        Success (None counts as success), also when the pod holds nothing of it any more (a second release of the
        same allocation changes nothing); an error `Status` only for an allocation the plugin cannot read (the
        engine logs it).

    Called by:
        the engine when a pod is deleted, finishes, is preempted, or its binding is rolled back; the owning plugin
        only. Kubernetes: Unreserve.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Rules beyond devices
# ---------------------------------------------------------------------------------------------------------------


class FilterRule(Protocol):
    """A node filter a plugin adds (`kubegpu_scheduler_rules`): `name` (by which a profile turns it off; letters,
    digits, `-`, `_`, `.`, at most 63) and `filter`, None when the node passes, else a `Status` saying why not:
    unresolvable only when the answer follows from what nodes of one kind share (labels other than the hostname,
    taints, allocatable, readiness), since such an answer is taken for every node alike; else unschedulable."""

    name: str

    def filter(self, node: NodeInfo, pod: PodRequest) -> Status | None: ...


class ScoreRule(Protocol):
    """A score plugin a plugin adds (`kubegpu_scheduler_rules`): `name` (by which a profile weighs it or turns it
    off) and `score`, the node's score for the pod in [0, 100] (None: 0), used as it is and weighed (weight 1 unless
    the profile says otherwise)."""

    name: str

    def score(self, node: NodeInfo, pod: PodRequest) -> float | None: ...


@hookspec
def kubegpu_scheduler_rules() -> list[FilterRule | ScoreRule] | None:
    """Add rules that are not about devices: node filters and score plugins the engine runs for every pod.

    Args:
        (none)

    Returns:
        A list of rule objects, each a `FilterRule` (a `name` and a `filter(node, pod)` method), a `ScoreRule` (a
        `name` and a `score(node, pod)` method) or both. None or an empty list adds nothing. A rule reads only the
        node (`NodeInfo`) and the pod's spec, and must decide from them alone, never from the pod's name or UID:
        its answers are remembered per node and pod shape. A rule named like another rule is left out (an error
        naming it is logged). A rule that raises, or answers what its contract does not allow, refuses the node
        with an error naming the plugin and the rule (a filter) or scores it 0 (a score), logged once.

    Called by:
        the engine when it is built (every front-end); every plugin that implements it, once.
        Kubernetes: Filter and Score (a profile's plugins, enabled, disabled and weighed by name).
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_scheduler_describe(state: DeviceNodeState) -> list[Occupancy] | None:
    """Draw the node's devices and their holders for reports and the monitoring API.

    Args:
        state: this plugin's state of the node.

    Returns:
        A list with one `Occupancy` per device family on the node (layout, cells, free and largest-fit counts), each
        of at most `kubegpu.core.limits.MAX_DEVICES_PER_NODE` devices (more is a wrong answer).

    Called by:
        the simulator's report, `kubegpu top` and the extender's monitoring API; the owning plugin only.
        Kubernetes: none (kubegpu's own reporting).
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# The same contract as a Protocol
# ---------------------------------------------------------------------------------------------------------------


class DeviceScheduler(Protocol):
    """The scheduler-side hooks as a `typing.Protocol`, for a plugin written as a class and for type checkers.

    A plugin object (a module, or an instance whose methods carry `hookimpl`) may implement any subset of the hooks;
    the Protocol lists all of them, so `DeviceScheduler` describes a complete plugin such as the kit's
    `WholeDevicePlugin`.
    """

    def kubegpu_scheduler_resources(self) -> list[str]: ...

    def kubegpu_scheduler_qualifiers(self) -> dict[str, str] | None: ...

    def kubegpu_scheduler_build_node(
        self, node: NodeInfo, shared: dict[str, object] | None
    ) -> DeviceNodeState | None: ...

    def kubegpu_scheduler_node_digest(self, node: NodeInfo) -> Hashable | None: ...

    def kubegpu_scheduler_headroom(self, state: DeviceNodeState) -> Headroom | None: ...

    def kubegpu_scheduler_validate(self, pod: PodRequest) -> Status | None: ...

    def kubegpu_scheduler_prepare(self, pod: PodRequest) -> object | None: ...

    def kubegpu_scheduler_fit(self, state: DeviceNodeState, pod: PodRequest, prepared: object) -> Status: ...

    def kubegpu_scheduler_score(self, state: DeviceNodeState, pod: PodRequest, prepared: object) -> float | None: ...

    def kubegpu_scheduler_fragmentation(
        self, state: DeviceNodeState, pod: PodRequest, prepared: object, free: Mapping[str, int]
    ) -> float | None: ...

    def kubegpu_scheduler_fragmentation_epoch(self, shared: dict[str, object]) -> int | None: ...

    def kubegpu_scheduler_allocate(
        self, state: DeviceNodeState, pod: PodRequest, prepared: object
    ) -> PluginAllocation | None: ...

    def kubegpu_scheduler_take(
        self, state: DeviceNodeState, pod_key: str, allocation: PluginAllocation, pod: PodRequest | None
    ) -> Status: ...

    def kubegpu_scheduler_release(
        self, state: DeviceNodeState, pod_key: str, allocation: PluginAllocation
    ) -> Status | None: ...

    def kubegpu_scheduler_rules(self) -> list[FilterRule | ScoreRule] | None: ...

    def kubegpu_scheduler_describe(self, state: DeviceNodeState) -> list[Occupancy] | None: ...
