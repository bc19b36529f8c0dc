"""The scheduling engine: one cluster state, one scheduling cycle, used unchanged by every front-end.

The simulator, the custom scheduler and the extender are thin adapters around `Engine`. It keeps

* the cluster state: a `NodeRecord` per node (its `NodeInfo`, each plugin's device state, cpu/memory/pod usage) and
  a `PodRecord` per pod that holds resources;
* the ledger: for every placed pod, exactly which plugin allocations it took on which node, so deleting a pod (or
  rolling back a failed bind) returns exactly what was taken;
* a `CapacityIndex` per resource, so a cycle visits only nodes that could offer enough, tightest first for binpack
  and emptiest first for spread;
* what else the front-ends report that scheduling reads: claims and volumes (`set_claim`, `set_volume`), and the
  Services, ReplicationControllers, ReplicaSets and StatefulSets whose selectors give a pod without spread
  constraints the profile's default ones (`set_owner`, `spread_constraints`).

A cycle follows the Kubernetes scheduler framework: pre-check (each owning plugin validates the request), filter
(ready/unschedulable, node selector, taints, cpu/memory/pods and plain extended resources, then each plugin's device
fit), score (the plugins' topology score plus the binpack or spread policy score) over a bounded sample of feasible
nodes, and reserve (each plugin allocates concrete devices, taken atomically: all plugins or none). When no node fits,
the result carries kube-scheduler's summary, `0/5 nodes are available: 3 Insufficient ..., 2 ....`.

The engine knows no HTTP, gRPC or Kubernetes client; it calls plugins only through the plugin manager, and a plugin
that raises becomes a reason naming it, never a crash.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator, KeysView, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any, Literal, NamedTuple

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    AllocationRecord,
    encode_allocation,
    merge_allocations,
    sign_allocation,
    verify_allocation,
)
from kubegpu.core.limits import check_device_count
from kubegpu.core.models import (
    LabelSelector,
    NodeInfo,
    NodeSelectorTerm,
    Occupancy,
    PluginAllocation,
    PodRequest,
    SpreadConstraint,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom
from kubegpu.core.status import Code, Status
from kubegpu.core.text import MAX_TEXT_CHARS, safe_text
from kubegpu.scheduler import filters, podindex, scores
from kubegpu.scheduler.index import CapacityIndex, NodeTree, zone_key
from kubegpu.scheduler.owners import Owners
from kubegpu.scheduler.podindex import Domains, PodIndex
from kubegpu.scheduler.preemption import (
    Budget,
    Candidate,
    Preemption,
    by_importance,
    may_preempt,
    pick,
    split_by_budget,
)

__all__ = ["Decision", "Engine", "NodeRecord", "Placement", "PodRecord", "Policy", "summarize_reasons"]

log = logging.getLogger("kubegpu.engine")

Policy = Literal["binpack", "spread"]
POLICIES: tuple[Policy, ...] = ("binpack", "spread")
BASIC_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})
CPU_MEMORY = frozenset({"cpu", "memory"})
NOMINATED = "node(s) were nominated for a pending pod of equal or higher priority that is preempting pods there"
CPU_INDEX = "cpu"
NAME_LABELS = frozenset({"kubernetes.io/hostname"})
# Pod shapes whose filter answers and node-local scores a node remembers; past it the shape asked about longest ago
# goes. Device pods' shapes include their labels (a plugin may read them), so each Deployment's replicas are a shape.
CHECKS_REMEMBERED = 32


def _make_room(memo: dict[int, Any], slot: int) -> None:
    """Before `memo[slot]` is (re)written: the slot moves to the newest end; a full memo drops its oldest slot."""
    if memo.pop(slot, None) is None and len(memo) >= CHECKS_REMEMBERED:
        del memo[next(iter(memo))]


MAX_CHANGES = 1 << 16  # node changes remembered by `Engine.changed_since`
UNKNOWN_FREE = 1 << 62  # the headroom of a plugin that failed on a node: unknown, so never the reason to skip it
PREPARE_HOOK = "kubegpu_scheduler_prepare"


@dataclass(slots=True)
class NodeRecord:
    info: NodeInfo
    states: dict[str, DeviceNodeState] = field(default_factory=dict)
    headroom: dict[str, Headroom] = field(default_factory=dict)
    used: Counter[str] = field(default_factory=Counter)
    pods: dict[str, None] = field(default_factory=dict)
    ports: Counter[tuple[str, str, int]] = field(default_factory=Counter)  # (host IP, protocol, port) in use
    nominees: dict[str, int] = field(default_factory=dict)  # preempting pods waiting for this node -> priority
    problems: dict[str, str] = field(default_factory=dict)
    klass: int = 0
    version: int = 0  # bumped on every change of the node's usage or devices
    # The cpu and memory of its pods as the scores count them (`scores.nonzero_requests`), kept as pods come and go.
    nonzero_cpu: int = 0
    nonzero_memory: int = 0
    # The node's recent node-local filter answers, by pod shape (`Plan.local`: its id; the shape itself is kept to
    # confirm it): (node version, shape, Kubernetes' node filters (None: they pass), the device fit (None: not asked
    # yet)). A few shapes alternate in a workload, so one slot would thrash.
    last_check: dict[int, tuple[int, tuple[object, ...], Status | None, Status | None]] = field(default_factory=dict)
    last_score: tuple[int, tuple[object, ...], float] | None = None
    last_raw: dict[int, tuple[int, tuple[object, ...], tuple[float, ...]]] = field(default_factory=dict)  # scores

    @property
    def name(self) -> str:
        return self.info.name

    def free(self, resource: str) -> int:
        return self.info.allocatable.get(resource, 0) - self.used[resource]


@dataclass(slots=True)
class PodRecord:
    """A pod that holds resources on a node: its request and the ledger entry of what it took."""

    request: PodRequest
    node: str
    parts: dict[str, PluginAllocation]
    allocation: AllocationRecord | None
    annotations: dict[str, str]
    # Set aside by count for a bound pod without a verified allocation: no container was given these devices, so
    # any verified allocation naming them takes them over (`Engine.hold`).
    by_count: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """What a cycle needs to know about a pod, computed once: for each owning plugin, its resources with the largest
    amount one container asks for, and the requested extended resources no plugin owns with their totals."""

    devices: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]
    unowned: tuple[tuple[str, int], ...]
    # Everything a node's answer may depend on besides the node itself: pods with equal signatures get equal
    # answers from an unchanged node (plugins decide from the pod's spec and annotations, never its name or UID).
    # A pod whose answer depends on other nodes too (`volatile`) has the cluster's generation in its signature.
    signature: tuple[object, ...] = ()
    # What the node-local answers (Kubernetes' node filters, the device fit, the node-local scores) depend on besides
    # the node: the signature without the parts that read other pods; for a pod that asks for no plugin's devices,
    # only what those filters and scores read (so replicas of different apps alike in resources share it).
    local: tuple[object, ...] = ()
    # Every resource the pod requests, with the pod's total, in kube-scheduler's order (NodeResourcesFit).
    fit: tuple[tuple[str, int], ...] = ()
    # The answer depends on pods on other nodes (inter-pod affinity, topology spread, existing anti-affinity).
    volatile: bool = False
    # One unresolvable answer may settle every node of its class (false when the answer depends on the node's name
    # or on other nodes).
    settles: bool = True
    stamp: int = 0  # `Engine._stamp` when the plan was made
    # The pod's topology spread constraints (`Engine.spread_constraints`: its own, or the defaults its owners give
    # it), DoNotSchedule and ScheduleAnyway, and the generation of the owners they were read at.
    hard_spread: tuple[SpreadConstraint, ...] = ()
    soft_spread: tuple[SpreadConstraint, ...] = ()
    owners: int = 0
    # Each owning plugin's `kubegpu_scheduler_prepare` answer (its PluginHookError when it failed), for fit, score
    # and allocate: computed once per pod signature (Kubernetes' PreFilter writing CycleState).
    prepared: dict[str, object] = field(default_factory=dict)


class Settled(NamedTuple):
    """What one node's unresolvable answer says about the other nodes of its class in a cycle: none of them fits.
    `by_node`: the filters that read only the node gave it (`Engine._node_fit`), so it is every one's answer; else
    each may be stopped earlier, or lack more, by what is in use on it (`Engine._refused_like`)."""

    status: Status
    by_node: bool


@dataclass(slots=True)
class Refusals:
    """A cycle's count of refusals, as kube-scheduler counts them when no node fits: each node under its own answer.
    Nodes are counted one by one (`Engine._refuse`), or a class at once after one of its nodes settled it."""

    reasons: Counter[str] = field(default_factory=Counter)
    resolvable: bool = False  # some reason may change as pods leave
    settled: dict[int, Settled] = field(default_factory=dict)
    counted: dict[int, list[str]] = field(default_factory=dict)  # node class -> its nodes counted one by one


@dataclass(slots=True)
class ClassTally:
    """Every node's answer in one node class to one pod shape (`Plan.local`), the class settled by `status`
    (`Engine._refused_like`), with their reasons summed; brought up to date from the engine's change log
    (`Engine.changed_since`) rather than asked again, so a pod that fits nowhere costs what changed since."""

    local: tuple[object, ...]
    status: Status
    generation: int
    answers: dict[str, Status] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)
    resolvable: int = 0  # answers that may change as pods leave

    def forget(self, name: str) -> None:
        old = self.answers.pop(name, None)
        if old is not None:
            self.reasons.subtract(old.reasons)
            self.resolvable -= old.code is not Code.UNRESOLVABLE

    def learn(self, name: str, answer: Status) -> None:
        self.answers[name] = answer
        self.reasons.update(answer.reasons)
        self.resolvable += answer.code is not Code.UNRESOLVABLE


class ClusterState(NamedTuple):
    """One pod's cluster-wide filter state (kube-scheduler's PreFilter for PodTopologySpread and InterPodAffinity)
    at one generation, with the judge of one node's labels made from it."""

    pod: PodRequest
    plan: Plan
    generation: int
    judge: Callable[[Mapping[str, str]], Status | None]
    affinity: filters.AffinityState | None
    spread: filters.SpreadState | None


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one cycle. `annotations` are the pod annotations to write when `scheduled`; `reason` is one
    line of at most `MAX_TEXT_CHARS` characters, control characters escaped (`safe_text`), whatever it quotes."""

    pod: str
    scheduled: bool
    node: str | None = None
    reason: str | None = None
    allocation: AllocationRecord | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    code: Code = Code.SUCCESS

    def __post_init__(self) -> None:
        reason = self.reason
        if reason is not None and (len(reason) > MAX_TEXT_CHARS or not reason.isprintable()):
            object.__setattr__(self, "reason", safe_text(reason))


@dataclass(frozen=True, slots=True)
class Placement:
    """A pod that holds resources, as a front-end sees it (`Engine.placement`): its request, its node, and the
    allocation it took (None: bound without a verified one, or it asks for no plugin's devices)."""

    request: PodRequest
    node: str
    allocation: AllocationRecord | None


def _fit_order(pod: PodRequest) -> tuple[tuple[str, int], ...]:
    """Every resource the pod requests with its amount, cpu, memory and ephemeral storage first (kube-scheduler's
    order of NodeResourcesFit reasons)."""
    fit = [("cpu", pod.cpu_milli), ("memory", pod.memory)]
    requests = pod.requests
    if "ephemeral-storage" in requests:
        fit.append(("ephemeral-storage", requests["ephemeral-storage"]))
    fit.extend(sorted((r, a) for r, a in requests.items() if r not in BASIC_RESOURCES))
    return tuple((r, a) for r, a in fit if a > 0)


def summarize_reasons(total: int, reasons: Counter[str]) -> str:
    """kube-scheduler's wording: `0/5 nodes are available: 3 Insufficient cpu, 2 node(s) were unschedulable.`"""
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    if not parts:
        return f"0/{total} nodes are available."
    return f"0/{total} nodes are available: {', '.join(parts)}."


class Engine:
    """The cluster state and the scheduling cycle."""

    def __init__(
        self,
        plugins: KubegpuPluginManager,
        *,
        policy: Policy = "binpack",
        sample: int = 8,
        signing_key: bytes | None = None,
        scoring: scores.Profile | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.plugins = plugins
        self.policy: Policy = policy
        self.sample = max(1, sample)
        # The score plugins and their weights, the filters turned off (`kubegpu.scheduler.scores`).
        self.scoring = scoring if scoring is not None else scores.Profile.default(policy)
        self.filters_off = self.scoring.filters_off
        # The placed pods by namespace and labels, and their inter-pod terms by distinct term (replicas share theirs):
        # a cycle's affinity and spread counts visit only the pods a term can select (`kubegpu.scheduler.podindex`).
        self._placed = PodIndex()
        # The nodes whose pods count for a spread constraint, per (topology keys, node selector, node affinity), as of
        # `_node_epoch` (bumped whenever a node is added, changed or removed).
        self._domains: dict[tuple[object, ...], tuple[int, Domains]] = {}
        self._node_epoch = 0
        self._soft_tainted: set[str] = set()  # nodes with a PreferNoSchedule taint
        # What ImageLocality and NodePreferAvoidPods read beyond one node (`_note_scored`): how many nodes list each
        # image name, and how many list it at each size (each node scores its own size, so an image every node lists
        # still tells them apart when the sizes differ: `_images_matter`); the controllers each node's
        # preferAvoidPods names, and on how many nodes each is named.
        self._image_nodes: Counter[str] = Counter()
        self._image_sizes: dict[str, Counter[int]] = {}
        self._avoid: dict[str, frozenset[tuple[str, str]]] = {}
        self._avoided: Counter[tuple[str, str]] = Counter()
        self.signing_key = signing_key
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        self._index: dict[str, CapacityIndex] = {CPU_INDEX: CapacityIndex()}
        self._routes: dict[frozenset[str], dict[str, list[str]]] = {}
        self._classes: dict[tuple[object, ...], int] = {}
        self._class_nodes: dict[int, dict[str, None]] = {}  # node class -> its nodes
        # The nodes zone by zone in turn, and where the next sample taken from them starts (kube-scheduler's node tree
        # and `nextStartNodeIndex`): a pod whose scores read more than its node is scored on such a sample.
        self._tree = NodeTree()
        self._next_start = 0
        # (node class, id(Plan.local)) -> every node's answer in a class settled by an unresolvable answer its nodes
        # may give apart (`_tally`); kept current from the change log, dropped all at once past 256.
        self._tallies: dict[tuple[int, int], ClassTally] = {}
        # Every change of a node's state is numbered; `changed_since` names the nodes changed after a number, so a
        # caller can keep answers per node and redo only the nodes that changed (the extender does).
        self.generation = 0
        self._changes: list[str] = []  # the most recent changes: _changes[i] is change number _first + i + 1
        self._first = 0
        self._signatures: dict[tuple[object, ...], tuple[object, ...]] = {}
        self._plans: dict[int, tuple[PodRequest, Plan]] = {}  # by id(pod), holding the pod so the id stays its own
        self._prepared: dict[tuple[object, ...], dict[str, object]] = {}  # by pod signature (without volatile parts)
        self._issued = 0  # the `issued` stamp of the last signed allocation: stamps strictly increase
        # Bumped whenever a placed pod with required anti-affinity terms (which can refuse an incoming pod on nodes
        # other than its own) comes or goes: plans made before are made again.
        self._anti_epoch = 0
        self._cluster: ClusterState | None = None
        # The Services, ReplicationControllers, ReplicaSets and StatefulSets a front-end reports (`set_owner`): a
        # pod with no spread constraints of its own gets the profile's default ones, selecting what they select.
        self._owners = Owners()
        self._defaulted: dict[LabelSelector, tuple[SpreadConstraint, ...]] = {}
        # Volumes, when a front-end supplies them (`track_volumes`): claim (namespace, name) -> bound volume name
        # ("" while unbound), volume name -> its required node affinity terms (None: any node).
        self.track_volumes = False
        self.claims: dict[tuple[str, str], str] = {}
        self.deleting_claims: set[tuple[str, str]] = set()  # claims with a deletionTimestamp
        self.volumes: dict[str, tuple[NodeSelectorTerm, ...] | None] = {}
        self._volume_epoch = 0
        self._priorities: Counter[int] = Counter()  # priorities of the placed pods, for preemption's quick no
        self.nominated: dict[str, str] = {}  # preempting pod -> the node its victims are leaving
        # What the node side reports (`set_node_live`, `set_held_devices`): the nodes whose kubegpu node lease expired,
        # with the reason device pods are refused there; per node, the ids its kubelet gave pods kubegpu did not place.
        self._dead: dict[str, str] = {}
        self._published: dict[str, dict[str, dict[str, dict[str, list[str]]]]] = {}

    # -- nodes ---------------------------------------------------------------------------------------------------

    def add_node(self, info: NodeInfo) -> None:
        """Add a node, or replace it (a changed Node), keeping the pods placed on it."""
        previous = self.nodes.get(info.name)
        record = NodeRecord(info, klass=self._klass(info))
        self._node_epoch += 1
        for plugin in self.plugins.names:
            inventory = info.inventories.get(plugin)
            try:
                # Refused here, for every plugin, before it builds per-device structures (`kubegpu.core.limits`).
                check_device_count(
                    info.name, f"advertised {plugin} devices", len(inventory.devices if inventory else ())
                )
            except ValueError as exc:
                log.error("%s", exc)
                record.problems[plugin] = str(exc)
                continue
            try:
                state = self.plugins.call(plugin, "kubegpu_scheduler_build_node", node=info)
            except PluginHookError as exc:
                problem = exc.on_node(info.name)
                log.error("%s", problem)
                record.problems[plugin] = str(problem)
                continue
            if state is not None:
                record.states[plugin] = state
        self.nodes[info.name] = record
        self._tree.set(info.name, zone_key(info.labels))
        self._join_class(info.name, previous.klass if previous is not None else None, record.klass)
        if any(t.effect == "PreferNoSchedule" for t in info.taints):
            self._soft_tainted.add(info.name)
        else:
            self._soft_tainted.discard(info.name)
        self._note_scored(info, previous.info if previous is not None else None)
        if previous is not None:
            for key in list(previous.pods):
                pod = self.pods[key]
                self._forget_anti(key)  # its charges went with the old record; taken again below if it still fits
                status = self._take(record, pod.request, pod.parts)
                if not status.ok:
                    log.error("node %s changed: pod %s no longer fits its devices: %s", info.name, key, status.message)
                    self.pods.pop(key)
                else:
                    record.pods[key] = None
                    self._charge(record, pod.request, +1)
        self._refresh(record)

    def _note_scored(self, info: NodeInfo | None, previous: NodeInfo | None) -> None:
        """Count a node's images and the controllers its `preferAvoidPods` annotation names, in place of what its
        `previous` self counted (None: a new node; `info` None: a removed one). An annotation kubegpu cannot read
        counts as absent, with one warning per value."""
        if previous is not None:
            for image, size in previous.images.items():
                self._image_nodes[image] -= 1
                if self._image_nodes[image] <= 0:
                    del self._image_nodes[image]
                    self._image_sizes.pop(image, None)
                else:
                    sizes = self._image_sizes[image]
                    sizes[size] -= 1
                    if sizes[size] <= 0:
                        del sizes[size]
            before = self._avoid.pop(previous.name, frozenset())
            self._avoided.subtract(before)
            for key in before:
                if self._avoided[key] <= 0:
                    del self._avoided[key]
        if info is None:
            return
        for image, size in info.images.items():
            self._image_nodes[image] += 1
            self._image_sizes.setdefault(image, Counter())[size] += 1
        raw = info.annotations.get(scores.PREFER_AVOID_KEY)
        if raw is None:
            return
        if previous is not None and previous.annotations.get(scores.PREFER_AVOID_KEY) == raw:
            avoided = before  # unchanged: read once (and warned about once)
        else:
            try:
                avoided = scores.avoided_controllers(raw)
            except ValueError as exc:
                log.warning("node %s: annotation %s ignored: %s", info.name, scores.PREFER_AVOID_KEY, exc)
                return
        if avoided:
            self._avoid[info.name] = avoided
            self._avoided.update(avoided)

    def _klass(self, info: NodeInfo) -> int:
        """The node's equivalence class. Nodes alike in everything but their name give the same answer to a request
        whenever the answer does not depend on what is in use, so one unresolvable answer in a cycle settles the
        whole class (a trn1 refusing 7 devices refuses them on every trn1)."""
        key = (
            tuple(sorted((k, v) for k, v in info.labels.items() if k not in NAME_LABELS)),
            tuple(sorted(info.allocatable.items())),
            info.taints,
            info.unschedulable,
            info.ready,
            tuple(sorted((p, inv.model_dump_json()) for p, inv in info.inventories.items())),
            info.name if info.name in self._dead else None,  # a node that is not live answers unlike its class
        )
        return self._classes.setdefault(key, len(self._classes))

    def _join_class(self, name: str, old: int | None, new: int | None) -> None:
        if old is not None and old != new:
            members = self._class_nodes.get(old)
            if members is not None:
                members.pop(name, None)
                if not members:
                    del self._class_nodes[old]
        if new is not None:
            self._class_nodes.setdefault(new, {})[name] = None

    def remove_node(self, name: str) -> list[str]:
        """Remove a node; the pods it held are forgotten (their devices went with it). Returns their keys."""
        record = self.nodes.pop(name, None)
        self._dead.pop(name, None)
        self._published.pop(name, None)
        if record is None:
            return []
        self._node_epoch += 1
        self._soft_tainted.discard(name)
        self._note_scored(None, record.info)
        self._join_class(name, record.klass, None)
        self._tree.discard(name)
        self._changed(name)
        for index in self._index.values():
            index.discard(name)
        gone = list(record.pods)
        for key in gone:
            self.pods.pop(key, None)
            self._forget_anti(key)
        return gone

    def _forget_anti(self, key: str) -> None:
        """A pod that held resources is gone without being charged back (its node went, or changed under it): it
        leaves the index of placed pods and the count of placed priorities."""
        held = self._placed.pods.get(key)
        self._placed.discard(key)
        if held is not None:
            self._priorities[held.priority] -= 1
            if held.pod_anti_affinity:
                self._anti_epoch += 1

    def _changed(self, name: str) -> None:
        self.generation += 1
        self._changes.append(name)
        if len(self._changes) > MAX_CHANGES:
            drop = len(self._changes) // 2
            del self._changes[:drop]
            self._first += drop

    def changed_since(self, generation: int) -> set[str] | None:
        """The nodes changed (added, removed, used or freed) after change number `generation`, or None when that is
        too long ago to tell."""
        if generation < self._first:
            return None
        return set(self._changes[generation - self._first :])

    def _refresh(self, record: NodeRecord) -> None:
        """Recompute the node's headroom after a change and move it in the capacity indexes."""
        self._changed(record.name)
        record.version += 1
        name = record.name
        self._index[CPU_INDEX].set(name, record.free("cpu"), record.klass)
        for plugin in record.problems.keys() - record.states.keys():  # build_node failed
            for resource in self._unknown_headroom(record, plugin).free:
                self._index.setdefault(resource, CapacityIndex()).set(name, UNKNOWN_FREE, record.klass)
        for plugin, state in record.states.items():
            try:
                headroom = self.plugins.call(plugin, "kubegpu_scheduler_headroom", state=state) or Headroom()
                record.problems.pop(plugin, None)
            except PluginHookError as exc:
                problem = exc.on_node(name)
                log.error("%s", problem)
                record.problems[plugin] = str(problem)
                headroom = self._unknown_headroom(record, plugin)
            old = record.headroom.get(plugin)
            record.headroom[plugin] = headroom
            if old is not None:
                for resource in old.free.keys() - headroom.free.keys():
                    self._index[resource].discard(name)
            for resource, free in headroom.free.items():
                index = self._index.get(resource)
                if index is None:
                    index = self._index[resource] = CapacityIndex()
                index.set(name, free, record.klass)

    def _unknown_headroom(self, record: NodeRecord, plugin: str) -> Headroom:
        """Headroom for a plugin that failed on the node: every resource it could own there looks free, so the
        node stays a candidate and its pods are told the failure (`_device_fit`) rather than `Insufficient ...`."""
        claimed = self.plugins.records[plugin].resources if plugin in self.plugins.records else []
        resources = {r for r in claimed if not r.endswith("/*")}
        resources.update(r for r in record.info.allocatable if self.plugins.owner_of(r) == plugin)
        return Headroom(free=dict.fromkeys(sorted(resources), UNKNOWN_FREE))

    # -- pods ----------------------------------------------------------------------------------------------------

    def _route(self, pod: PodRequest) -> dict[str, list[str]]:
        """Group the pod's requested extended resources by owning plugin (`""` for resources no plugin owns)."""
        requested = frozenset(pod.requested_resources() - BASIC_RESOURCES)
        routes = self._routes.get(requested)
        if routes is None:
            routes = {}
            for resource in sorted(requested):
                owner = self.plugins.owner_of(resource) or ""
                routes.setdefault(owner, []).append(resource)
            self._routes[requested] = routes
        return routes

    def _validate(self, pod: PodRequest, routes: dict[str, list[str]]) -> Status:
        for plugin in routes:
            if not plugin:
                continue
            try:
                status: Status | None = self.plugins.call(plugin, "kubegpu_scheduler_validate", pod=pod)
            except PluginHookError as exc:
                return Status.error(str(exc), plugin=plugin)
            if status is not None and not status.ok:
                return status
        unowned = routes.get("")
        if unowned and self.plugins.failures:
            known = any(unowned[0] in r.info.allocatable for r in self.nodes.values())
            if not known:
                broken = ", ".join(sorted({f.name for f in self.plugins.failures}))
                return Status.unresolvable(
                    f"no plugin schedules {unowned[0]}; plugin(s) {broken} failed to load (see `kubegpu plugins list`)"
                )
        return Status.success()

    def plan(self, pod: PodRequest) -> Plan:
        """The pod's requests grouped for the filter phase. Remembered for the last pods asked about: the extender
        asks for the same pod's plan in filter, prioritize and bind. A plan whose answers depend on other nodes is
        made again after every change; any other after a change of the placed pods' anti-affinity terms; a pod's that
        names claims after a change of the claims or volumes too."""
        known = self._plans.get(id(pod))
        if known is not None and known[0] is pod:
            plan = known[1]
            if plan.stamp == self._stamp(plan.volatile, pod) and plan.owners == self._owners.epoch:
                return plan
        plan = self._plan(pod)
        if len(self._plans) >= 256:
            self._plans.clear()
        self._plans[id(pod)] = (pod, plan)
        return plan

    def _stamp(self, volatile: bool, pod: PodRequest) -> int:
        """What a plan is made again after: the generation (volatile) or the anti-affinity epoch, plus the volume
        epoch for a pod naming claims (the counters only grow, so the sum moves whenever one of them does)."""
        stamp = self.generation if volatile else self._anti_epoch
        return stamp + self._volume_epoch if pod.claims else stamp

    def _plan(self, pod: PodRequest) -> Plan:
        routes = self._route(pod)
        devices = tuple(
            (plugin, tuple((r, max(c.resources.get(r, 0) for c in pod.containers)) for r in resources))
            for plugin, resources in routes.items()
            if plugin
        )
        spread = self.spread_constraints(pod)
        hard = soft = spread  # () for most pods: no constraint of their own, no owner
        if spread:
            hard = tuple(c for c in spread if c.when_unsatisfiable == "DoNotSchedule")
            soft = tuple(c for c in spread if c.when_unsatisfiable == "ScheduleAnyway")
        volatile = bool(pod.pod_affinity or pod.pod_anti_affinity or hard)
        if not volatile and self._placed.anti:
            volatile = any(filters.pod_matches_term(term, pod) for term in self._placed.anti)
        signature: tuple[object, ...] = (
            tuple((c.name, tuple(sorted(c.resources.items()))) for c in pod.containers),
            pod.cpu_milli,
            pod.memory,
            tuple(sorted(pod.node_selector.items())),
            tuple((t.key, t.operator, t.value, t.effect) for t in pod.tolerations),
            tuple(sorted(pod.annotations.items())),
            tuple(sorted(pod.requests.items())),
            pod.node_affinity,
            pod.host_ports,
            pod.namespace,
            tuple(sorted(pod.labels.items())),
            pod.priority,
            pod.preferred_node_affinity,
        )
        prepared = self._prepare(pod, routes, signature)
        if pod.claims:
            signature += (pod.namespace, pod.claims, self._volume_epoch)
        local = signature
        if not devices:
            local = (
                _fit_order(pod),
                scores.nonzero_requests(pod),
                tuple((t.key, t.operator, t.value, t.effect) for t in pod.tolerations),
                tuple(sorted(pod.node_selector.items())),
                pod.node_affinity,
                pod.host_ports,
                pod.preferred_node_affinity,
                *((pod.namespace, pod.claims, self._volume_epoch) if pod.claims else ()),
            )
        local = self._signatures.setdefault(local, local)
        if volatile:
            signature += (
                self.generation,
                pod.namespace,
                tuple(sorted(pod.labels.items())),
                pod.pod_affinity,
                pod.pod_anti_affinity,
                spread,
            )
        # Interned, so that comparing a node's remembered signature with this one is mostly an identity check.
        signature = self._signatures.setdefault(signature, signature)
        if len(self._signatures) > 4096:
            self._signatures.clear()
        by_name = any(key in NAME_LABELS for key in pod.node_selector) or any(
            term.fields or any(r.key in NAME_LABELS for r in term.expressions) for term in pod.node_affinity or ()
        )
        return Plan(
            devices,
            tuple((r, pod.total(r)) for r in routes.get("", ())),
            signature,
            local,
            fit=_fit_order(pod),
            volatile=volatile,
            settles=not (volatile or by_name or pod.claims),
            stamp=self._stamp(volatile, pod),
            prepared=prepared,
            hard_spread=hard,
            soft_spread=soft,
            owners=self._owners.epoch,
        )

    def _prepare(self, pod: PodRequest, routes: dict[str, list[str]], key: tuple[object, ...]) -> dict[str, object]:
        """Each owning plugin's prepared request, remembered per pod signature (`key`)."""
        plugins = [p for p in routes if p and self.plugins.implements(p, PREPARE_HOOK)]
        if not plugins:
            return {}
        known = self._prepared.get(key)
        if known is not None:
            return known
        prepared: dict[str, object] = {}
        for plugin in plugins:
            try:
                prepared[plugin] = self.plugins.call(plugin, PREPARE_HOOK, pod=pod)
            except PluginHookError as exc:
                log.error("%s", exc)
                prepared[plugin] = exc
        if len(self._prepared) >= 4096:
            self._prepared.clear()
        self._prepared[key] = prepared
        return prepared

    def _basic_fit(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        """Kubernetes' node-local filters in kube-scheduler 1.20's order (NodeUnschedulable, TaintToleration,
        NodeAffinity, NodePorts, NodeResourcesFit, VolumeBinding; `kubegpu.scheduler.filters`); the first that refuses
        answers, so each node is counted under the reason kube-scheduler would give. Reasons about the node itself
        are unresolvable; capacity and ports are unschedulable."""
        return self._node_fit(record, pod) or self._usage_fit(record, pod, plan)

    def _node_fit(self, record: NodeRecord, pod: PodRequest) -> Status | None:
        """The filters that read only the node, not what is in use on it: NodeUnschedulable, the Ready condition,
        TaintToleration and NodeAffinity. They run first, so a refusal of theirs is every node of the class's."""
        info = record.info
        off = self.filters_off  # filters a configuration turned off (usually none)
        if (
            info.unschedulable
            and not filters.tolerates_unschedulable(pod.tolerations)
            and "NodeUnschedulable" not in off
        ):
            return Status.unresolvable(filters.UNSCHEDULABLE)
        if not info.ready:
            return Status.unresolvable("node(s) had condition Ready=False")
        for taint in info.taints:
            if taint.effect == "PreferNoSchedule" or "TaintToleration" in off:
                continue
            if not any(t.tolerates(taint) for t in pod.tolerations):
                return Status.unresolvable(
                    f"node(s) had taint {{{taint.key}: {taint.value or ''}}}, that the pod didn't tolerate"
                )
        if (
            (pod.node_selector or pod.node_affinity is not None)
            and not filters.matches_node_affinity(pod, info.name, info.labels)
            and "NodeAffinity" not in off
        ):
            return Status.unresolvable(filters.NODE_SELECTOR)
        return None

    def _usage_fit(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        """The filters after `_node_fit` that read what is in use on the node: NodePorts, NodeResourcesFit (every
        resource it lacks) and VolumeBinding."""
        info = record.info
        off = self.filters_off
        if pod.host_ports and filters.ports_conflict(pod.host_ports, record.ports) and "NodePorts" not in off:
            return Status.unschedulable(filters.PORTS)
        allocatable, used = info.allocatable, record.used
        short: list[str] = []
        hopeless = False
        if allocatable.get("pods", 0) - used["pods"] < 1:
            short.append(filters.TOO_MANY_PODS)
        for resource, need in plan.fit:
            have = allocatable.get(resource, 0)
            if have - used[resource] < need:
                short.append(f"Insufficient {resource}")
                hopeless = hopeless or have < need
        if short and "NodeResourcesFit" not in off:
            return Status.unresolvable(*short) if hopeless and len(short) == 1 else Status.unschedulable(*short)
        if pod.claims and self.track_volumes and "VolumeBinding" not in off:
            return self._volume_fit(info, pod)
        return None

    def _volume_fit(self, info: NodeInfo, pod: PodRequest) -> Status | None:
        """VolumeBinding for claims already bound: the volume's node affinity must select the node. Claims that
        still need a volume are refused: kubegpu does not bind volumes. A claim missing or being deleted is named
        first, bound or not, as kube-scheduler 1.20's PreFilter names it (`podHasPVCs`)."""
        for claim in pod.claims:
            key = (pod.namespace, claim)
            if key not in self.claims:
                return Status.unresolvable(f'persistentvolumeclaim "{claim}" not found')
            if key in self.deleting_claims:
                return Status.unresolvable(f'persistentvolumeclaim "{claim}" is being deleted')
        for claim in pod.claims:
            volume = self.claims[(pod.namespace, claim)]
            if not volume:
                return Status.unresolvable(
                    f"pod has unbound immediate PersistentVolumeClaims (claim {claim!r} has no volume yet; kubegpu "
                    "places pods only with claims already bound to a volume)"
                )
            if volume not in self.volumes:
                return Status.unresolvable(filters.PV_NOT_EXIST)
            terms = self.volumes[volume]
            if terms is not None and not filters.node_matches_terms(terms, info.name, info.labels):
                return Status.unresolvable(filters.VOLUME_NODE_AFFINITY)
        return None

    def set_claim(self, namespace: str, name: str, volume: str | None, deleting: bool = False) -> bool:
        """A PersistentVolumeClaim added or changed (`volume`: the bound volume's name, "" while unbound; `deleting`:
        it has a deletionTimestamp), or deleted (None). Pods naming claims are judged by them once `track_volumes`
        is set. Returns whether the record changed (the answers of pods naming claims are then made again)."""
        key = (namespace, name)
        deleting = deleting and volume is not None
        if self.claims.get(key) == volume and (key in self.deleting_claims) == deleting:
            return False
        if volume is None:
            del self.claims[key]
        else:
            self.claims[key] = volume
        if deleting:
            self.deleting_claims.add(key)
        else:
            self.deleting_claims.discard(key)
        self._volume_epoch += 1
        return True

    def set_volume(self, name: str, terms: tuple[NodeSelectorTerm, ...] | None, *, deleted: bool = False) -> bool:
        """A PersistentVolume added or changed, with its required node affinity terms (None: any node), or deleted.
        Returns whether the record changed."""
        if deleted:
            if name not in self.volumes:
                return False
            del self.volumes[name]
        elif name in self.volumes and self.volumes[name] == terms:
            return False
        else:
            self.volumes[name] = terms
        self._volume_epoch += 1
        return True

    def claim_keys(self) -> list[tuple[str, str]]:
        """The claims the engine knows, as (namespace, name) (`set_claim`)."""
        return list(self.claims)

    def volume_names(self) -> list[str]:
        """The volumes the engine knows (`set_volume`)."""
        return list(self.volumes)

    def set_owner(self, kind: str, namespace: str, name: str, selector: LabelSelector | None) -> bool:
        """A Service, ReplicationController, ReplicaSet or StatefulSet added or changed, with its `spec.selector`
        (None or empty: it selects no pod), or deleted (None). The pods it selects that set no spread constraints of
        their own get the profile's default ones with its selector (`kubegpu.scheduler.owners`). Returns whether
        anything changed."""
        changed = self._owners.set(kind, namespace, name, selector)
        if changed:
            self._defaulted.clear()
        return changed

    def owner_keys(self) -> list[tuple[str, str, str]]:
        """(kind, namespace, name) of the owners the engine knows (`set_owner`) that select some pod."""
        return self._owners.keys()

    def spreads_by_owners(self) -> bool:
        """Whether the profile gives pods without spread constraints default ones (`spread_constraints`), so that a
        front-end should report the owners that select pods (`set_owner`); kube-scheduler watches them only then."""
        return bool(self.scoring.default_spread)

    def spread_constraints(self, pod: PodRequest) -> tuple[SpreadConstraint, ...]:
        """The topology spread constraints the pod is scheduled by: its own; else the profile's default constraints
        (`scores.Profile.default_spread`) with the combined selector of its owners (`set_owner`), as kube-scheduler
        1.20 builds them; none when no owner selects it."""
        if pod.spread or not self._owners:
            return pod.spread
        defaults = self.scoring.default_spread
        if not defaults:
            return ()
        selector = self._owners.selector_for(pod.namespace, pod.labels)
        if selector is None:
            return ()
        constraints = self._defaulted.get(selector)
        if constraints is None:
            constraints = tuple(replace(c, selector=selector) for c in defaults)
            if len(self._defaulted) >= 256:
                self._defaulted.clear()
            self._defaulted[selector] = constraints
        return constraints

    def _cluster_state(self, pod: PodRequest, plan: Plan) -> ClusterState:
        """The pod's PreFilter state for both filters, remembered for the generation, and the judge of one node's
        labels made from it: called for every node a cycle visits, so the filters switched off, and the states that
        cannot refuse any node, are settled here once, and each refusal is a status made once."""
        cached = self._cluster
        if cached is not None and cached.pod is pod and cached.plan is plan and cached.generation == self.generation:
            return cached
        affinity = podindex.affinity_state(pod, self._placed, self._labels)
        spread: filters.SpreadState | None = None
        constraints = plan.hard_spread
        if constraints and "PodTopologySpread" not in self.filters_off:
            spread = podindex.spread_state(pod, self._placed, self._spread_domains(pod, constraints), constraints)
        judged = affinity
        if "InterPodAffinity" in self.filters_off or not filters.affinity_can_refuse(pod, affinity):
            judged = None
        refusals: dict[tuple[str, ...], Status] = {}

        def refusal(reasons: tuple[str, ...], resolvable: bool) -> Status:
            status = refusals.get(reasons)
            if status is None:
                status = refusals[reasons] = Status(Code.UNSCHEDULABLE if resolvable else Code.UNRESOLVABLE, reasons)
            return status

        spread_fits = filters.spread_judge(spread) if spread is not None else None

        def judge(labels: Mapping[str, str]) -> Status | None:
            if spread_fits is not None:
                refused = spread_fits(labels)
                if refused is not None:
                    return refusal((refused[0],), refused[1])
            if judged is not None:
                reasons = filters.affinity_fits(pod, judged, labels)
                if reasons:
                    return refusal(reasons, reasons[1] != filters.AFFINITY_RULES)
            return None

        self._cluster = state = ClusterState(pod, plan, self.generation, judge, affinity, spread)
        return state

    def _labels(self, name: str) -> Mapping[str, str] | None:
        record = self.nodes.get(name)
        return record.info.labels if record is not None else None

    def _spread_domains(self, pod: PodRequest, constraints: Iterable[SpreadConstraint]) -> Domains:
        """The nodes whose pods count for the pod's spread constraints (`podindex.Domains`), remembered until a node
        is added, changed or removed."""
        keys = tuple(c.topology_key for c in constraints)
        slot = (keys, tuple(sorted(pod.node_selector.items())), pod.node_affinity)
        known = self._domains.get(slot)
        if known is not None and known[0] == self._node_epoch:
            return known[1]
        domains = Domains.of(pod, keys, ((r.name, r.info.labels) for r in self.nodes.values()))
        if len(self._domains) >= 256:
            self._domains.clear()
        self._domains[slot] = (self._node_epoch, domains)
        return domains

    def _device_fit(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status:
        for plugin, needs in plan.devices:
            problem = record.problems.get(plugin)
            if problem:
                return Status.error(problem, plugin=plugin)
            state = record.states.get(plugin)
            if state is None:
                return Status.unresolvable(f"Insufficient {needs[0][0]}", plugin=plugin)
            prepared = plan.prepared.get(plugin)
            if isinstance(prepared, PluginHookError):
                return Status.error(str(prepared), plugin=plugin)
            free = record.headroom[plugin].free
            short = next((r for r, need in needs if free.get(r, 0) < need), None)
            try:
                status: Status = self.plugins.call(
                    plugin, "kubegpu_scheduler_fit", state=state, pod=pod, prepared=prepared
                )
            except PluginHookError as exc:
                return Status.error(str(exc), plugin=plugin)
            if not status.ok:
                # The plugin's own reason: on a ring with enough free devices but no contiguous window it names
                # contiguity, where the headroom (the largest valid set) would only say "Insufficient".
                return status
            if short is not None:
                return Status.unschedulable(f"Insufficient {short}", plugin=plugin)
        return Status.success()

    def check(
        self,
        record: NodeRecord,
        pod: PodRequest,
        plan: Plan,
        *,
        placing: bool = True,
        judge: Callable[[Mapping[str, str]], Status | None] | None = None,
    ) -> Status:
        """The whole filter phase for one node: Kubernetes' own filters, then each plugin's device fit.

        The node remembers its last node-local answers (`Plan.local`); an unchanged node asked about a pod alike in
        what they read (the next replica of a workload, the extender's prioritize after its filter) answers from
        memory, and only the filters that read other pods run again. A node that is not live (`set_node_live`)
        refuses device pods unless `placing` is false (counting a pod its kubelet already runs).
        """
        if record.nominees and any(p >= pod.priority and k != pod.key for k, p in record.nominees.items()):
            return Status.unschedulable(NOMINATED)
        if self._dead and plan.devices and placing and (dead := self._dead.get(record.name)) is not None:
            return Status.unresolvable(dead)
        memo = record.last_check
        remembered = memo.get(id(plan.local))
        if remembered is None or remembered[0] != record.version or remembered[1] is not plan.local:
            _make_room(memo, id(plan.local))
            remembered = memo[id(plan.local)] = (record.version, plan.local, self._basic_fit(record, pod, plan), None)
        status = remembered[2]
        if status is None and plan.volatile:
            # `judge`: the cluster-wide filters' judge for this pod, when the caller took it for a pass over nodes.
            status = (judge or self._cluster_state(pod, plan).judge)(record.info.labels)
        if status is None:
            status = remembered[3]
            if status is None:
                status = self._device_fit(record, pod, plan)
                memo[id(plan.local)] = (remembered[0], remembered[1], None, status)
        if not plan.settles and status.code is Code.UNRESOLVABLE:
            # The answer depends on the node's name or on other nodes: nodes of one class may answer differently,
            # so it must not settle the class (here or in the extender's answers).
            status = Status(Code.UNSCHEDULABLE, status.reasons, status.plugin)
        return status

    def filter_node(self, name: str, pod: PodRequest) -> Status:
        """Run the filter phase for one node."""
        record = self.nodes.get(name)
        if record is None:
            return Status.unresolvable("node(s) unknown to kubegpu")
        return self.check(record, pod, self.plan(pod))

    def filter_nodes(self, pod: PodRequest, names: Iterable[str], plan: Plan | None = None) -> dict[str, Status]:
        """Run the filter phase on each named node (all known to the engine), for a front-end handed its candidates
        (the extender's filter and prioritize). As in `schedule`, one unresolvable answer settles every node of its
        class (a trn1 refusing 7 devices refuses them all) without running every filter on the others."""
        plan = plan or self.plan(pod)
        settled: dict[int, Settled] = {}
        statuses: dict[str, Status] = {}
        for name in names:
            record = self.nodes[name]
            known = settled.get(record.klass)
            if known is not None:
                statuses[name] = (
                    known.status if known.by_node else self._tally(record.klass, pod, plan, known.status).answers[name]
                )
                continue
            status = statuses[name] = self.check(record, pod, plan)
            if status.code is Code.UNRESOLVABLE and plan.settles:
                settled[record.klass] = Settled(status, self._node_fit(record, pod) is not None)
        return statuses

    def _refuse(self, refusals: Refusals, record: NodeRecord, pod: PodRequest, plan: Plan, status: Status) -> bool:
        """Count one node's refusal; True when it settles the node's class (`Settled`): no other node of it fits."""
        refusals.reasons.update(status.reasons)
        counted = refusals.counted.get(record.klass)
        if counted is None:
            counted = refusals.counted[record.klass] = []
        counted.append(record.name)
        if status.code is Code.UNRESOLVABLE and plan.settles:
            refusals.settled[record.klass] = Settled(status, self._node_fit(record, pod) is not None)
            return True
        refusals.resolvable = True
        return False

    def _refused(self, refusals: Refusals, pod: PodRequest, plan: Plan, total: int) -> Decision:
        """The decision of a cycle in which no node fits: each class settled by an answer its nodes may give apart
        adds the answers of its nodes not counted one by one (`_tally`)."""
        reasons, resolvable = refusals.reasons, refusals.resolvable
        for klass, known in refusals.settled.items():
            if known.by_node:
                continue
            tally = self._tally(klass, pod, plan, known.status)
            reasons.update(tally.reasons)
            counted = refusals.counted.get(klass, ())
            for name in counted:
                reasons.subtract(tally.answers[name].reasons)
            resolvable = resolvable or tally.resolvable > sum(
                tally.answers[name].code is not Code.UNRESOLVABLE for name in counted
            )
        code = Code.UNSCHEDULABLE if resolvable else Code.UNRESOLVABLE
        return Decision(pod.key, False, reason=summarize_reasons(total, +reasons), code=code)

    def _refused_like(self, record: NodeRecord, pod: PodRequest, plan: Plan, status: Status) -> Status:
        """The answer of a node whose class another node refused with `status`, unresolvable but not by the filters
        that read only the node: the filters that read what is in use may stop this node first, or name what else it
        lacks (kube-scheduler reports each node under the first filter that refuses it, NodeResourcesFit under every
        resource short); else the class's answer is its own (a hopeless size, a device rule)."""
        if record.nominees:
            return self.check(record, pod, plan)
        return self._usage_fit(record, pod, plan) or status

    def _tally(self, klass: int, pod: PodRequest, plan: Plan, status: Status) -> ClassTally:
        """The answers of the class's nodes (`ClassTally`), remembered per (class, pod shape) and brought up to date
        with the nodes changed since; nodes awaiting a preempting pod are asked again each time (nominating one
        is no change of the node)."""
        key = (klass, id(plan.local))
        tally = self._tallies.get(key)
        changed: Iterable[str] | None = None
        if tally is not None and tally.local is plan.local and tally.status == status:
            changed = self.changed_since(tally.generation)
        members = self._class_nodes.get(klass, {})
        if tally is None or changed is None:
            tally = ClassTally(plan.local, status, self.generation)
            if len(self._tallies) >= 256:
                self._tallies.clear()
            self._tallies[key] = tally
            changed = members
        elif self.nominated:
            changed = {*changed, *self.nominated.values()}
        for name in changed:
            tally.forget(name)
            if name in members:
                tally.learn(name, self._refused_like(self.nodes[name], pod, plan, status))
        tally.generation = self.generation
        return tally

    def _selector(self, pod: PodRequest, plan: Plan) -> tuple[CapacityIndex, str, int]:
        """The capacity index a cycle selects its candidates by, its resource, and the amount a node must offer.

        With several device resources the most selective index is used: the one with the fewest nodes that could
        offer the amount asked (an Intel pod's memory per card, rather than its card count). A pod without devices is
        selected by cpu, unless NodeResourcesFit is off: then no node is refused for what it lacks.
        """
        needs = [pair for _, pairs in plan.devices for pair in pairs]
        if not needs:
            cpu = -UNKNOWN_FREE if "NodeResourcesFit" in self.filters_off else pod.cpu_milli
            return self._index[CPU_INDEX], "cpu", cpu
        empty = CapacityIndex()
        if len(needs) > 1:
            resource, need = min(needs, key=lambda p: self._index.get(p[0], empty).count_at_least(p[1]))
        else:
            resource, need = needs[0]
        return self._index.get(resource, empty), resource, need

    def _candidates(self, pod: PodRequest, plan: Plan) -> tuple[Iterator[tuple[int, dict[str, None]]], str]:
        """(node class, nodes) worth filtering, in policy order, and the resource the index selected them by
        (`_selector`)."""
        index, resource, need = self._selector(pod, plan)
        return index.groups_at_least(need, ascending=self.policy == "binpack"), resource

    def _device_scores(
        self, record: NodeRecord, pod: PodRequest, routes: dict[str, list[str]]
    ) -> tuple[float, float | None]:
        """The device plugins' mean topology score (0..100) on the node, and the mean used share of their devices
        there (None when the pod asks for no device the node has)."""
        device_scores: list[float] = []
        utilization: list[float] = []
        for plugin in routes:
            state = record.states.get(plugin) if plugin else None
            if state is None:
                continue
            try:
                prepared = self.plan(pod).prepared.get(plugin)
                score = self.plugins.call(plugin, "kubegpu_scheduler_score", state=state, pod=pod, prepared=prepared)
            except PluginHookError as exc:
                log.error("node %s: %s", record.name, exc)
                score = 0.0
            device_scores.append(min(100.0, max(0.0, float(score or 0.0))))
            utilization.append(record.headroom[plugin].utilization)
        device_score = sum(device_scores) / len(device_scores) if device_scores else 0.0
        return device_score, (sum(utilization) / len(utilization) if utilization else None)

    def _score(self, record: NodeRecord, pod: PodRequest, routes: dict[str, list[str]]) -> float:
        device_score, used = self._device_scores(record, pod, routes)
        if used is None:
            allocatable = record.info.allocatable.get("cpu", 0)
            used = record.used["cpu"] / allocatable if allocatable else 0.0
        policy_score = 100.0 * (used if self.policy == "binpack" else 1.0 - used)
        return device_score + policy_score

    def _local_scores(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> tuple[float, ...]:
        """The raw scores that depend only on the node and the pod's spec (`scores`: BalancedAllocation,
        NodeAffinity, TaintToleration, the policy, the devices), remembered per node version and pod signature."""
        memo = record.last_raw
        remembered = memo.get(id(plan.local))
        if remembered is not None and remembered[0] == record.version and remembered[1] is plan.local:
            return remembered[2]
        info = record.info
        cpu, memory = scores.nonzero_requests(pod)
        cpu, memory = cpu + record.nonzero_cpu, memory + record.nonzero_memory
        cpu_capacity, memory_capacity = info.allocatable.get("cpu", 0), info.allocatable.get("memory", 0)
        device_score, used = self._device_scores(record, pod, self._route(pod))
        binpack = self.policy == "binpack"
        if used is not None:
            policy = 100.0 * (used if binpack else 1.0 - used)
        else:
            allocated = scores.most_allocated if binpack else scores.least_allocated
            policy = float((allocated(cpu, cpu_capacity) + allocated(memory, memory_capacity)) // 2)
        raw = (
            float(scores.balanced_allocation(cpu, memory, cpu_capacity, memory_capacity)),
            float(scores.node_affinity_raw(pod, info.name, info.labels)) if pod.preferred_node_affinity else 0.0,
            float(scores.taint_raw(pod, info.taints)) if info.name in self._soft_tainted else 0.0,
            policy,
            device_score,
        )
        _make_room(memo, id(plan.local))
        memo[id(plan.local)] = (record.version, plan.local, raw)
        return raw

    def _rank(self, feasible: list[str], pod: PodRequest, plan: Plan) -> str:
        """kube-scheduler's score phase over the feasible nodes: every enabled plugin's raw scores normalized over
        them and weighed (`kubegpu.scheduler.scores`); the best node, the first in candidate order on a tie."""
        profile, nodes = self.scoring, self.nodes
        records = [nodes[name] for name in feasible]
        local = [self._local_scores(record, pod, plan) for record in records]
        weighed: list[list[float]] = []  # each plugin's weighed scores, in plugin order; summed per node at the end

        def add(plugin: str, values: Iterable[float]) -> None:
            column = values if isinstance(values, list) else list(values)
            if min(column) == max(column):
                return  # the same for every node: it cannot change which node is best
            weight = profile.weight(plugin)
            weighed.append(column if weight == 1 else [weight * value for value in column])

        columns = (
            (scores.BALANCED, None),
            (scores.NODE_AFFINITY, False),
            (scores.TAINTS, True),
            (scores.policy_plugin(self.policy), None),
            (scores.DEVICES, None),
        )
        for column, (plugin, reverse) in enumerate(columns):
            if profile.weight(plugin):
                values = [raw[column] for raw in local]
                if min(values) == max(values):
                    continue  # normalized alike too
                add(plugin, values if reverse is None else scores.normalize_default(values, reverse=reverse))
        preferred = bool(pod.preferred_affinity or pod.preferred_anti_affinity)
        if profile.weight(scores.INTER_POD_AFFINITY) and (preferred or self._drawn(pod)):
            table = podindex.affinity_scores(pod, self._placed, self._labels, profile.hard_pod_affinity_weight)
            if table:
                raw_scores = scores.affinity_raws(table, [record.info.labels for record in records])
                if min(raw_scores) != max(raw_scores):  # else normalized alike too
                    add(scores.INTER_POD_AFFINITY, scores.normalize_affinity(raw_scores))
        soft = plan.soft_spread  # the pod's own or, when it has none, the defaults its owners give it
        if profile.weight(scores.SPREAD) and soft:
            state = podindex.spread_scores(
                pod,
                self._placed,
                [(record.name, record.info.labels) for record in records],
                self._spread_domains(pod, soft),
                soft,
            )
            if state is not None:
                raw_scores = scores.spread_raws(state, pod, [(r.name, r.info.labels) for r in records])
                add(scores.SPREAD, scores.normalize_spread(raw_scores, [r.name in state.ignored for r in records]))
        # NodePreferAvoidPods and ImageLocality, used as they are; skipped where every node would score alike.
        avoiding = self._avoiding(pod)
        if avoiding is not None and profile.weight(scores.PREFER_AVOID):
            none: frozenset[tuple[str, str]] = frozenset()
            avoided = [scores.prefer_avoid_score(avoiding, self._avoid.get(r.name, none)) for r in records]
            add(scores.PREFER_AVOID, map(float, avoided))
        images = self._listed_images(pod)
        if images and profile.weight(scores.IMAGE_LOCALITY):
            listed, count = self._image_nodes, len(nodes)
            held = [scores.image_locality(images, r.info.images, listed, count) for r in records]
            add(scores.IMAGE_LOCALITY, map(float, held))
        if not weighed:
            return feasible[0]
        totals = list(map(sum, zip(*weighed, strict=True))) if len(weighed) > 1 else weighed[0]
        return feasible[max(range(len(records)), key=totals.__getitem__)]

    def _avoiding(self, pod: PodRequest) -> tuple[str, str] | None:
        """The pod's controller (kind, UID) when some node's preferAvoidPods names it (NodePreferAvoidPods), else
        None."""
        if not self._avoided:
            return None
        key = scores.avoidance_key(pod)
        return key if key is not None and self._avoided[key] > 0 else None

    def _listed_images(self, pod: PodRequest) -> tuple[str, ...]:
        """The pod's images, normalized, when some node lists one of them (ImageLocality), else ()."""
        if not self._image_nodes or not pod.images:
            return ()
        images = tuple(scores.normalized_image(image) for image in pod.images)
        return images if any(image in self._image_nodes for image in images) else ()

    def _images_matter(self, pod: PodRequest) -> bool:
        """Whether ImageLocality may tell nodes apart for the pod: one of its images is listed by some nodes but not
        all, or by all at different sizes, and what the nodes could hold of them, scaled as the score scales it,
        passes the score's floor."""
        images = self._listed_images(pod)
        if not images or not self.scoring.weight(scores.IMAGE_LOCALITY):
            return False
        total = len(self.nodes)
        counts = [self._image_nodes[image] for image in images]
        sizes = [self._image_sizes.get(image) or Counter() for image in images]
        if all(c == 0 or (c == total and len(s) == 1) for c, s in zip(counts, sizes, strict=True)):
            return False
        most = sum(int(max(s, default=0) * (c / total)) for s, c in zip(sizes, counts, strict=True))
        return most > scores.IMAGE_FLOOR

    def _drawn(self, pod: PodRequest) -> bool:
        """Whether an affinity term of a placed pod selects `pod` (so that InterPodAffinity scores it)."""
        return self._placed.drawn(pod)

    def _sample_size(self, pod: PodRequest, plan: Plan) -> int:
        """How many feasible nodes to find before scoring. Without preferences the candidates come in policy order,
        best first, so `sample` do; when scores read labels, taints or other pods (or a configuration sets
        `percentageOfNodesToScore`), as many as kube-scheduler finds."""
        percentage = self.scoring.percentage_of_nodes_to_score
        if (
            percentage
            or pod.preferred_node_affinity
            or pod.preferred_affinity
            or pod.preferred_anti_affinity
            or self._drawn(pod)
            or self._soft_tainted
            or plan.soft_spread
            or (self._avoiding(pod) is not None and self.scoring.weight(scores.PREFER_AVOID))
            or self._images_matter(pod)
        ):
            return max(self.sample, scores.feasible_to_find(len(self.nodes), percentage))
        return self.sample

    def score_node(self, name: str, pod: PodRequest, plan: Plan | None = None) -> float:
        """The device score (0..200) of a node that passed the filter: plugin topology score plus the policy score
        (the extender's prioritize: kube-scheduler adds its own scores; `schedule` ranks with every score plugin).

        Remembered like `check`'s answer, per node version and pod signature.
        """
        record = self.nodes[name]
        signature = (plan or self.plan(pod)).signature
        remembered = record.last_score
        if remembered is not None and remembered[0] == record.version and remembered[1] is signature:
            return remembered[2]
        score = self._score(record, pod, self._route(pod))
        record.last_score = (record.version, signature, score)
        return score

    def schedule(self, pod: PodRequest) -> Decision:
        """Run one full cycle for a pod and, when a node fits, reserve its devices there."""
        if pod.key in self.pods:
            return Decision(
                pod.key, False, reason=f"pod {pod.key} already holds resources on a node", code=Code.UNRESOLVABLE
            )
        routes = self._route(pod)
        status = self._validate(pod, routes)
        if not status.ok:
            return Decision(pod.key, False, reason=status.message, code=status.code)
        plan = self.plan(pod)
        nodes = self.nodes
        if pod.node_name:
            record = nodes.get(pod.node_name)
            if record is None:
                return Decision(pod.key, False, reason=f"node {pod.node_name} is unknown", code=Code.UNRESOLVABLE)
            status = self.check(record, pod, plan)
            if not status.ok:
                return Decision(pod.key, False, reason=summarize_reasons(1, Counter(status.reasons)), code=status.code)
            return self._reserve(record, pod, plan)
        sample = self._sample_size(pod, plan)
        if self.sample < sample < len(nodes):
            return self._schedule_sampled(pod, plan, sample)
        feasible: list[str] = []
        evaluated = 0
        refusals = Refusals()
        settled = refusals.settled  # node class -> what one of its nodes' unresolvable answer says of the others
        reasons = refusals.reasons
        candidates, resource = self._candidates(pod, plan)
        visited: dict[int, list[dict[str, None]]] = {}  # node class -> the groups of its nodes filtered above
        judge = self._cluster_state(pod, plan).judge if plan.volatile else None
        check, refuse = self.check, self._refuse
        for klass, members in candidates:
            visited.setdefault(klass, []).append(members)
            known = settled.get(klass)
            if known is not None:
                if known.by_node:
                    for reason in known.status.reasons:
                        reasons[reason] += len(members)
                evaluated += len(members)
                continue
            for position, name in enumerate(members, 1):
                record = nodes[name]
                evaluated += 1
                status = check(record, pod, plan, judge=judge)
                if status.code is Code.SUCCESS:
                    feasible.append(name)
                    if len(feasible) >= sample:
                        break
                    continue
                if refuse(refusals, record, pod, plan, status):
                    # No other node of this class fits: counted without filtering (`_refused`).
                    rest = len(members) - position
                    if settled[klass].by_node:
                        for reason in status.reasons:
                            reasons[reason] += rest
                    evaluated += rest
                    break
            if len(feasible) >= sample:
                break
        if not feasible:
            if evaluated < len(nodes):
                self._explain_skipped(pod, plan, visited, refusals, resource)
            return self._refused(refusals, pod, plan, len(nodes))
        best = feasible[0] if len(feasible) == 1 else self._rank(feasible, pod, plan)
        return self._reserve(nodes[best], pod, plan)

    def _explain_skipped(
        self,
        pod: PodRequest,
        plan: Plan,
        visited: dict[int, list[dict[str, None]]],
        refusals: Refusals,
        resource: str,
    ) -> None:
        """Count the nodes the capacity index skipped under their own reasons, as kube-scheduler would report them
        (a node that fails the node selector says so, not "Insufficient ..."). Only a pod that fits nowhere pays for
        this, and a class whose nodes answer alike (unresolvable) costs one check."""
        settled = refusals.settled
        for klass, members in self._class_nodes.items():
            groups = visited.get(klass, ())
            left = len(members) - sum(len(group) for group in groups)
            if left <= 0:
                continue
            known = settled.get(klass)
            if known is None:
                for name in members:
                    if any(name in group for group in groups):
                        continue
                    record = self.nodes[name]
                    status = self.check(record, pod, plan)
                    if status.ok:
                        status = Status.unschedulable(f"Insufficient {resource}")
                    left -= 1
                    if self._refuse(refusals, record, pod, plan, status) or left <= 0:
                        break
                known = settled.get(klass)
            if known is not None and known.by_node and left > 0:
                for reason in known.status.reasons:
                    refusals.reasons[reason] += left  # every other skipped node of the class answers alike

    def _schedule_sampled(self, pod: PodRequest, plan: Plan, sample: int) -> Decision:
        """The cycle of a pod scored on kube-scheduler's sample of a larger cluster (`_sample_size`): the first
        `sample` feasible nodes in the node tree's order (zone by zone in turn), from where the last such sample
        stopped, as kube-scheduler 1.20 takes them (`findNodesThatPassFilters`, `nextStartNodeIndex`). Every zone
        is in every sample; a sample in capacity order would hold the first zones only. Nodes the capacity index
        rules out are passed over, and filtered for their reasons only when no node fits."""
        nodes, check, refuse = self.nodes, self.check, self._refuse
        judge = self._cluster_state(pod, plan).judge if plan.volatile else None
        index, resource, need = self._selector(pod, plan)
        order = self._tree.order()
        least = index.least()
        # None when every node offers enough (the usual case): then no node is looked up in the index.
        offers = None if len(index) == len(order) and least is not None and least >= need else index.get
        start = self._next_start % len(order)
        feasible: list[str] = []
        refusals = Refusals()
        settled = refusals.settled
        passed: list[str] = []  # nodes the index ruled out
        processed = 0
        for processed, name in enumerate(chain(order[start:], order[:start]), 1):  # noqa: B007 (read after)
            if offers is not None and ((free := offers(name)) is None or free < need):
                passed.append(name)
                continue
            record = nodes[name]
            if settled and record.klass in settled:
                continue  # counted with its class if no node fits (`_refused`)
            status = check(record, pod, plan, judge=judge)
            if status.code is Code.SUCCESS:
                feasible.append(name)
                if len(feasible) >= sample:
                    break
                continue
            refuse(refusals, record, pod, plan, status)
        self._next_start = (start + processed) % len(order)
        if feasible:
            best = feasible[0] if len(feasible) == 1 else self._rank(feasible, pod, plan)
            return self._reserve(nodes[best], pod, plan)
        for name in passed:
            record = nodes[name]
            if record.klass in settled:
                continue
            status = check(record, pod, plan, judge=judge)
            refuse(
                refusals,
                record,
                pod,
                plan,
                status if not status.ok else Status.unschedulable(f"Insufficient {resource}"),
            )
        for klass, known in settled.items():
            if known.by_node:  # its nodes not counted one by one, all alike
                rest = len(self._class_nodes.get(klass, ())) - len(refusals.counted.get(klass, ()))
                for reason in known.status.reasons:
                    refusals.reasons[reason] += rest
        return self._refused(refusals, pod, plan, len(nodes))

    # -- reserve, assume, release --------------------------------------------------------------------------------

    def reserve(self, pod: PodRequest, name: str, *, placing: bool = True) -> Decision:
        """Re-check the fit on one node, then allocate and take the pod's devices there, atomically (all plugins or
        none). The extender's bind verb and the custom scheduler's retries use this directly; `hold` with `placing`
        false, for a pod already bound there."""
        record = self.nodes.get(name)
        if record is None:
            return Decision(pod.key, False, reason=f"node {name} is unknown", code=Code.UNRESOLVABLE)
        if pod.key in self.pods:
            return Decision(
                pod.key, False, reason=f"pod {pod.key} already holds resources on a node", code=Code.UNRESOLVABLE
            )
        plan = self.plan(pod)
        status = self.check(record, pod, plan, placing=placing)
        if not status.ok:
            return Decision(pod.key, False, reason=status.message, code=status.code)
        return self._reserve(record, pod, plan)

    def _reserve(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Decision:
        name = record.name
        parts: dict[str, PluginAllocation] = {}
        for plugin, _ in plan.devices:
            try:
                allocation = self.plugins.call(
                    plugin,
                    "kubegpu_scheduler_allocate",
                    state=record.states[plugin],
                    pod=pod,
                    prepared=plan.prepared.get(plugin),
                )
            except PluginHookError as exc:
                return Decision(pod.key, False, reason=str(exc), code=Code.ERROR)
            if allocation is None:
                return Decision(
                    pod.key,
                    False,
                    reason=f"plugin {plugin!r} could not allocate devices on {name}",
                    code=Code.UNSCHEDULABLE,
                )
            parts[plugin] = allocation
        status = self._take(record, pod, parts)
        if not status.ok:
            return Decision(pod.key, False, reason=status.message, code=status.code)
        annotations: dict[str, str] = {}
        allocation_record: AllocationRecord | None = None
        if parts:
            allocation_record = merge_allocations(name, pod.uid, list(parts.values()))
            if self.signing_key is not None:
                self._issued = max(time.time_ns(), self._issued + 1)
                allocation_record = allocation_record.model_copy(update={"issued": self._issued})
                allocation_record = sign_allocation(allocation_record, self.signing_key)
            for part in parts.values():
                annotations.update(part.annotations)
            annotations[ALLOCATION_KEY] = encode_allocation(allocation_record)
        self._place(record, PodRecord(pod, name, parts, allocation_record, annotations))
        return Decision(pod.key, True, node=name, allocation=allocation_record, annotations=annotations)

    def allocation_problem(self, pod: PodRequest, name: str, allocation: AllocationRecord) -> str | None:
        """Why `allocation` may not hold devices for `pod` bound to node `name`, or None when it may.

        Pod annotations are written by tenants: only an allocation that this scheduler's key signed, for this pod's
        UID, on the node the pod is bound to, holds devices. Anything else (unsigned, forged, copied from another
        pod, naming another node) is a claim, not an allocation.
        """
        if allocation.node != name:
            return f"it names node {allocation.node!r} but the pod is bound to {name!r}"
        if allocation.podUID != pod.uid:
            return f"it was issued to the pod with UID {allocation.podUID!r}, not to this pod (UID {pod.uid!r})"
        if self.signing_key is not None and not verify_allocation(allocation, self.signing_key):
            return "its signature does not verify with the scheduler's key (unsigned, changed, or signed elsewhere)"
        return None

    def assume(self, pod: PodRequest, name: str, allocation: AllocationRecord | None) -> Status:
        """Record a pod that is already bound (restart, or a pod bound by someone else) with its allocation.

        Only a verified allocation (`allocation_problem`) is taken. Its devices are split by owning plugin and taken
        atomically; a device that is unknown is refused with a reason, and nothing is taken. When a device is held by
        another pod, the allocation the scheduler issued later wins (`issued`): the earlier one is stale (its
        devices were given out again after it was rolled back or replayed), so its pod is displaced from the ledger
        and holds nothing; a stale allocation arriving second is refused. An engine without a signing key (`kubegpu
        top` without a key file) verifies nothing, and a stamp nobody verified settles nothing: there an allocation
        naming a held device is refused, naming the holders, and displaces no one.
        """
        if pod.key in self.pods:
            return Status.error(f"pod {pod.key} already holds resources")
        record = self.nodes.get(name)
        if record is None:
            return Status.error(f"node {name} is unknown")
        parts: dict[str, PluginAllocation] = {}
        if allocation is not None:
            problem = self.allocation_problem(pod, name, allocation)
            if problem is not None:
                return Status.error(f"the {ALLOCATION_KEY} of pod {pod.key} holds no devices: {problem}")
            parts = self._split(allocation)
        status = self._take(record, pod, parts)
        if not status.ok and allocation is not None:
            rivals = self._holders_of(record, allocation)
            if self.signing_key is None and rivals:
                claimants = ", ".join(p.request.key for p in rivals)
                return Status.error(
                    f"the {ALLOCATION_KEY} of pod {pod.key} names devices that {claimants} also claim; neither is "
                    "verified (no key), so neither displaces the other"
                )
            newer = [
                p.request.key
                for p in rivals
                if not p.by_count and p.allocation is not None and p.allocation.issued >= allocation.issued
            ]
            if newer:
                return Status.error(
                    f"the {ALLOCATION_KEY} of pod {pod.key} (issued {allocation.issued}) is stale: its devices are "
                    f"held by {', '.join(newer)}, whose allocation the scheduler issued later"
                )
            displaced = [held for p in rivals if (held := self.release(p.request.key)) is not None]
            status = self._take(record, pod, parts)
            if status.ok:
                self._place(record, PodRecord(pod, name, parts, allocation, {}))
            for held in displaced:
                if not status.ok:
                    self._restore(held)
                elif held.by_count:
                    self.hold(held.request, name)
                else:
                    log.warning(
                        "allocation is stale: a later allocation (issued %d) holds its devices; the pod holds none",
                        allocation.issued,
                        extra={"pod": held.request.key, "node": name},
                    )
            return status
        if not status.ok:
            return status
        self._place(record, PodRecord(pod, name, parts, allocation, {}))
        return Status.success()

    def hold(self, pod: PodRequest, name: str) -> Decision:
        """Set devices aside by count for a pod bound to `name` without a verified allocation (bound by another
        scheduler, or carrying a claim that does not verify): the kubelet admits it by count, so its count is not
        free, but no container was given these particular devices, so a verified allocation may take them over.

        When the node side published the ids the kubelet gave this pod (`set_held_devices`), the pod holds exactly
        those instead, and nothing may take them over."""
        record = self.nodes.get(name)
        exact = self._published.get(name, {}).get(pod.key)
        if (
            exact is not None
            and record is not None
            and pod.key not in self.pods
            and self._hold_exact(record, pod, exact)
        ):
            return Decision(pod.key, True, node=name)
        decision = self.reserve(pod, name, placing=False)
        if decision.scheduled:
            self.pods[pod.key].by_count = True
        return decision

    def _hold_exact(self, record: NodeRecord, pod: PodRequest, containers: dict[str, dict[str, list[str]]]) -> bool:
        """Take exactly the published ids for a pod kubegpu did not place; False (nothing taken) when they do not fit.
        Devices set aside by count for other pods may be these very ids: those pods are held again around them."""
        parts: dict[str, PluginAllocation] = {}
        for container, resources in containers.items():
            for resource, ids in resources.items():
                plugin = self.plugins.owner_of(resource)
                if plugin is None or plugin not in record.states:
                    continue
                part = parts.setdefault(plugin, PluginAllocation(plugin=plugin))
                part.containers.setdefault(container, {})[resource] = list(ids)
        if not parts:
            return False
        status = self._take(record, pod, parts)
        if status.ok:
            self._place(record, PodRecord(pod, record.name, parts, None, {}))
            return True
        keys = [key for key in record.pods if self.pods[key].by_count]
        movable = [held for key in keys if (held := self.release(key)) is not None]
        status = self._take(record, pod, parts)
        if status.ok:
            self._place(record, PodRecord(pod, record.name, parts, None, {}))
        else:
            log.warning(
                "the devices the kubelet reports for the pod do not fit kubegpu's ledger; held by count: %s",
                status.message,
                extra={"pod": pod.key, "node": record.name},
            )
        for held in movable:
            if not self.hold(held.request, record.name).scheduled:
                log.error("pod held by count no longer fits its node", extra={"pod": held.request.key})
        return status.ok

    # -- what the node side reports ------------------------------------------------------------------------------

    def set_node_live(self, name: str, live: bool, reason: str | None = None) -> bool:
        """Whether node `name` takes new device pods: not while its node side has stopped reporting (its kubegpu
        node lease expired, `kubegpu.scheduler.liveness`); `reason` is what each device pod refused there is told.
        Pods already on the node stay, and pods that request no device resource are not affected. Returns whether
        anything changed; the node's remembered answers are then stale (its version and the generation move on)."""
        wanted = None if live else (reason or "node(s) had an expired kubegpu node lease")
        previous = self._dead.get(name)
        if previous == wanted:
            return False
        if wanted is None:
            del self._dead[name]
        else:
            self._dead[name] = wanted
        record = self.nodes.get(name)
        if record is None:
            return True
        if (previous is None) != (wanted is None):
            klass = self._klass(record.info)
            self._join_class(name, record.klass, klass)
            record.klass = klass
            self._refresh(record)
        else:  # only the wording changed (the lease's age)
            record.version += 1
            self._changed(name)
        return True

    def set_held_devices(self, name: str, held: Mapping[str, Mapping[str, Mapping[str, Sequence[str]]]]) -> list[str]:
        """The device ids node `name`'s kubelet gave pods that kubegpu did not place, as its PodResources API reports
        them (published by the node side as `kubegpu.io/foreign-devices`): pod key -> container -> resource -> ids.
        A pod held by count there (`hold`) whose ids are published holds exactly those from now on, and so does one
        held later. Returns the keys of the pods moved from a count to exact ids."""
        table = {
            key: {container: {r: [str(i) for i in ids] for r, ids in per.items()} for container, per in pod.items()}
            for key, pod in held.items()
        }
        if self._published.get(name, {}) == table:
            return []
        if table:
            self._published[name] = table
        else:
            self._published.pop(name, None)
        record = self.nodes.get(name)
        if record is None:
            return []
        moved = []
        for key in [k for k in record.pods if self.pods[k].by_count and k in table]:
            released = self.release(key)
            if released is None:
                continue
            if not self.hold(released.request, name).scheduled:
                self._restore(released)
            elif not self.pods[key].by_count:
                moved.append(key)
        return moved

    def _holders_of(self, record: NodeRecord, allocation: AllocationRecord) -> list[PodRecord]:
        """The pods on the node whose allocations name a whole device of `allocation`."""
        wanted = _whole_devices(allocation)
        holders = []
        for key in record.pods:
            held = self.pods[key]
            if held.allocation is not None and not wanted.isdisjoint(_whole_devices(held.allocation)):
                holders.append(held)
        return holders

    def _split(self, allocation: AllocationRecord) -> dict[str, PluginAllocation]:
        parts: dict[str, PluginAllocation] = {}
        for container, resources in allocation.containers.items():
            for resource, ids in resources.items():
                plugin = self.plugins.owner_of(resource) or ""
                part = parts.get(plugin)
                if part is None:
                    part = parts[plugin] = PluginAllocation(
                        plugin=plugin, fields=dict(allocation.plugins.get(plugin, {}))
                    )
                part.containers.setdefault(container, {})[resource] = list(ids)
                share = allocation.shares.get(container, {}).get(resource)
                if share is not None:
                    part.shares.setdefault(container, {})[resource] = dict(share)
        return parts

    def _take(self, record: NodeRecord, pod: PodRequest, parts: dict[str, PluginAllocation]) -> Status:
        taken: list[str] = []
        for plugin, part in parts.items():
            state = record.states.get(plugin) if plugin else None
            if state is None:
                status = Status.error(f"node {record.name} has no devices for plugin {plugin or '(none)'!r}")
            else:
                try:
                    status = self.plugins.call(
                        plugin, "kubegpu_scheduler_take", state=state, pod_key=pod.key, allocation=part
                    ) or Status.error(f"plugin {plugin!r} gave no answer to kubegpu_scheduler_take")
                except PluginHookError as exc:
                    status = Status.error(str(exc), plugin=plugin)
            if not status.ok:
                for done in taken:
                    self._release_part(record, done, pod.key, parts[done])
                return status
            taken.append(plugin)
        return Status.success()

    def _release_part(self, record: NodeRecord, plugin: str, key: str, part: PluginAllocation) -> None:
        try:
            status = self.plugins.call(
                plugin, "kubegpu_scheduler_release", state=record.states[plugin], pod_key=key, allocation=part
            )
        except PluginHookError as exc:
            log.error("releasing %s on %s: %s", key, record.name, exc)
            return
        if status is not None and not status.ok:
            log.error("releasing %s on %s: %s", key, record.name, status.message)

    def _charge(self, record: NodeRecord, pod: PodRequest, sign: int) -> None:
        used = record.used
        used["pods"] += sign
        used["cpu"] += sign * pod.cpu_milli
        used["memory"] += sign * pod.memory
        for resource, amount in pod.requests.items():
            if resource not in CPU_MEMORY:
                used[resource] += sign * amount
        for port in pod.host_ports:
            record.ports[(port.ip, port.protocol, port.port)] += sign
            if record.ports[(port.ip, port.protocol, port.port)] <= 0:
                del record.ports[(port.ip, port.protocol, port.port)]
        self._priorities[pod.priority] += sign
        cpu, memory = scores.nonzero_requests(pod)
        record.nonzero_cpu += sign * cpu
        record.nonzero_memory += sign * memory
        if sign > 0:
            self._placed.add(pod.key, pod, record.name)
        else:
            self._placed.discard(pod.key)
        if pod.pod_anti_affinity:
            self._anti_epoch += 1

    def _place(self, record: NodeRecord, pod_record: PodRecord) -> None:
        key = pod_record.request.key
        nominated = self.nominated.pop(key, None)
        if nominated is not None and (held := self.nodes.get(nominated)) is not None:
            held.nominees.pop(key, None)
            if held is not record:
                self._refresh(held)
        self.pods[key] = pod_record
        record.pods[key] = None
        self._charge(record, pod_record.request, +1)
        self._refresh(record)

    def release(self, key: str) -> PodRecord | None:
        """Forget a pod (deleted, finished, or its binding rolled back) and return exactly what it held."""
        pod_record = self.pods.pop(key, None)
        if pod_record is None:
            return None
        record = self.nodes.get(pod_record.node)
        if record is None:
            self._forget_anti(key)
            return pod_record
        for plugin, part in pod_record.parts.items():
            if plugin in record.states:
                self._release_part(record, plugin, key, part)
        record.pods.pop(key, None)
        self._charge(record, pod_record.request, -1)
        self._refresh(record)
        return pod_record

    @contextmanager
    def pods_removed(self, keys: Iterable[str]) -> Iterator[list[PodRecord]]:
        """Pretend the pods are gone (preemption what-ifs), then put back exactly what they held."""
        removed = [record for key in keys if (record := self.release(key)) is not None]
        try:
            yield removed
        finally:
            for record in removed:
                self._restore(record)

    def _restore(self, pod_record: PodRecord) -> None:
        """Put back exactly what a released pod held."""
        node = self.nodes.get(pod_record.node)
        if node is None:
            return
        status = self._take(node, pod_record.request, pod_record.parts)
        if status.ok:
            self._place(node, pod_record)
        else:
            log.error("could not restore %s: %s", pod_record.request.key, status.message)

    # -- preemption ----------------------------------------------------------------------------------------------

    def preempt(self, pod: PodRequest, budgets: Sequence[Budget] = ()) -> Preemption:
        """Where evicting pods of lower priority would let `pod` fit, devices included, and whom to evict there
        (`kubegpu.scheduler.preemption` has the rules). Changes nothing: the front-end evicts the victims (the
        simulator at once, the scheduler by deleting them and nominating the node) and schedules the pod again.
        The extender's `/preempt` answers from `complete_victims` per proposed node."""
        if not may_preempt(pod):
            return Preemption(None, reason="the pod's preemptionPolicy is Never")
        if pod.key in self.pods:
            return Preemption(None, reason=f"pod {pod.key} already holds resources on a node")
        if not any(priority < pod.priority for priority, count in self._priorities.items() if count > 0):
            return Preemption(None, reason="no pod of lower priority runs anywhere")
        status = self._validate(pod, self._route(pod))
        if not status.ok:
            return Preemption(None, reason=status.message)
        candidates = []
        for name, record in list(self.nodes.items()):
            if not any(self.pods[key].request.priority < pod.priority for key in record.pods):
                continue
            status = self.check(record, pod, self.plan(pod))
            if status.ok or status.code in (Code.UNRESOLVABLE, Code.ERROR):
                continue
            candidate = self.select_victims(pod, name, budgets)
            if candidate is not None:
                candidates.append(candidate)
        chosen = pick(candidates)
        if chosen is None:
            return Preemption(None, reason="no node would fit the pod even without the pods of lower priority")
        victims = tuple(p.key for p in chosen.victims)
        return Preemption(chosen.node, victims, chosen.violations, candidates=tuple(candidates))

    def select_victims(self, pod: PodRequest, name: str, budgets: Sequence[Budget] = ()) -> Candidate | None:
        """The fewest pods of lower priority to evict from node `name` so that `pod` fits there, or None when even
        evicting all of them would not do. What-if only: every pod is back as it was on return."""
        record = self.nodes.get(name)
        if record is None:
            return None
        lower = [key for key in record.pods if key != pod.key and self.pods[key].request.priority < pod.priority]
        if not lower:
            return None
        held = {key: self.pods[key] for key in lower}
        out: dict[str, PodRecord] = {}
        try:
            for key in lower:
                released = self.release(key)
                if released is not None:
                    out[key] = released
            if not self.check(record, pod, self.plan(pod)).ok:
                return None
            violating, others = split_by_budget(by_importance(h.request for h in held.values()), budgets)
            victims: list[PodRequest] = []
            violations = 0
            for request in violating + others:
                self._restore(out.pop(request.key))
                if self.check(record, pod, self.plan(pod)).ok:
                    continue  # reprieved
                released = self.release(request.key)
                if released is not None:
                    out[request.key] = released
                victims.append(request)
                violations += request in violating
            return Candidate(name, tuple(victims), violations)
        finally:
            for released in out.values():
                self._restore(released)

    def complete_victims(
        self, pod: PodRequest, name: str, uids: Iterable[str], budgets: Sequence[Budget] = ()
    ) -> Candidate | None:
        """Check a preemption someone else proposed (kube-scheduler's victims, through the extender's `/preempt`):
        what must be evicted from node `name` besides the proposed pods (those of `uids` that hold resources there)
        for `pod` to fit, devices included. An empty candidate when the proposed victims free enough; else the
        engine's own choice there (`select_victims`), which may name some of them again; None when no eviction lets
        the pod fit or the node is unknown. What-if only: every pod is back as it was on return."""
        record = self.nodes.get(name)
        if record is None:
            return None
        proposed = set(uids)
        keys = [key for key in record.pods if self.pods[key].request.uid in proposed]
        with self.pods_removed(keys):
            if self.check(record, pod, self.plan(pod)).ok:
                return Candidate(name, (), 0)
        return self.select_victims(pod, name, budgets)

    def nominate(self, pod: PodRequest, name: str | None) -> None:
        """Hold node `name` for a preempting pod while its victims leave (None: release the hold): pods of equal or
        lower priority are kept off it, as kube-scheduler counts nominated pods when it filters."""
        previous = self.nominated.pop(pod.key, None)
        if previous is not None and (record := self.nodes.get(previous)) is not None:
            record.nominees.pop(pod.key, None)
            self._refresh(record)
        if name is not None and (record := self.nodes.get(name)) is not None:
            self.nominated[pod.key] = name
            record.nominees[pod.key] = pod.priority
            self._refresh(record)

    def unnominate(self, key: str) -> None:
        """Release the node held for a preempting pod (it was deleted, bound elsewhere, or gave up)."""
        name = self.nominated.pop(key, None)
        if name is not None and (record := self.nodes.get(name)) is not None:
            record.nominees.pop(key, None)
            self._refresh(record)

    # -- what the front-ends read --------------------------------------------------------------------------------
    # Queries that return values or read-only views: a front-end never reads the records themselves
    # (tests/scheduler/test_front_end_boundary.py holds this).

    def node_names(self) -> KeysView[str]:
        """The nodes the engine knows, as a live view (`in` and set operations work on it; no copy)."""
        return self.nodes.keys()

    def node_info(self, name: str) -> NodeInfo | None:
        """Node `name` as it was last added (None: unknown), so a front-end can tell whether a Node changed."""
        record = self.nodes.get(name)
        return record.info if record is not None else None

    def has_devices(self, name: str) -> bool:
        """Whether some plugin keeps device state for node `name`."""
        record = self.nodes.get(name)
        return record is not None and bool(record.states)

    def device_state(self, name: str, plugin: str) -> DeviceNodeState | None:
        """`plugin`'s device state for node `name` (None: unknown node, or none kept there), for a view in that
        plugin's own terms (`compat`'s GpuNode). Read it only: the engine changes it as pods come and go."""
        record = self.nodes.get(name)
        return record.states.get(plugin) if record is not None else None

    def holders(self, name: str) -> list[str]:
        """The pods holding resources on node `name`, in the order they were placed (none for an unknown node)."""
        record = self.nodes.get(name)
        return list(record.pods) if record is not None else []

    def pod_keys(self) -> KeysView[str]:
        """The pods that hold resources on some node, as a live view (no copy)."""
        return self.pods.keys()

    def placement(self, key: str) -> Placement | None:
        """Where pod `key` holds resources and what it took; None when it holds none."""
        record = self.pods.get(key)
        return None if record is None else Placement(record.request, record.node, record.allocation)

    def placements(self, keys: Iterable[str] | None = None) -> Iterator[Placement]:
        """The placements of those of `keys` that hold resources, in their order (None: of every pod that does)."""
        for key in self.pods if keys is None else keys:
            record = self.pods.get(key)
            if record is not None:
                yield Placement(record.request, record.node, record.allocation)

    def awaits_victims(self, key: str, leaving: Container[str]) -> bool:
        """Whether the node held for preempting pod `key` (`nominate`) still holds one of `leaving` (victims deleted
        but not gone yet): the pod waits for them instead of preempting again."""
        name = self.nominated.get(key)
        record = self.nodes.get(name) if name is not None else None
        return record is not None and any(held in leaving for held in record.pods)

    def describe(self, name: str) -> list[Occupancy]:
        record = self.nodes[name]
        pictures: list[Occupancy] = []
        for plugin, state in record.states.items():
            try:
                pictures.extend(self.plugins.call(plugin, "kubegpu_scheduler_describe", state=state) or [])
            except PluginHookError as exc:
                log.error("node %s: %s", name, exc)
        return pictures


def _whole_devices(allocation: AllocationRecord) -> set[tuple[str, str]]:
    """(resource, device id) of each whole device in an allocation (shared ones, with `shares`, have co-holders)."""
    return {
        (resource, device)
        for container, resources in allocation.containers.items()
        for resource, ids in resources.items()
        if resource not in allocation.shares.get(container, {})
        for device in ids
    }
