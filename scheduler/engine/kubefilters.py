"""kube-scheduler 1.20's filters in its order: the node-local ones as `NodeFilter` objects (NodeUnschedulable, the
Ready condition, TaintToleration, NodeAffinity, which read only the node, then NodePorts, NodeResourcesFit and
VolumeBinding, which read what is in use, and 1.34's DynamicResources: DRA claims, `kubegpu.scheduler.dra`), then the
cluster-wide ones as `ClusterFilter` objects (PodTopologySpread, InterPodAffinity), whose PreFilter state the engine
makes once per pod and generation (`Filtering._cluster_state`). The rules themselves are pure functions in
`kubegpu.scheduler.filters` and `kubegpu.scheduler.podindex`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubegpu.core.models import PodRequest
from kubegpu.core.status import Code, Status
from kubegpu.scheduler import filters, podindex
from kubegpu.scheduler.engine.framework import (
    ClusterContext,
    ClusterFilter,
    FilterContext,
    Judge,
    NodeFilter,
    Refused,
)
from kubegpu.scheduler.engine.records import NodeRecord, Plan

NOT_READY = "node(s) had condition Ready=False"


class NodeUnschedulable:
    name, reads_usage = "NodeUnschedulable", False

    def applies(self, pod: PodRequest) -> bool:
        return True

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        if record.info.unschedulable and not filters.tolerates_unschedulable(pod.tolerations):
            return Status.unresolvable(filters.UNSCHEDULABLE)
        return None


class NodeReady:
    """Not a kube-scheduler plugin (its node lifecycle controller taints such nodes); no profile names it."""

    name, reads_usage = "NodeReady", False

    def applies(self, pod: PodRequest) -> bool:
        return True

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        return None if record.info.ready else Status.unresolvable(NOT_READY)


class TaintToleration:
    name, reads_usage = "TaintToleration", False

    def applies(self, pod: PodRequest) -> bool:
        return True

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        for taint in record.info.taints:
            if taint.effect == "PreferNoSchedule":
                continue
            if not any(t.tolerates(taint) for t in pod.tolerations):
                return Status.unresolvable(
                    f"node(s) had taint {{{taint.key}: {taint.value or ''}}}, that the pod didn't tolerate"
                )
        return None


class NodeAffinity:
    name, reads_usage = "NodeAffinity", False

    def applies(self, pod: PodRequest) -> bool:
        return bool(pod.node_selector) or pod.node_affinity is not None

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        info = record.info
        if (pod.node_selector or pod.node_affinity is not None) and not filters.matches_node_affinity(
            pod, info.name, info.labels
        ):
            return Status.unresolvable(filters.NODE_SELECTOR)
        return None


class NodePorts:
    name, reads_usage = "NodePorts", True

    def applies(self, pod: PodRequest) -> bool:
        return bool(pod.host_ports)

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        if pod.host_ports and filters.ports_conflict(pod.host_ports, record.ports):
            return Status.unschedulable(filters.PORTS)
        return None


# NodeResourcesFit's refusals by their reasons (and whether unresolvable), made once: ~100,000 of them a replay.
_SHORT: dict[tuple[bool, bool, tuple[str, ...]], Status] = {}


class NodeResourcesFit:
    """Every resource the node lacks, as kube-scheduler lists them; unresolvable only when the one resource short
    exceeds what the node has at all. A device plugin's resource that the node does not list at all is left to the
    plugin where the plugin's books count it (`Headroom.unlisted`), as the kubelet leaves it. The cycle's capacity
    index stands in for it (a node offering too little is not filtered): with it off, the index refuses no node."""

    name, reads_usage = "NodeResourcesFit", True

    def applies(self, pod: PodRequest) -> bool:
        return True

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        allocatable, used = record.info.allocatable, record.used
        room = allocatable.get("pods", 0) - used["pods"] >= 1
        short: list[str] | None = None  # the resources short, named only where some are
        hopeless = False
        for resource, need in plan.fit:
            have = allocatable.get(resource)
            if have is None:
                if any(resource in headroom.unlisted for headroom in record.headroom.values()):
                    continue  # the plugin's books count it (`Headroom.unlisted`), and the kubelet admits it
                have = 0
            if have - used[resource] < need:
                if short is None:
                    short = []
                short.append(resource)
                hopeless = hopeless or have < need
        if short is None:
            return None if room else _short(False, room, ())
        return _short(hopeless and room and len(short) == 1, room, tuple(short))


def _short(hopeless: bool, room: bool, resources: tuple[str, ...]) -> Status:
    """NodeResourcesFit's refusal: too many pods unless there is `room`, then each resource short, unresolvable when
    `hopeless` (the one resource short exceeds what the node has at all); a status is immutable: each made once."""
    key = (hopeless, room, resources)
    status = _SHORT.get(key)
    if status is None:
        if len(_SHORT) >= 4096:
            _SHORT.clear()
        reasons = ([] if room else [filters.TOO_MANY_PODS]) + [f"Insufficient {resource}" for resource in resources]
        status = _SHORT[key] = Status.unresolvable(*reasons) if hopeless else Status.unschedulable(*reasons)
    return status


class VolumeBinding:
    """For claims already bound: the volume's node affinity must select the node. Claims that still need a volume
    are refused: kubegpu does not bind volumes. A claim missing or being deleted is named first, bound or not, as
    kube-scheduler 1.20's PreFilter names it (`podHasPVCs`). Runs only when a front-end reports volumes."""

    name, reads_usage = "VolumeBinding", True

    def applies(self, pod: PodRequest) -> bool:
        return bool(pod.claims)

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        if not pod.claims or not engine.track_volumes:
            return None
        claims = engine.claims
        for claim in pod.claims:
            key = (pod.namespace, claim)
            if key not in claims:
                return Status.unresolvable(f'persistentvolumeclaim "{claim}" not found')
            if key in engine.deleting_claims:
                return Status.unresolvable(f'persistentvolumeclaim "{claim}" is being deleted')
        info = record.info
        for claim in pod.claims:
            volume = claims[(pod.namespace, claim)]
            if not volume:
                return Status.unresolvable(
                    f"pod has unbound immediate PersistentVolumeClaims (claim {claim!r} has no volume yet; kubegpu "
                    "places pods only with claims already bound to a volume)"
                )
            if volume not in engine.volumes:
                return Status.unresolvable(filters.PV_NOT_EXIST)
            terms = engine.volumes[volume]
            if terms is not None and not filters.node_matches_terms(terms, info.name, info.labels):
                return Status.unresolvable(filters.VOLUME_NODE_AFFINITY)
        return None


class DynamicResources:
    """kube-scheduler's DynamicResources Filter: the pod's ResourceClaims can all be allocated (or are allocated)
    for the node (`kubegpu.scheduler.dra`)."""

    name, reads_usage = "DynamicResources", True

    def applies(self, pod: PodRequest) -> bool:
        return bool(pod.resource_claims)

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        return engine.dra.fit(record.info.name, record.info.labels, pod)


# The built-in node filters by name, in the order they run.
KUBE_FILTERS: tuple[NodeFilter, ...] = (
    NodeUnschedulable(),
    NodeReady(),
    TaintToleration(),
    NodeAffinity(),
    NodePorts(),
    NodeResourcesFit(),
    VolumeBinding(),
    DynamicResources(),
)


class _Refusals:
    """A cluster-wide filter's refusals in one cycle, each a status made once: a judge is asked about every node."""

    __slots__ = ("known",)

    def __init__(self) -> None:
        self.known: dict[tuple[str, ...], Status] = {}

    def __call__(self, reasons: tuple[str, ...], resolvable: bool) -> Status:
        status = self.known.get(reasons)
        if status is None:
            status = self.known[reasons] = Status(Code.UNSCHEDULABLE if resolvable else Code.UNRESOLVABLE, reasons)
        return status


class PodTopologySpread:
    """The pod's DoNotSchedule constraints (its own, or the defaults its owners give it): a node whose domain would
    exceed the allowed skew is refused, unresolvable when it lacks a topology key. Its PreFilter names the refused
    nodes (`framework.Refused`): the domains over their limit and the nodes without a key, each looked up once."""

    name = "PodTopologySpread"

    def prefilter(self, engine: ClusterContext, pod: PodRequest, plan: Plan) -> Refused | None:
        constraints = plan.hard_spread
        if not constraints:
            return None
        state = podindex.spread_state(pod, engine.placed, engine.spread_domains(pod, constraints), constraints)
        refused: dict[str, Status] = {}
        # `filters.spread_fits` per node, a constraint at a time from the last: the first that refuses a node wins.
        unlabelled = Status.unresolvable(filters.SPREAD_LABEL)
        skewed = Status.unschedulable(filters.SPREAD)
        for key, count, limit in reversed(filters.spread_limits(state)):
            nodes = engine.nodes_by_value(key)
            if not count:
                over = []  # no domain counted: the constraint refuses only nodes without its key
            elif limit < 0:
                over = list(nodes.values.values())  # even an empty domain is over
            else:
                over = [nodes.values.get(value, ()) for value, found in count.items() if found > limit]
            for names in over:
                refused.update(dict.fromkeys(names, skewed))
            refused.update(dict.fromkeys(nodes.missing, unlabelled))
        return refused

    def nominated(
        self, engine: ClusterContext, record: NodeRecord, pod: PodRequest, plan: Plan, nominees: Sequence[PodRequest]
    ) -> Status | None:
        """The node's domain counts each nominee its constraints select (the pod's namespace) where the node's pods
        count at all (`Domains`), the global minimum taken again; the state is made afresh only when one does."""
        constraints = plan.hard_spread
        if not constraints:
            return None
        added = [
            sum(1 for n in nominees if n.namespace == pod.namespace and filters.selector_matches(c.selector, n.labels))
            for c in constraints
        ]
        if not any(added):
            return None
        domains = engine.spread_domains(pod, constraints)
        state = podindex.spread_state(pod, engine.placed, domains, constraints)
        labels = record.info.labels
        counts = []
        for constraint, count, eligible, more in zip(constraints, state.counts, domains, added, strict=True):
            if more and record.name in eligible.nodes:
                value = labels[constraint.topology_key]
                count = {**count, value: count.get(value, 0) + more}
            counts.append(count)
        minimum = tuple(filters.global_minimum(n, c.min_domains) for c, n in zip(constraints, counts, strict=True))
        found = filters.spread_fits(pod, filters.SpreadState(constraints, tuple(counts), minimum, state.own), labels)
        return None if found is None else Status.unschedulable(found[0])


class InterPodAffinity:
    """The pod's required affinity and anti-affinity terms against the placed pods, and the placed pods'
    anti-affinity terms against it. Without required affinity terms of its own, its PreFilter names the refused
    nodes (`framework.Refused`): those in a domain holding a pod its anti-affinity selects, or one whose
    anti-affinity selects it."""

    name = "InterPodAffinity"

    def prefilter(self, engine: ClusterContext, pod: PodRequest, plan: Plan) -> Judge | Refused | None:
        state = podindex.affinity_state(pod, engine.placed, engine.node_labels)
        if state is None or not filters.affinity_can_refuse(pod, state):
            return None
        if not pod.pod_affinity:
            # `filters.affinity_fits` per domain: its own anti-affinity terms' refusal before existing pods'.
            refused: dict[str, Status] = {}
            existing = Status.unschedulable(filters.AFFINITY, filters.EXISTING_ANTI_AFFINITY)
            for key, values in state.existing.items():
                by_value = engine.nodes_by_value(key).values
                for value in values:
                    refused.update(dict.fromkeys(by_value.get(value, ()), existing))
            anti = Status.unschedulable(filters.AFFINITY, filters.ANTI_AFFINITY_RULES)
            for (key, value), found in state.anti.items():
                if found > 0:
                    refused.update(dict.fromkeys(engine.nodes_by_value(key).values.get(value, ()), anti))
            return refused
        refusal = _Refusals()

        def judge(labels: Mapping[str, str]) -> Status | None:
            reasons = filters.affinity_fits(pod, state, labels)
            return refusal(reasons, reasons[1] != filters.AFFINITY_RULES) if reasons else None

        return judge

    def nominated(
        self, engine: ClusterContext, record: NodeRecord, pod: PodRequest, plan: Plan, nominees: Sequence[PodRequest]
    ) -> Status | None:
        """A nominee on the node is in each of its domains: the pod's anti-affinity term that selects one refuses the
        node where the node has the term's key, and so does a nominee's term that selects the pod. The pod's own
        affinity terms cannot refuse it now: a nominee only adds to the counts of the node's own domains (kube-
        scheduler counts a pod that matches all the terms), and a node lacking a term's key was refused already."""
        labels, namespace_labels = record.info.labels, engine.placed.namespace_labels
        for term in pod.pod_anti_affinity:
            if term.topology_key in labels and any(
                filters.pod_matches_term(term, n, namespace_labels) for n in nominees
            ):
                return Status.unschedulable(filters.AFFINITY, filters.ANTI_AFFINITY_RULES)
        for nominee in nominees:
            for term in nominee.pod_anti_affinity:
                if term.topology_key in labels and filters.pod_matches_term(term, pod, namespace_labels):
                    return Status.unschedulable(filters.AFFINITY, filters.EXISTING_ANTI_AFFINITY)
        return None


# kube-scheduler's cluster-wide filters by name, in the order they run (after every node-local one).
CLUSTER_FILTERS: tuple[ClusterFilter, ...] = (PodTopologySpread(), InterPodAffinity())


def enabled_filters(
    extra: tuple[NodeFilter, ...], off: frozenset[str]
) -> tuple[tuple[NodeFilter, ...], tuple[ClusterFilter, ...]]:
    """The built-in node filters then `extra`, and the cluster-wide filters, less those the profile turns off by
    name; a name given twice is refused."""
    names = [f.name for f in (*KUBE_FILTERS, *extra)] + [f.name for f in CLUSTER_FILTERS]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"filter(s) named twice: {', '.join(twice)}")
    return (
        tuple(f for f in (*KUBE_FILTERS, *extra) if f.name not in off),
        tuple(f for f in CLUSTER_FILTERS if f.name not in off),
    )
