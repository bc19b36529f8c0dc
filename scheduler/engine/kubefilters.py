"""kube-scheduler 1.20's node-local filters as `NodeFilter` objects, in its order: NodeUnschedulable, the Ready
condition, TaintToleration, NodeAffinity (those read only the node), then NodePorts, NodeResourcesFit and VolumeBinding
(those read what is in use). The rules themselves are pure functions in `kubegpu.scheduler.filters`; the cluster-wide
filters (InterPodAffinity, PodTopologySpread) need a PreFilter state and stay in `Filtering._cluster_state`.
"""

from __future__ import annotations

from kubegpu.core.models import PodRequest
from kubegpu.core.status import Status
from kubegpu.scheduler import filters
from kubegpu.scheduler.engine.framework import FilterContext, NodeFilter
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


class NodeResourcesFit:
    """Every resource the node lacks, as kube-scheduler lists them; unresolvable only when the one resource short
    exceeds what the node has at all."""

    name, reads_usage = "NodeResourcesFit", True

    def applies(self, pod: PodRequest) -> bool:
        return True

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        allocatable, used = record.info.allocatable, record.used
        short: list[str] = []
        hopeless = False
        if allocatable.get("pods", 0) - used["pods"] < 1:
            short.append(filters.TOO_MANY_PODS)
        for resource, need in plan.fit:
            have = allocatable.get(resource, 0)
            if have - used[resource] < need:
                short.append(f"Insufficient {resource}")
                hopeless = hopeless or have < need
        if not short:
            return None
        return Status.unresolvable(*short) if hopeless and len(short) == 1 else Status.unschedulable(*short)


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


# The built-in node filters by name, in the order they run.
KUBE_FILTERS: tuple[NodeFilter, ...] = (
    NodeUnschedulable(),
    NodeReady(),
    TaintToleration(),
    NodeAffinity(),
    NodePorts(),
    NodeResourcesFit(),
    VolumeBinding(),
)


def enabled_filters(extra: tuple[NodeFilter, ...], off: frozenset[str]) -> tuple[NodeFilter, ...]:
    """The built-in filters then `extra`, less those the profile turns off by name; a name given twice is refused."""
    names = [f.name for f in (*KUBE_FILTERS, *extra)]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"node filter(s) named twice: {', '.join(twice)}")
    return tuple(f for f in (*KUBE_FILTERS, *extra) if f.name not in off)
