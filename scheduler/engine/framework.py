"""The shapes of the engine's rules: every rule is a named object, enabled, disabled and weighed by name through
the profile (`scores.Profile`), kube-scheduler's own as much as a third party's.

* `NodeFilter` (PreFilter, Filter) judges one node from the node and what is in use on it; kube-scheduler 1.20's
  node-local filters are in `kubefilters.py`.
* `ClusterFilter` (PreFilter, Filter) reads the pods on other nodes: its PreFilter state is made once per pod and
  generation, and judges a node by its labels (PodTopologySpread, InterPodAffinity, in `kubefilters.py` too).
* `ScorePlugin` (PreScore, Score, NormalizeScore) ranks the feasible nodes; kube-scheduler's are in `kubescores.py`.
* `PreEnqueuePlugin` (PreEnqueue) keeps a pod out of the queue until it may be tried, and `QueueSortPlugin`
  (QueueSort) orders the queue; kube-scheduler's SchedulingGates and PrioritySort are in `enqueue.py`.

An `Engine` takes more through its `filters` and `scores` arguments, and a plugin adds them through the
`kubegpu_scheduler_rules` hook (`rules.py` guards those). Plain objects on the hot path, called only when a node's
remembered answer is stale (`Filtering.check`); pluggy stays the boundary for external code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any, Protocol

from kubegpu.core.models import NodeSelectorTerm, PodRequest, SpreadConstraint
from kubegpu.core.status import Status
from kubegpu.scheduler.dra import DraBook
from kubegpu.scheduler.engine.records import NodeRecord, NodesByValue, Plan, Verdict
from kubegpu.scheduler.podindex import Domains, PodIndex
from kubegpu.scheduler.scores import Profile


class FilterContext(Protocol):
    """What a node filter may read of the engine besides the node: the claims and volumes a front-end reports, and
    the DRA objects (`DraBook`)."""

    track_volumes: bool
    claims: dict[tuple[str, str], str]
    deleting_claims: set[tuple[str, str]]
    volumes: dict[str, tuple[NodeSelectorTerm, ...] | None]
    dra: DraBook


class NodeFilter(Protocol):
    """One rule of the Filter extension point, for one node.

    `name`: kube-scheduler's plugin name (or the rule's own, for a third party), by which a profile disables it.
    `reads_usage`: False when the rule reads only the node (its labels, taints, conditions), never what is in use:
    such rules run first, and one's unresolvable refusal settles every node of the node's class at once.
    `applies` is its PreFilter: False when the rule cannot refuse the pod on any node (a pod without a node
    selector and NodeAffinity), so the pod's cycle skips it; asked once per pod plan.
    `filter` returns None when the node passes, else a `Status` whose reasons are kube-scheduler's sentences:
    unresolvable when no eviction could change it, unschedulable when pods leaving could.
    """

    name: str
    reads_usage: bool

    def applies(self, pod: PodRequest) -> bool: ...

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None: ...


# A cluster-wide filter's judge of one node, by its labels: None when the node passes, else the refusal.
Judge = Callable[[Mapping[str, str]], "Status | None"]
# A cluster-wide filter's refusals by node name, when its state names the topology domains it refuses: every node of
# such a domain (or lacking a topology key it needs) is in it, every node not in it passes. A cycle then looks a node
# up instead of asking a judge: one result per domain, shared by all its nodes.
Refused = Mapping[str, "Status"]


class ClusterFilter(Protocol):
    """One rule of the Filter extension point that reads pods on other nodes (kube-scheduler's PodTopologySpread and
    InterPodAffinity).

    `name`: the plugin's name, by which a profile disables it.
    `prefilter` is its PreFilter: the pod's state over the placed pods, made once per pod and generation, as the judge
    of one node's labels, or as the nodes it refuses by name (`Refused`); None when the rule cannot refuse the pod on
    any node (the cycle then skips it).
    `nominated` is its PreFilter extension AddPod as kube-scheduler's first filter pass uses it
    (`addNominatedPods`): the answer for node `record`, which passes the rule as it is, once the preempting pods
    `nominees` held there are counted as placed on it; None when they change nothing. Asked only of a held node.
    """

    name: str

    def prefilter(self, engine: ClusterContext, pod: PodRequest, plan: Plan) -> Judge | Refused | None: ...

    def nominated(
        self, engine: ClusterContext, record: NodeRecord, pod: PodRequest, plan: Plan, nominees: Sequence[PodRequest]
    ) -> Status | None: ...


class ClusterContext(FilterContext, Protocol):
    """What a cluster-wide rule reads of the engine besides the node: the placed pods, a node's labels by name, and
    the nodes whose pods a spread constraint counts."""

    @property
    def placed(self) -> PodIndex: ...

    def node_labels(self, name: str) -> Mapping[str, str] | None: ...

    def spread_domains(self, pod: PodRequest, constraints: Sequence[SpreadConstraint]) -> tuple[Domains, ...]: ...

    def nodes_by_value(self, key: str) -> NodesByValue: ...


class ScoreContext(ClusterContext, Protocol):
    """What a score plugin reads of the engine: the above, and what the engine keeps for the scores (the profile,
    the nodes with a PreferNoSchedule taint, the device plugins' score and usage on a node, the images nodes list and
    the controllers their preferAvoidPods annotations name)."""

    nodes: dict[str, NodeRecord]
    scoring: Profile

    @property
    def soft_tainted(self) -> Set[str]: ...

    @property
    def image_nodes(self) -> Mapping[str, int]: ...

    def device_score(self, record: NodeRecord, pod: PodRequest) -> float: ...

    def device_scores(self, records: Sequence[NodeRecord], pod: PodRequest) -> list[float]: ...

    def device_usage(self, record: NodeRecord, pod: PodRequest) -> float | None: ...

    def fragmentation_score(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> float: ...

    def fragmentation_scores(self, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan) -> list[float]: ...

    def fragmentation_matters(self, pod: PodRequest, plan: Plan) -> bool: ...

    def avoiding(self, pod: PodRequest) -> tuple[str, str] | None: ...

    def avoided_on(self, name: str) -> frozenset[tuple[str, str]]: ...

    def listed_images(self, pod: PodRequest) -> tuple[str, ...]: ...

    def images_matter(self, pod: PodRequest) -> bool: ...


class ScorePlugin(Protocol):
    """One rule of the PreScore, Score and NormalizeScore extension points.

    `name`: the plugin's name; a profile weighs it by that name (weight 0 or absent: off).
    `local`: True when its raw score reads only the node and the pod's spec (what `Plan.local` holds): the engine
    remembers such raw scores per node version and pod shape, and asks only about nodes that changed. Else it is asked
    about every feasible node in each cycle.
    `prescore` is its PreScore: the pod's state for the cycle, or None when the plugin would score every node alike
    (it is then skipped). A local plugin's state must follow from the pod's spec alone.
    `score` gives the raw scores of `records`, in their order; `normalize` maps the raw scores of every feasible node
    to 0..100 (kube-scheduler's NormalizeScore; the identity where the raw score is already one).
    `matters`: whether the plugin may rank the pod's feasible nodes otherwise than the capacity order a cycle finds
    them in (the policy's): a cycle then scores as many feasible nodes as kube-scheduler would find, else the first
    few (`Scoring._sample_size`). Cheaper than `prescore`, and asked before the cycle filters.
    """

    name: str
    local: bool

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool: ...

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None: ...

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]: ...

    def normalize(self, state: object, raw: list[float]) -> list[float]: ...


class PermitPlugin(Protocol):
    """One rule of the Permit extension point, asked after a pod's devices are reserved (`Engine.permit`).

    `name`: the rule's name, given in its refusals. `permit` answers a `Verdict`: APPROVE, WAIT with a timeout in
    seconds (the pod keeps its reservation; the front-end binds it once approved, `Engine.allow`), or REJECT with a
    reason (the engine gives the reservation back). It reads the engine (`engine.pods`, `engine.waiting`) and never
    changes it. The built-in Coscheduling rule (`permit.py`) runs first; an `Engine` takes more through `permits`.
    A rule that raises or answers anything else rejects that pod only, with a reason naming the rule.
    """

    name: str

    def permit(self, engine: Any, pod: PodRequest, node: str) -> Verdict: ...


class PreEnqueuePlugin(Protocol):
    """One rule of the PreEnqueue extension point: whether a pending pod may enter the scheduling queue at all.

    `name`: kube-scheduler's plugin name (or the rule's own), by which a profile disables it. `pre_enqueue` returns
    None when the pod may be queued, else a `Status` (unresolvable: no cycle can help) whose reason says what the pod
    waits for; the front-end keeps the pod out of its queue, counted as gated, until an update to the pod makes every
    rule answer None. Asked on every add or update of a pending pod, from its spec alone: it must be cheap and must
    not read the cluster. The built-in SchedulingGates is in `enqueue.py`; an `Engine` takes more through
    `pre_enqueue`.
    """

    name: str

    def pre_enqueue(self, pod: PodRequest) -> Status | None: ...


class QueuedPod(Protocol):
    """A pod as a queue holds it, what a QueueSort plugin orders (kube-scheduler's `QueuedPodInfo`): the pod and when
    it entered the queue (a monotonic time)."""

    @property
    def request(self) -> PodRequest: ...

    @property
    def arrival(self) -> float: ...


class QueueSortPlugin(Protocol):
    """The QueueSort extension point: the order in which the queue's ready pods are tried (one per profile, as
    kube-scheduler requires; the built-in PrioritySort is in `enqueue.py`).

    `name`: kube-scheduler's plugin name. `key` is a queued pod's sort key: the queue tries the smallest first
    (kube-scheduler's `Less(a, b)` is `key(a) < key(b)`). `arrival_order` says whether `queued` are in this order
    when taken in the order they entered the queue (the queue then takes them without sorting: the common case of pods
    that all share one priority). Both run on the scheduling thread for every ready pod: keep them plain.
    """

    name: str

    def key(self, queued: QueuedPod) -> Any: ...

    def arrival_order(self, queued: Iterable[QueuedPod]) -> bool: ...
