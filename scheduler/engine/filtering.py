"""The Filter extension point: the enabled node filters in kube-scheduler 1.20's order (NodeUnschedulable,
TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, VolumeBinding, then a third party's), the cluster-wide
ones with their PreFilter state made once per pod and generation (PodTopologySpread, InterPodAffinity:
`_cluster_state`), then each device plugin's fit. Also how a
cycle counts refusals as kube-scheduler reports them (`_refuse`, `_refused`, `_tally`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kubegpu.core.models import (
    PodRequest,
    SpreadConstraint,
)
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.core.status import Code, Status
from kubegpu.scheduler import filters
from kubegpu.scheduler.engine.cache import count_on_node
from kubegpu.scheduler.engine.plan import Planning
from kubegpu.scheduler.engine.records import (
    ClassTally,
    ClusterState,
    Decision,
    NodeRecord,
    NodesByValue,
    Passing,
    Plan,
    Refusals,
    Settled,
    make_room,
    summarize_reasons,
)
from kubegpu.scheduler.podgroups import gang_key
from kubegpu.scheduler.podindex import Domains, PodIndex

FIT_HOOK = "kubegpu_scheduler_fit"
STATE_POD_PREPARED = ("state", "pod", "prepared")  # the fit and score hooks' arguments, as the engine gives them
NOMINATED = "node(s) were nominated for a pending pod of equal or higher priority that is preempting pods there"
# A node held for a preempting pod that the pod asking would leave short (`Filtering._nominee_refusal`): what it lacks
# is named (a resource, or a plugin's devices), the nominee is not (it may be another tenant's pod).
NOMINATED_SHORT = NOMINATED + ", and would not have {} left for it beside this pod"
# Such a node refused by a cluster-wide rule once its nominees are counted there (`ClusterFilter.nominated`), by the
# rule's reason: kube-scheduler's first filter pass. The nominee is not named here either.
NOMINATED_RULES = {
    filters.ANTI_AFFINITY_RULES: NOMINATED + ", and this pod's anti-affinity rules select it",
    filters.EXISTING_ANTI_AFFINITY: NOMINATED + ", and its anti-affinity rules select this pod",
    filters.SPREAD: NOMINATED + ", and this pod's topology spread constraints count it there",
}


def gang_nominee(gang: str) -> str:
    """How a preempting gang (`namespace/name`) is named among a node's `nominees` (never a pod's key: no `/` leads)."""
    return f"/gang/{gang}"


class Filtering(Planning):
    """Kubernetes' filters and the device plugins' fit for one node, and counting refusals."""

    def _basic_fit(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        """Kubernetes' node-local filters in kube-scheduler 1.20's order (`kubefilters.KUBE_FILTERS`, then the
        engine's own `filters`, less those the profile turns off); the first that refuses answers, so each node is
        counted under the reason kube-scheduler would give."""
        return self._node_fit(record, pod, plan) or self._usage_fit(record, pod, plan)

    def _node_fit(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        """The filters that read only the node, not what is in use on it (NodeUnschedulable, the Ready condition,
        TaintToleration, NodeAffinity). They run first, so a refusal of theirs is every node of the class's."""
        for rule in plan.node_rules:
            status = rule(self, record, pod, plan)
            if status is not None:
                return status
        return None

    def _usage_fit(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        """The filters after `_node_fit` that read what is in use on the node (NodePorts, NodeResourcesFit,
        VolumeBinding)."""
        for rule in plan.usage_rules:
            status = rule(self, record, pod, plan)
            if status is not None:
                return status
        return None

    def _cluster_state(self, pod: PodRequest, plan: Plan) -> ClusterState:
        """The pod's PreFilter state for the enabled cluster-wide filters (`kubefilters.CLUSTER_FILTERS`),
        remembered for the generation, as one judge of a node (by name and labels): called for every node a cycle
        visits, so the filters that cannot refuse any node are left out here once. When every rule named the nodes it
        refuses (`framework.Refused`), those are merged, the first rule's refusal of a node kept: a cycle looks a
        node up there."""
        cached = self._cluster
        if cached is not None and cached.pod is pod and cached.plan is plan and cached.generation == self.generation:
            return cached
        parts = [part for rule in self._cluster_filters if (part := rule.prefilter(self, pod, plan)) is not None]
        judge: Callable[[str, Mapping[str, str]], Status | None] | None
        refused: Mapping[str, Status] | None = None
        if not parts:
            judge = None  # no rule can refuse a node: a cycle then asks no node's labels
        elif all(isinstance(part, Mapping) for part in parts):
            merged: dict[str, Status] = {}
            for part in reversed(parts):  # the first rule's refusal of a node is the one kept
                if isinstance(part, Mapping):
                    merged.update(part)
            refused = merged

            def judge(name: str, labels: Mapping[str, str]) -> Status | None:
                return merged.get(name)

        else:

            def judge(name: str, labels: Mapping[str, str]) -> Status | None:
                for part in parts:
                    status = part.get(name) if isinstance(part, Mapping) else part(labels)
                    if status is not None:
                        return status
                return None

        self._cluster = state = ClusterState(pod, plan, self.generation, judge, refused)
        return state

    def nodes_by_value(self, key: str) -> NodesByValue:
        """The nodes by their value of label `key`, and those without it (what a rule needs to name the nodes of the
        topology domains it refuses), remembered until a node is added, changed or removed (`_node_epoch`)."""
        known = self._by_value.get(key)
        if known is not None and known[0] == self._node_epoch:
            return known[1]
        values: dict[str, list[str]] = {}
        missing: list[str] = []
        for name, record in self.nodes.items():
            value = record.info.labels.get(key)
            if value is None:
                missing.append(name)
            else:
                values.setdefault(value, []).append(name)
        found = NodesByValue({value: tuple(names) for value, names in values.items()}, tuple(missing))
        if len(self._by_value) >= 64:
            self._by_value.clear()
        self._by_value[key] = (self._node_epoch, found)
        return found

    @property
    def placed(self) -> PodIndex:
        """The placed pods, indexed by namespace, labels and inter-pod terms (the cluster-wide rules read them)."""
        return self._placed

    def node_labels(self, name: str) -> Mapping[str, str] | None:
        """A node's labels by name; None for a node the engine does not know."""
        return self._labels(name)

    def spread_domains(self, pod: PodRequest, constraints: Sequence[SpreadConstraint]) -> tuple[Domains, ...]:
        """Per constraint, the nodes whose pods count for it (`_spread_domains`)."""
        return self._spread_domains(pod, constraints)

    def _labels(self, name: str) -> Mapping[str, str] | None:
        record = self.nodes.get(name)
        return record.info.labels if record is not None else None

    def _spread_domains(self, pod: PodRequest, constraints: Sequence[SpreadConstraint]) -> tuple[Domains, ...]:
        """Per constraint, the nodes whose pods count for it (`podindex.Domains`, one per node inclusion policy the
        constraints use), remembered until a node is added, changed or removed."""
        keys = tuple(c.topology_key for c in constraints)
        found: dict[tuple[bool, bool], Domains] = {}
        for constraint in constraints:
            policy = constraint.inclusion
            if policy in found:
                continue
            honor_affinity, honor_taints = policy
            slot = (
                keys,
                policy,
                tuple(sorted(pod.node_selector.items())) if honor_affinity else (),
                pod.node_affinity if honor_affinity else None,
                pod.tolerations if honor_taints else (),
            )
            known = self._domains.get(slot)
            if known is not None and known[0] == self._node_epoch:
                found[policy] = known[1]
                continue
            nodes = ((r.name, r.info.labels, r.info.taints) for r in self.nodes.values())
            found[policy] = domains = Domains.of(pod, keys, nodes, constraint)
            if len(self._domains) >= 256:
                self._domains.clear()
            self._domains[slot] = (self._node_epoch, domains)
        return tuple(found[c.inclusion] for c in constraints)

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
            fit = self._fit_calls.get(plugin)
            if fit is None:
                fit = self._fit_calls[plugin] = self.plugins.bound(plugin, FIT_HOOK, STATE_POD_PREPARED)
            try:
                status: Status = fit(state, pod, prepared)
            except PluginHookError as exc:
                return Status.error(str(exc), plugin=plugin)
            if not status.ok:
                # The plugin's own reason: on a ring with enough free devices but no contiguous window it names
                # contiguity, where the headroom (the largest valid set) would only say "Insufficient".
                return status
            for resource, need in needs:  # the first resource short
                if free.get(resource, 0) < need:
                    return Status.unschedulable(f"Insufficient {resource}", plugin=plugin)
        return Status.success()

    def check(
        self,
        record: NodeRecord,
        pod: PodRequest,
        plan: Plan,
        *,
        placing: bool = True,
        judge: Callable[[str, Mapping[str, str]], Status | None] | None = None,
    ) -> Status:
        """The whole filter phase for one node: Kubernetes' own filters, then each plugin's device fit.

        The node remembers its last node-local answers (`Plan.local`); an unchanged node asked about a pod alike in
        what they read (the next replica of a workload, the extender's prioritize after its filter) answers from
        memory, and only the filters that read other pods run again. A node that is not live (`set_node_live`)
        refuses device pods unless `placing` is false (counting a pod its kubelet already runs).
        """
        if self._dead and plan.devices and placing and (dead := self._dead.get(record.name)) is not None:
            return Status.unresolvable(dead)
        memo = record.last_check
        remembered = memo.get(id(plan.local))
        if remembered is None or remembered[0] != record.version or remembered[1] is not plan.local:
            make_room(memo, id(plan.local))
            remembered = memo[id(plan.local)] = (record.version, plan.local, self._basic_fit(record, pod, plan), None)
        status = remembered[2]
        if status is None and plan.volatile:
            # `judge`: the cluster-wide filters' judge for this pod, when the caller took it for a pass over nodes.
            judging = judge or self._cluster_state(pod, plan).judge
            if judging is not None:
                status = judging(record.name, record.info.labels)
        if status is None:
            status = remembered[3]
            if status is None:
                status = self._device_fit(record, pod, plan)
                memo[id(plan.local)] = (remembered[0], remembered[1], None, status)
        if record.nominees and status.ok:
            return self._nominee_refusal(record, pod, plan) or status
        return status

    def _nominee_refusal(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        """Why a node held for preempting pods (`nominate`) refuses `pod`, which fits there as it is now; None when
        it takes only room they leave. kube-scheduler's `addNominatedPods`: the nominees of the pod's priority or
        higher (not the pod itself, nor its own gang) are counted as if running, on top of what is in use, their
        victims still counted, and the pod must still pass the filters that read the node's usage (NodeResourcesFit,
        NodePorts, ...) and the cluster-wide ones, for which the nominees are placed on this node
        (`ClusterFilter.nominated`: an anti-affinity term either way, the pod's spread constraints). Devices are
        more than a count: on each plugin both ask, the pod's own allocation is taken (what `reserve` would choose
        now), the pods being deleted there are given back (`leaving`: the nominees' victims), and each nominee,
        highest priority first, must still find a valid set in what remains; else the pod would take the set a
        nominee needs (the window of a ring, a torus's block, the GPU with room for its share). A node held for a
        preempting gang (`nominate_gang`) refuses every pod of equal or lower priority but the gang's own: which
        members go to which node of the domain is decided only when the gang is placed."""
        nominees: list[PodRequest] = []
        mine: str | None = None
        for key, priority in record.nominees.items():
            if priority < pod.priority or key == pod.key:
                continue
            if mine is None:
                gang = gang_key(pod)
                mine = "" if gang is None else gang_nominee(gang)
            if key == mine:
                continue
            nominee = self.nominee_requests.get(key)
            if nominee is None:  # a gang's hold (or a nominee the engine cannot read): the whole node
                return Status.unschedulable(NOMINATED)
            nominees.append(nominee)
        if not nominees:
            return None
        nominees.sort(key=lambda nominee: -nominee.priority)
        copy = record.usage_copy()
        for nominee in nominees:
            count_on_node(copy, nominee, +1)
        status = self._usage_fit(copy, pod, plan)
        if status is not None:
            short = [r.removeprefix("Insufficient ") for r in status.reasons if r.startswith("Insufficient ")]
            if short and len(short) == len(status.reasons):
                return Status.unschedulable(NOMINATED_SHORT.format(", ".join(short)))
            return Status.unschedulable(NOMINATED)
        # The cluster-wide rules, where one can read a nominee: the pod's own terms or constraints (a volatile plan),
        # or a nominee's anti-affinity; a pod with neither, the usual case, is not asked them.
        if plan.volatile or any(nominee.pod_anti_affinity for nominee in nominees):
            for rule in self._cluster_filters:
                status = rule.nominated(self, record, pod, plan, nominees)
                if status is not None:
                    return Status.unschedulable(NOMINATED_RULES.get(status.reasons[-1], NOMINATED))
        plans = [(nominee, self.plan(nominee)) for nominee in nominees]
        for plugin, needs in plan.devices:
            theirs = [(n, p.prepared.get(plugin)) for n, p in plans if any(plugin == owner for owner, _ in p.devices)]
            if theirs and not self._devices_left(record, plugin, pod, plan.prepared.get(plugin), theirs):
                return Status.unschedulable(NOMINATED_SHORT.format(needs[0][0]), plugin=plugin)
        return None

    def _passing_nodes(self, plan: Plan) -> set[str]:
        """The nodes known to pass the shape's node-local filters and device fit now (`Passing`): a cycle asks such
        a node only its nominees and the cluster-wide filters, without `check`'s memo lookups."""
        key, generation = id(plan.local), self.generation
        known = self._passing.get(key)
        if known is not None and known.local is plan.local:
            if known.generation != generation:
                changed = self.changed_since(known.generation)
                if changed is None:
                    known.nodes.clear()
                else:
                    known.nodes.difference_update(changed)
                known.generation = generation
            return known.nodes
        if len(self._passing) >= 256:
            self._passing.clear()
        known = self._passing[key] = Passing(plan.local, generation)
        return known.nodes

    def _passes_locally(self, record: NodeRecord, plan: Plan) -> bool:
        """Whether the node's remembered answers (`check`'s memo, at its current version) pass the shape's node-local
        filters and device fit, so that it may join `Passing`."""
        remembered = record.last_check.get(id(plan.local))
        if remembered is None or remembered[0] != record.version or remembered[1] is not plan.local:
            return False
        if remembered[2] is not None:
            return False
        device = remembered[3]
        return device.code is Code.SUCCESS if device is not None else not plan.devices

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
                settled[record.klass] = Settled(status, self._node_fit(record, pod, plan) is not None)
        return statuses

    def _refuse(self, refusals: Refusals, record: NodeRecord, pod: PodRequest, plan: Plan, status: Status) -> bool:
        """Count one node's refusal; True when it settles the node's class (`Settled`): no other node of it fits."""
        refusals.reasons.update(status.reasons)
        counted = refusals.counted.get(record.klass)
        if counted is None:
            counted = refusals.counted[record.klass] = []
        counted.append(record.name)
        if status.code is Code.UNRESOLVABLE and plan.settles:
            refusals.settled[record.klass] = Settled(status, self._node_fit(record, pod, plan) is not None)
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

    def _held_nodes(self) -> Iterable[str]:
        """The nodes held for preempting pods and gangs (`nominate`, `nominate_gang`): their answers depend on the
        pod asking, so no tally remembers them."""
        yield from self.nominated.values()
        for names in self.nominated_gangs.values():
            yield from names

    def _tally(self, klass: int, pod: PodRequest, plan: Plan, status: Status) -> ClassTally:
        """The answers of the class's nodes (`ClassTally`), remembered per (class, pod shape) and brought up to date
        with the nodes changed since; nodes awaiting a preempting pod are asked again each time (nominating one
        is no change of the node)."""
        return self._up_to_date(
            self._tallies, (klass, id(plan.local)), klass, plan, status,
            lambda record: self._refused_like(record, pod, plan, status),
        )  # fmt: skip

    def _skipped_tally(self, klass: int, pod: PodRequest, plan: Plan, resource: str) -> ClassTally | None:
        """Every node's answer in the class to the pod's shape (a node that would fit counted short of `resource`),
        for a cycle explaining the nodes its capacity index passed over: remembered per (class, pod shape, resource)
        and brought up to date with the nodes changed since, so a pod that fits nowhere costs what changed, not every
        node again. Nodes holding a nominee answer per pod and are asked again each time. None for a pod whose
        answers read more than the node (inter-pod rules, claims)."""
        if plan.volatile or pod.claims or pod.resource_claims:
            return None
        short = Status.unschedulable(f"Insufficient {resource}")

        def answer(record: NodeRecord) -> Status:
            status = self.check(record, pod, plan)
            return status if not status.ok else short

        return self._up_to_date(self._skipped, (klass, id(plan.local), resource), klass, plan, short, answer)

    def _up_to_date(
        self,
        memo: dict[Any, ClassTally],
        key: object,
        klass: int,
        plan: Plan,
        status: Status,
        answer: Callable[[NodeRecord], Status],
    ) -> ClassTally:
        """`memo[key]`, the class's answers to the pod's shape under `status`, made afresh (past 256 kept, all
        dropped) or brought up to date by asking `answer` of the nodes changed since and of those held for
        preempting pods and gangs."""
        tally = memo.get(key)
        changed: Iterable[str] | None = None
        if tally is not None and tally.local is plan.local and tally.status == status:
            changed = self.changed_since(tally.generation)
        members = self._class_nodes.get(klass, {})
        if tally is None or changed is None:
            tally = ClassTally(plan.local, status, self.generation)
            if len(memo) >= 256:
                memo.clear()
            memo[key] = tally
            changed = members
        elif self.nominated or self.nominated_gangs:
            changed = {*changed, *self._held_nodes()}
        answers = tally.answers
        for name in changed:  # the whole cluster's changes: most are another class's nodes, in neither
            if name in answers:
                tally.forget(name)
            if name in members:
                tally.learn(name, answer(self.nodes[name]))
        tally.generation = self.generation
        return tally


def held_whole_for_another(record: NodeRecord, pod: PodRequest, nominee_requests: Mapping[str, PodRequest]) -> bool:
    """Whether the node is held whole, whatever is evicted there, against `pod`: for a preempting gang (`nominate_gang`)
    of equal or higher priority, not `pod`'s own, or for a preempting pod of such a priority whose request the engine
    cannot read (`_nominee_refusal` refuses every pod there). A node held for preempting pods it can read is no
    such node: a preemption's dry run counts them there (`Preempting.preempt`)."""
    mine = None
    for key, priority in record.nominees.items():
        if priority >= pod.priority and key != pod.key and key not in nominee_requests:
            if mine is None:
                gang = gang_key(pod)
                mine = "" if gang is None else gang_nominee(gang)
            if key != mine:
                return True
    return False


def held_for_another(record: NodeRecord, pod: PodRequest) -> bool:
    """Whether the node is held (`nominate`, `nominate_gang`) for another preempting pod or gang of equal or higher
    priority than `pod` (neither `pod` itself nor its own gang)."""
    return held_whole_for_another(record, pod, {})
