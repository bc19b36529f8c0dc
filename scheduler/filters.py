"""Kubernetes' own filters, as pure functions over kubegpu's records, with kube-scheduler 1.20's rules and reasons.

The engine (`kubegpu.scheduler.engine`) runs them in kube-scheduler's default order, stopping at the first plugin
that refuses (as kube-scheduler does without `runAllFilters`): NodeUnschedulable, NodeResourcesFit, NodePorts,
NodeAffinity, TaintToleration, VolumeBinding, PodTopologySpread, InterPodAffinity; then the device plugins (where an
extender would run). Each refusal carries kube-scheduler's reason strings, so `0/5 nodes are available: ...` reads
the same whichever scheduler wrote it.

The node-local rules (selectors, affinity terms, host ports) are plain functions. The rules that look at the whole
cluster (pod affinity and anti-affinity, topology spread) first gather counts per topology pair over every node
(`affinity_counts`, `spread_counts`: kube-scheduler's PreFilter), then judge one node from those counts; the engine
computes the gathered state once per pod and cluster generation.

Left out, as kubegpu documents: volume binding of claims that are not bound yet (such a pod is refused with a
sentence saying so), CSI volume limits, VolumeZone and VolumeRestrictions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kubegpu.core.models import (
    HostPort,
    LabelSelector,
    NodeInfo,
    NodeSelectorTerm,
    PodAffinityTerm,
    PodRequest,
    Requirement,
    SpreadConstraint,
    Taint,
    Toleration,
)

__all__ = [
    "AffinityState",
    "NamespaceLabels",
    "SpreadState",
    "affinity_counts",
    "anti_affinity_matches",
    "matches_node_affinity",
    "namespace_named",
    "node_change_may_help",
    "node_matches_terms",
    "pod_matches_term",
    "ports_conflict",
    "requirement_matches",
    "selector_matches",
    "spread_counts",
    "spread_fits",
    "tolerates_unschedulable",
]

# Reasons, worded as kube-scheduler 1.20 words them.
UNSCHEDULABLE = "node(s) were unschedulable"
NODE_SELECTOR = "node(s) didn't match node selector"
PORTS = "node(s) didn't have free ports for the requested pod ports"
AFFINITY = "node(s) didn't match pod affinity/anti-affinity"
AFFINITY_RULES = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_RULES = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
SPREAD = "node(s) didn't match pod topology spread constraints"
SPREAD_LABEL = SPREAD + " (missing required label)"
VOLUME_NODE_AFFINITY = "node(s) had volume node affinity conflict"
PV_NOT_EXIST = "pvc(s) bound to non-existent pv(s)"  # kube-scheduler 1.20's VolumeBinding, ErrReasonPVNotExist
TOO_MANY_PODS = "Too many pods"
UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", None, "NoSchedule")
BIND_ALL = "0.0.0.0"


# ---------------------------------------------------------------------------------------------------------------
# Selectors
# ---------------------------------------------------------------------------------------------------------------


def node_change_may_help(previous: NodeInfo | None, info: NodeInfo) -> str | None:
    """What changed in a node that can make a pod which fit nowhere fit now, or None: kube-scheduler 1.20's
    `nodeSchedulingPropertiesChange`, which decides whether a Node update moves the unschedulable pods back.

    A new node can; so can a change to what the filters read: allocatable, labels, taints, the advertised device
    inventories (the plugins build their node state from labels, allocatable and inventory), `spec.unschedulable`
    lifted and the Ready condition regained (a node cordoned or gone NotReady refuses more, never less). Images and
    every other annotation (`preferAvoidPods`, the device side's reports) feed only scores (ImageLocality,
    NodePreferAvoidPods), which rank the nodes a pod fits and never make it fit one: a kubelet reporting a pulled
    image must not send every waiting pod through a cycle; what a plugin's state reads beyond these is its own to say
    (`kubegpu_scheduler_node_digest`, compared by `NodeCache.node_change_may_help`). Liveness (the node lease) is
    judged apart (`ClusterMirror.judge_nodes` wakes the pods when a node comes back)."""
    if previous is None:
        return "added"
    if previous.unschedulable and not info.unschedulable:
        return "unschedulable"
    if info.ready and not previous.ready:
        return "ready"
    if previous.allocatable != info.allocatable:
        return "allocatable"
    if previous.labels != info.labels:
        return "labels"
    if previous.taints != info.taints:
        return "taints"
    if previous.inventories != info.inventories:
        return "inventories"
    return None


def requirement_matches(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    """One requirement against a label set: `NotIn` and `DoesNotExist` hold when the key is absent; `Gt`/`Lt`
    compare integers and fail when the label is absent or not an integer."""
    operator = requirement.operator
    value = labels.get(requirement.key)
    if operator == "In":
        return value is not None and value in requirement.values
    if operator == "NotIn":
        return value is None or value not in requirement.values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(requirement.values) == 1:
        have, bound = _go_int(value), _go_int(requirement.values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _go_int(text: str) -> int | None:
    """`text` as Go's `strconv.ParseInt(text, 10, 64)` reads it (an optional sign, ASCII digits, within int64), else
    None. Python's `int` also takes spaces, underscores and other scripts' digits, which kube-scheduler refuses."""
    if not _INTEGER.fullmatch(text):
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """A pod label selector: None selects nothing, an empty one everything."""
    if selector is None:
        return False
    return all(requirement_matches(r, labels) for r in selector.requirements)


def _field_matches(requirement: Requirement, node_name: str) -> bool:
    """A `matchFields` requirement: only `metadata.name` with `In` or `NotIn` and exactly one value is valid; any
    other makes its term select nothing, as in kube-scheduler."""
    if requirement.key != "metadata.name" or len(requirement.values) != 1:
        return False
    if requirement.operator == "In":
        return node_name == requirement.values[0]
    if requirement.operator == "NotIn":
        return node_name != requirement.values[0]
    return False


_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_VALUES_WANTED = {"In": None, "NotIn": None, "Exists": 0, "DoesNotExist": 0, "Gt": 1, "Lt": 1}


def _valid_label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not (0 < len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def _valid_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)


def _valid_expression(requirement: Requirement) -> bool:
    """Whether kube-scheduler 1.20 can turn a node selector expression into a label selector
    (`NodeSelectorRequirementsAsSelector`): a qualified key, a known operator with the number of values it takes
    (`In`/`NotIn` at least one, `Gt`/`Lt` one integer), each a valid label value. One that cannot makes its term
    select nothing."""
    if requirement.operator not in _VALUES_WANTED or not _valid_label_key(requirement.key):
        return False
    wanted, values = _VALUES_WANTED[requirement.operator], requirement.values
    if (wanted is None and not values) or (wanted is not None and len(values) != wanted):
        return False
    if wanted == 1 and _go_int(values[0]) is None:
        return False
    return all(_valid_label_value(v) for v in values)


# Each term's `_valid_term` answer, keyed by the term's id and holding the term (so the id stays its own while
# remembered); nothing invalidates an answer (terms are immutable); emptied all at once past 4096 terms. An id lookup
# costs a tenth of hashing the term, and this runs for every node a pod with node affinity visits.
_TERMS_CHECKED: dict[int, tuple[NodeSelectorTerm, bool]] = {}


def _valid_term(term: NodeSelectorTerm) -> bool:
    """A term kube-scheduler evaluates: not empty, and every label expression valid (`_valid_expression`)."""
    hit = _TERMS_CHECKED.get(id(term))
    if hit is not None and hit[0] is term:
        return hit[1]
    valid = bool(term.expressions or term.fields) and all(_valid_expression(r) for r in term.expressions)
    if len(_TERMS_CHECKED) >= 4096:
        _TERMS_CHECKED.clear()
    _TERMS_CHECKED[id(term)] = (term, valid)
    return valid


def node_matches_terms(terms: Iterable[NodeSelectorTerm], name: str, labels: Mapping[str, str]) -> bool:
    """Required node affinity: terms are ORed, a term's requirements ANDed; an empty term, or one with an
    expression kube-scheduler rejects (an invalid key or value, a wrong number of values), selects nothing."""
    for term in terms:
        # Validity is asked only of a term that matches: most terms a pod visits a node with do not.
        if (
            (term.expressions or term.fields)
            and all(requirement_matches(r, labels) for r in term.expressions)
            and all(_field_matches(r, name) for r in term.fields)
            and _valid_term(term)
        ):
            return True
    return False


def matches_node_affinity(pod: PodRequest, name: str, labels: Mapping[str, str]) -> bool:
    """`spec.nodeSelector` and the required node affinity, both (kube-scheduler's NodeAffinity filter)."""
    for key, value in pod.node_selector.items():
        if labels.get(key) != value:
            return False
    return pod.node_affinity is None or node_matches_terms(pod.node_affinity, name, labels)


def tolerates_unschedulable(tolerations: Iterable[Toleration]) -> bool:
    """A pod tolerating the `node.kubernetes.io/unschedulable:NoSchedule` taint may go to a cordoned node."""
    return any(t.tolerates(UNSCHEDULABLE_TAINT) for t in tolerations)


# ---------------------------------------------------------------------------------------------------------------
# Host ports
# ---------------------------------------------------------------------------------------------------------------


def ports_conflict(wanted: Iterable[HostPort], used: Mapping[tuple[str, str, int], int]) -> bool:
    """Whether a wanted host port is taken: the same protocol and port on the same IP, and `0.0.0.0` on either
    side conflicts with every IP. `used` counts (ip, protocol, port) of the pods on the node."""
    for port in wanted:
        if port.ip == BIND_ALL:
            if any(p == port.port and proto == port.protocol for _, proto, p in used):
                return True
        elif (BIND_ALL, port.protocol, port.port) in used or (port.ip, port.protocol, port.port) in used:
            return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# Inter-pod affinity
# ---------------------------------------------------------------------------------------------------------------


# A namespace's labels by its name (`PodIndex.namespace_labels`): the Namespace object's, as the cluster has it.
NamespaceLabels = Callable[[str], Mapping[str, str]]
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every Namespace by the API server (1.21+)


def namespace_named(namespace: str) -> Mapping[str, str]:
    """The labels of a namespace whose Namespace object is not known: only the name label every API server of 1.21
    or later sets (a pod's namespace exists; a simulation's need not be declared)."""
    return {NAMESPACE_NAME_LABEL: namespace}


def pod_matches_term(
    term: PodAffinityTerm, pod: PodRequest, namespace_labels: NamespaceLabels = namespace_named
) -> bool:
    """Whether the term selects the pod: its namespace listed or matched by the term's namespace selector
    (`namespace_labels` gives the pod's namespace's labels; an empty selector matches every namespace, as
    kube-scheduler's `AffinityTerm.Matches`), and its labels by the term's selector."""
    if pod.namespace not in term.namespaces:
        chosen = term.namespace_selector
        if chosen is None or (chosen.requirements and not selector_matches(chosen, namespace_labels(pod.namespace))):
            return False
    return selector_matches(term.selector, pod.labels)


@dataclass(slots=True)
class AffinityState:
    """What the InterPodAffinity filter gathered for one incoming pod over the whole cluster.

    * `affinity`: (topology key, value) -> existing pods matching *all* of the pod's affinity terms there;
    * `anti`: (topology key, value) -> existing pods matching one of the pod's anti-affinity terms there;
    * `existing`: topology key -> the values where an existing pod's anti-affinity term matches the pod (by key, so
      a node is judged by a lookup per key, not a pass over every pair);
    * `self_match`: whether the pod matches all its own affinity terms (the first pod of a group may go anywhere
      that has the topology labels when no pod matches yet).
    """

    affinity: dict[tuple[str, str], int] = field(default_factory=dict)
    anti: dict[tuple[str, str], int] = field(default_factory=dict)
    existing: dict[str, set[str]] = field(default_factory=dict)
    self_match: bool = False


def anti_affinity_matches(
    pod: PodRequest,
    holders: Iterable[tuple[PodRequest, Mapping[str, str]]],
    into: dict[str, set[str]],
    namespace_labels: NamespaceLabels = namespace_named,
) -> None:
    """Add to `into` (topology key -> values) the topology pairs where an existing pod's required anti-affinity term
    selects `pod`. `holders` are (existing pod with anti-affinity terms, its node's labels)."""
    for existing, labels in holders:
        for term in existing.pod_anti_affinity:
            if pod_matches_term(term, pod, namespace_labels):
                value = labels.get(term.topology_key)
                if value is not None:
                    into.setdefault(term.topology_key, set()).add(value)


def affinity_counts(
    pod: PodRequest,
    placed: Iterable[tuple[PodRequest, Mapping[str, str]]],
    namespace_labels: NamespaceLabels = namespace_named,
) -> AffinityState:
    """The counts of the pod's own affinity and anti-affinity terms over `placed` (every existing pod with its
    node's labels). The `existing` pairs are filled separately (`anti_affinity_matches`)."""
    matches = pod_matches_term
    state = AffinityState(self_match=all(matches(t, pod, namespace_labels) for t in pod.pod_affinity))
    affinity, anti = pod.pod_affinity, pod.pod_anti_affinity
    for existing, labels in placed:
        if affinity and all(matches(t, existing, namespace_labels) for t in affinity):
            for term in affinity:
                value = labels.get(term.topology_key)
                if value is not None:
                    pair = (term.topology_key, value)
                    state.affinity[pair] = state.affinity.get(pair, 0) + 1
        for term in anti:
            if matches(term, existing, namespace_labels):
                value = labels.get(term.topology_key)
                if value is not None:
                    pair = (term.topology_key, value)
                    state.anti[pair] = state.anti.get(pair, 0) + 1
    return state


def affinity_fits(pod: PodRequest, state: AffinityState, labels: Mapping[str, str]) -> tuple[str, ...]:
    """The InterPodAffinity reasons refusing a node with these labels (empty: it fits)."""
    if pod.pod_affinity:
        exist = True
        for term in pod.pod_affinity:
            value = labels.get(term.topology_key)
            if value is None:
                return (AFFINITY, AFFINITY_RULES)
            if state.affinity.get((term.topology_key, value), 0) <= 0:
                exist = False
        if not exist and not (not state.affinity and state.self_match):
            return (AFFINITY, AFFINITY_RULES)
    for term in pod.pod_anti_affinity:
        value = labels.get(term.topology_key)
        if value is not None and state.anti.get((term.topology_key, value), 0) > 0:
            return (AFFINITY, ANTI_AFFINITY_RULES)
    for key, values in state.existing.items():
        if labels.get(key) in values:
            return (AFFINITY, EXISTING_ANTI_AFFINITY)
    return ()


def affinity_can_refuse(pod: PodRequest, state: AffinityState | None) -> bool:
    """Whether `affinity_fits` can refuse any node: without affinity terms of its own, anti-affinity pairs found for
    its terms, or existing pods' anti-affinity against it, the pod fits every node."""
    return state is not None and bool(pod.pod_affinity or (pod.pod_anti_affinity and state.anti) or state.existing)


# ---------------------------------------------------------------------------------------------------------------
# Topology spread
# ---------------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class SpreadState:
    """Per `DoNotSchedule` constraint: matching pods per topology value over the eligible nodes, the global minimum
    (0 with fewer domains than `minDomains`), and whether the incoming pod itself matches (1) or not (0)."""

    constraints: tuple[SpreadConstraint, ...] = ()
    counts: tuple[dict[str, int], ...] = ()
    minimum: tuple[int, ...] = ()
    own: tuple[int, ...] = ()


def hard_constraints(pod: PodRequest) -> tuple[SpreadConstraint, ...]:
    return tuple(c for c in pod.spread if c.when_unsatisfiable == "DoNotSchedule")


def counts_toward_spread(
    pod: PodRequest, constraint: SpreadConstraint, name: str, labels: Mapping[str, str], taints: Iterable[Taint]
) -> bool:
    """Whether a node's pods count toward one constraint (kube-scheduler 1.33's `matchNodeInclusionPolicies`):
    with `nodeAffinityPolicy: Honor` (the default) the node must pass the pod's node selector and required node
    affinity; with `nodeTaintsPolicy: Honor` the pod must tolerate its NoSchedule and NoExecute taints (the default,
    Ignore, counts a tainted node). The caller has checked that the node carries every constraint's topology key."""
    honor_affinity, honor_taints = constraint.inclusion
    if honor_affinity and not matches_node_affinity(pod, name, labels):
        return False
    return not honor_taints or all(
        taint.effect == "PreferNoSchedule" or any(t.tolerates(taint) for t in pod.tolerations) for taint in taints
    )


def global_minimum(count: Mapping[str, int], min_domains: int) -> int:
    """The smallest count over the eligible domains, or 0 when there are fewer of them than `minDomains` (1.30 GA;
    kube-scheduler's `minMatchNum`)."""
    if not count or len(count) < min_domains:
        return 0
    return min(count.values())


def spread_counts(
    pod: PodRequest,
    nodes: Iterable[tuple[str, Mapping[str, str], Iterable[PodRequest]]],
    constraints: Sequence[SpreadConstraint] | None = None,
    taints: Mapping[str, Sequence[Taint]] | None = None,
) -> SpreadState:
    """kube-scheduler's PreFilter for spread: only nodes carrying every constraint's topology key count, and for
    each constraint only those its node inclusion policies admit (`counts_toward_spread`); pods count when in the
    pod's namespace, not terminating and selected. `nodes` are (name, labels, pods on it), `taints` each node's
    taints (None: none); `constraints` the hard constraints to apply (a pod's defaulted ones), None: the pod's own."""
    constraints = hard_constraints(pod) if constraints is None else tuple(constraints)
    counts: tuple[dict[str, int], ...] = tuple({} for _ in constraints)
    for name, labels, pods in nodes:
        if not all(c.topology_key in labels for c in constraints):
            continue
        members = [p for p in pods if p.namespace == pod.namespace and not p.terminating]
        on = taints.get(name, ()) if taints is not None else ()
        for constraint, count in zip(constraints, counts, strict=True):
            if not counts_toward_spread(pod, constraint, name, labels, on):
                continue
            value = labels[constraint.topology_key]
            count[value] = count.get(value, 0) + sum(
                1 for p in members if selector_matches(constraint.selector, p.labels)
            )
    minimum = tuple(global_minimum(count, c.min_domains) for c, count in zip(constraints, counts, strict=True))
    return SpreadState(constraints, counts, minimum, own_matches(pod, constraints))


def own_matches(pod: PodRequest, constraints: Iterable[SpreadConstraint]) -> tuple[int, ...]:
    """Per constraint, 1 when it selects the pod itself (placing it adds one to its domain), else 0."""
    return tuple(1 if selector_matches(c.selector, pod.labels) else 0 for c in constraints)


def spread_limits(state: SpreadState) -> tuple[tuple[str, Mapping[str, int], int], ...]:
    """Per constraint of the state, in order: its topology key, the matching pods per value, and how many a node's
    domain may hold before the pod lands there (`maxSkew + minimum - own`): `spread_fits` refuses a node lacking
    the key (`SPREAD_LABEL`, unresolvable) or whose value holds more (`SPREAD`). A value the counts lack holds none."""
    return tuple(
        (c.topology_key, count, c.max_skew + minimum - own)
        for c, count, minimum, own in zip(state.constraints, state.counts, state.minimum, state.own, strict=True)
    )


def spread_judge(state: SpreadState) -> Callable[[Mapping[str, str]], tuple[str, bool] | None]:
    """`spread_fits` for one state, with each constraint's limit worked out once (`spread_limits`)."""
    limits = spread_limits(state)

    def judge(labels: Mapping[str, str]) -> tuple[str, bool] | None:
        for key, count, limit in limits:
            value = labels.get(key)
            if value is None:
                return SPREAD_LABEL, False
            if count and count.get(value, 0) > limit:
                return SPREAD, True
        return None

    return judge


def spread_fits(pod: PodRequest, state: SpreadState, labels: Mapping[str, str]) -> tuple[str, bool] | None:
    """None when the node keeps every constraint's skew within maxSkew, else (reason, resolvable)."""
    for constraint, count, minimum, own in zip(state.constraints, state.counts, state.minimum, state.own, strict=True):
        value = labels.get(constraint.topology_key)
        if value is None:
            return SPREAD_LABEL, False
        if not count:
            continue
        if count.get(value, 0) + own - minimum > constraint.max_skew:
            return SPREAD, True
    return None
