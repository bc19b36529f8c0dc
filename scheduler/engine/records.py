"""The engine's records and results: what it keeps per node and per pod, the per-pod plan, a cycle's tallies,
and what it answers (`Decision`, `Placement`). Plain dataclasses: validation happened at the boundary."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, NamedTuple

from kubegpu.core.annotations import (
    AllocationRecord,
)
from kubegpu.core.models import (
    NodeInfo,
    PluginAllocation,
    PodRequest,
    SpreadConstraint,
)
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom
from kubegpu.core.status import Code, Status
from kubegpu.core.text import MAX_TEXT_CHARS, safe_text
from kubegpu.scheduler.dra import PodClaims
from kubegpu.scheduler.preemption import Budget, Candidate

log = logging.getLogger("kubegpu.engine")

Policy = Literal["binpack", "spread"]
POLICIES: tuple[Policy, ...] = ("binpack", "spread")
BASIC_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})
CPU_INDEX = "cpu"
DRA_INDEX = "resource.k8s.io/devices"  # a node's DRA devices no claim holds (`DraBook.free_devices`)
NAME_LABELS = frozenset({"kubernetes.io/hostname"})
# Pod shapes whose filter answers and node-local scores a node remembers; past it the shape asked about longest ago
# goes. Device pods' shapes include their labels (a plugin may read them), so each Deployment's replicas are a shape.
# A GPU cluster's trace has a few hundred (the openb trace: 151 of cpu, memory and GPU asks); at 32 a replay that
# scored every node asked each node afresh for most pods (shapes came back after 32 others had pushed them out),
# at 256 it runs 1.6x faster with the same placements (`benchmarks/sharing_bench.py`).
CHECKS_REMEMBERED = 256
FRAGMENTATION_HOOK = "kubegpu_scheduler_fragmentation"
FRAGMENTATION_EPOCH_HOOK = "kubegpu_scheduler_fragmentation_epoch"
NODE_DIGEST_HOOK = "kubegpu_scheduler_node_digest"
UNKNOWN_FREE = 1 << 62  # the headroom of a plugin that failed on a node: unknown, so never the reason to skip it


def make_room(memo: dict[int, Any], slot: int) -> None:
    """Before `memo[slot]` is (re)written: the slot moves to the newest end; a full memo drops its oldest slot."""
    if memo.pop(slot, None) is None and len(memo) >= CHECKS_REMEMBERED:
        del memo[next(iter(memo))]


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
    last_score: tuple[int, tuple[object, ...], tuple[int | None, ...], float] | None = None
    # The last preemption dry run here (`Preempting._select_victims`): (node version, pod shape, the pod's priority,
    # the budgets, the candidate or None).
    last_victims: tuple[int, tuple[object, ...], int, tuple[Budget, ...], Candidate | None] | None = None
    # Running pods whose devices the node no longer lists as they were (a device gone) -> why: counted, holding none,
    # and each of their plugins' devices here refused to other pods until they leave (`NodeCache.add_node`).
    unheld: dict[str, str] = field(default_factory=dict)
    # The devices its pods' allocations name, (plugin, resource, id) -> {pod key: held whole}, kept with `pods`
    # (`NodeCache._enter`, `release`, `add_node`): the engine's own guard against a device given twice
    # (`Reserving._held_by_another`), whatever a plugin's books say.
    held: dict[tuple[str, str, str], dict[str, bool]] = field(default_factory=dict)
    # What its plugins said of it when it was built (`NodeClasses.node_digest`), in its class key: compared with
    # what they say now when the node changes, and every `DIGEST_RECHECK` seconds (`NodeCache.recheck_digests`).
    digest: tuple[Hashable, ...] = ()

    def hold_named(self, key: str, parts: Mapping[str, PluginAllocation]) -> None:
        """Note the devices a pod entered on this node names (`held`)."""
        for device, whole in named_devices(parts):
            self.held.setdefault(device, {})[key] = whole

    def unhold_named(self, key: str, parts: Mapping[str, PluginAllocation]) -> None:
        """Forget the devices a pod leaving this node named."""
        for device, _ in named_devices(parts):
            holders = self.held.get(device)
            if holders is not None:
                holders.pop(key, None)
                if not holders:
                    del self.held[device]

    @property
    def name(self) -> str:
        return self.info.name

    def free(self, resource: str) -> int:
        return self.info.allocatable.get(resource, 0) - self.used[resource]

    def usage_copy(self) -> NodeRecord:
        """A copy to count pods in and out of without touching this node (kube-scheduler's `NodeInfo.Clone` for
        preemption's dry runs): its own usage, pods, ports and nominees, no remembered answers; the devices are
        shared, so a what-if on the copy may not hold or give back devices."""
        return NodeRecord(
            self.info,
            self.states,
            self.headroom,
            Counter(self.used),
            dict(self.pods),
            Counter(self.ports),
            dict(self.nominees),
            self.problems,
            self.klass,
            self.version,
            self.nonzero_cpu,
            self.nonzero_memory,
        )


def named_devices(parts: Mapping[str, PluginAllocation]) -> list[tuple[tuple[str, str, str], bool]]:
    """Each device a pod's allocation names, (plugin, resource, id), and whether it holds it whole: a device is
    shared only where the container's `shares` name it."""
    named = []
    for plugin, part in parts.items():
        for container, resources in part.containers.items():
            shared = part.shares.get(container)
            for resource, ids in resources.items():
                for device in ids:
                    whole = not shared or not any(device in amounts for amounts in shared.values())
                    named.append(((plugin, resource, device), whole))
    return named


@dataclass(slots=True)
class PodRecord:
    """A pod that holds resources on a node: its request and the ledger entry of what it took."""

    request: PodRequest
    node: str
    parts: dict[str, PluginAllocation]
    allocation: AllocationRecord | None
    annotations: dict[str, str]
    # Set aside by count for a bound pod without a verified allocation: no container was given these devices, so
    # any verified allocation naming them takes them over (`Engine.admit_by_count`).
    by_count: bool = False
    # The DRA claims the pod holds (`kubegpu.scheduler.dra`): entered and given back with the pod.
    claims: PodClaims | None = None
    # Its allocation verifies only with a verify key (`--allocation-verify-key-file`), not the signing key: counted
    # in `Engine.on_verify_keys` while the pod holds it.
    by_verify_key: bool = False


# A node filter's bound `filter` method (`framework.NodeFilter`): (engine, node, pod, plan) -> refusal or None.
NodeRule = Callable[[Any, "NodeRecord", PodRequest, "Plan"], "Status | None"]


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
    # The node filters that apply to the pod (`NodeFilter.applies`, its PreFilter): those that read only the node,
    # and those that read what is in use, each its bound `filter` method, in the order they run.
    node_rules: tuple[NodeRule, ...] = ()
    usage_rules: tuple[NodeRule, ...] = ()
    # The pod's cpu (millicores) and memory as the scores count them (`scores.nonzero_requests`).
    nonzero: tuple[int, int] = (0, 0)


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


@dataclass(slots=True)
class Passing:
    """The nodes that pass one pod shape's node-local filters and device fit (`check` short of the cluster-wide
    filters, the nominees and the dead nodes it asks about apart), by name. The memo `Engine._passing`: key
    `id(Plan.local)`, confirmed by identity; up to date with the change log at `generation` (`Engine._passing_nodes`
    drops every node the log names since: a change of its usage, devices, labels or liveness, or its removal, all
    of which move a node's version too); rebuilt when the log no longer reaches back; a node enters when a cycle's
    `check` found it passing at its current version."""

    local: tuple[object, ...]
    generation: int
    nodes: set[str] = field(default_factory=set)


class NodesByValue(NamedTuple):
    """The nodes by their value of one label key (`Engine.nodes_by_value`), and those without the key."""

    values: Mapping[str, tuple[str, ...]]
    missing: tuple[str, ...]


class ClusterState(NamedTuple):
    """One pod's cluster-wide filter state (the enabled `ClusterFilter`s' PreFilter) at one generation: the judge of
    one node made from it, and, when every rule named the nodes it refuses (`framework.Refused`), those nodes with
    the first rule's refusal of each (the judge then only looks a node up there)."""

    pod: PodRequest
    plan: Plan
    generation: int
    judge: Callable[[str, Mapping[str, str]], Status | None] | None  # by node name and labels; None: none refused
    refused: Mapping[str, Status] | None = None  # when every rule named the nodes it refuses: those, by name


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
    # The pod's DRA claims once reserved: pod claim name -> {name, allocation (upstream `status.allocation`),
    # reservedFor}, what a front-end writes to each ResourceClaim's status.
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        reason = self.reason
        if reason is not None and (len(reason) > MAX_TEXT_CHARS or not reason.isprintable()):
            object.__setattr__(self, "reason", safe_text(reason))


@dataclass(frozen=True, slots=True)
class Placement:
    """A pod that holds resources, as a front-end sees it (`Engine.placement`): its request, its node, and the
    allocation it took (None: bound without a verified one, or it asks for no plugin's devices).

    `by_count`: bound without a verified allocation and set aside by count (`Engine.admit_by_count`): `allocation`
    and `parts` name the devices the ledger set aside, not the ones the kubelet gave it, which are not known. A pod
    whose ids the node side published (`Engine.set_held_devices`) is not by count: `parts` name exactly those, and
    `allocation` is None."""

    request: PodRequest
    node: str
    allocation: AllocationRecord | None
    by_count: bool = False
    parts: Mapping[str, PluginAllocation] = field(default_factory=dict)  # plugin -> what it holds (the ledger's)


def fit_order(pod: PodRequest) -> tuple[tuple[str, int], ...]:
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


# -- Permit and gangs ---------------------------------------------------------------------------------------------


class PermitCode(Enum):
    """kube-scheduler's Permit answers: bind now, wait (holding the reservation), or give the reservation back."""

    APPROVE = "approve"
    WAIT = "wait"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One Permit plugin's answer for one reserved pod. `timeout`: seconds a WAIT may last at most; `release`: pods
    waiting at Permit that this APPROVE lets go too (the last member of a gang approves the others)."""

    code: PermitCode
    reason: str | None = None
    timeout: float | None = None
    release: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PermitAnswer:
    """The Permit stage's answer for a reserved pod (`Engine.permit`): APPROVE (bind it, and `approved`, the waiting
    pods let go with it), WAIT until `deadline` (its reservation kept), or REJECT (its reservation given back)."""

    pod: str
    code: PermitCode
    node: str | None = None
    reason: str | None = None
    deadline: float | None = None
    approved: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Waiting:
    """A reserved pod waiting at Permit: its request, node, deadline (the caller's clock), and why it waits."""

    pod: PodRequest
    node: str
    deadline: float
    reason: str


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """The outcome of `Engine.place_gang`: every member's decision (`decisions`, in rank order; the unplaced ones
    refused), whether at least `minMember` hold places (`placed`), the domain chosen (`level`, `domain`: None when
    the gang asked for none), and else one line saying why nothing is held."""

    gang: str
    placed: bool
    decisions: tuple[Decision, ...] = ()
    level: str | None = None
    domain: str | None = None
    reason: str | None = None
    code: Code = Code.SUCCESS


@dataclass(frozen=True, slots=True)
class GangPreemption:
    """The outcome of `Engine.preempt_gang`: the domain (`level`, `domain`) whose `victims` (pod keys) to evict so
    the gang fits there whole, with the budgets that eviction violates; or why no domain would do (`reason`)."""

    gang: str
    level: str | None = None
    domain: str | None = None
    victims: tuple[str, ...] = ()
    violations: int = 0
    reason: str | None = None
