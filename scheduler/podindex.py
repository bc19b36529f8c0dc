"""The placed pods, indexed by what inter-pod terms select them by.

Pod affinity, pod anti-affinity and topology spread ask, for every incoming pod, which placed pods a label selector
picks out in some namespaces (kube-scheduler's PreFilter and PreScore gather those counts by visiting every pod on
every node). The engine keeps a `PodIndex` beside its ledger instead, updated as pods are placed and released, so a
cycle visits only the pods a term can select:

* placed pods by namespace, by (namespace, label key) and by (namespace, label key, value): `selected` starts from
  the narrowest of these sets that a selector's requirements allow (a `matchLabels` entry is one value's set) and
  checks the whole selector on each pod in it;
* the placed pods' required anti-affinity terms, each distinct term with the pods holding it (`anti`): an incoming
  pod is checked against each distinct term once, not against every holder;
* the placed pods' terms that score other pods' nodes (required and preferred affinity, preferred anti-affinity),
  likewise (`scoring`);
* the namespaces' labels (`namespaces`, from the cluster's Namespace objects), which a term's `namespaceSelector`
  reads: a term selects the pods of the namespaces it lists and of those its namespace selector matches.

The index holds pod keys and their nodes' names; the topology values come from the nodes' current labels when a
cycle reads them, so a relabelled node needs nothing here. The functions at the end compute a cycle's states from it
(InterPodAffinity's and PodTopologySpread's PreFilter and PreScore), each handing the pure function of `filters` or
`scores` only the pods that can count, or producing exactly what that function's scan over every pod would; the
hypothesis tests in `tests/scheduler/test_podindex.py` hold every answer to the scan.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kubegpu.core.models import LabelSelector, PodAffinityTerm, PodRequest, Requirement, SpreadConstraint, Taint
from kubegpu.scheduler import filters, scores
from kubegpu.scheduler.filters import pod_matches_term, requirement_matches

__all__ = ["Domains", "PodIndex", "ScoringTerm", "affinity_scores", "affinity_state", "spread_scores", "spread_state"]

# A node's labels by its name (None for a node the engine does not know).
Labels = Callable[[str], "Mapping[str, str] | None"]

_EMPTY: Mapping[str, None] = {}
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class ScoringTerm:
    """A placed pod's term that scores other pods' nodes: `weight` for a preferred term (negative for preferred
    anti-affinity), `required` for a required affinity term (weighted by `hardPodAffinityWeight`)."""

    term: PodAffinityTerm
    weight: int = 0
    required: bool = False


class PodIndex:
    """Placed pods by namespace and labels, and their inter-pod terms by distinct term (module docstring)."""

    __slots__ = (
        "_by_key",
        "_by_label",
        "_by_namespace",
        "_held",
        "anti",
        "namespaces",
        "node",
        "pods",
        "scoring",
        "version",
    )

    def __init__(self) -> None:
        self.pods: dict[str, PodRequest] = {}
        self.node: dict[str, str] = {}  # the node each pod is placed on
        self._by_namespace: dict[str, dict[str, None]] = {}
        self._by_key: dict[tuple[str, str], dict[str, None]] = {}
        self._by_label: dict[tuple[str, str, str], dict[str, None]] = {}
        # Distinct term -> holder -> how many times the holder states it (a pod may repeat a preferred term).
        self.anti: dict[PodAffinityTerm, dict[str, int]] = {}
        self.scoring: dict[ScoringTerm, dict[str, int]] = {}
        self._held: dict[str, tuple[tuple[PodAffinityTerm, ...], tuple[ScoringTerm, ...]]] = {}
        self.version = 0  # moves with every add and discard: a memo of what `selected` answers is keyed by it
        # Namespace -> its labels, as its Namespace object has them (`set_namespace`; unknown: `namespace_named`).
        self.namespaces: dict[str, Mapping[str, str]] = {}

    def __len__(self) -> int:
        return len(self.pods)

    def __contains__(self, key: str) -> bool:
        return key in self.pods

    def add(self, key: str, pod: PodRequest, node: str) -> None:
        """Index a pod placed on `node` (again: a pod indexed before under `key` is replaced)."""
        if key in self.pods:
            self.discard(key)
        self.version += 1
        self.pods[key] = pod
        self.node[key] = node
        namespace = pod.namespace
        _put(self._by_namespace, namespace, key)
        for label, value in pod.labels.items():
            _put(self._by_key, (namespace, label), key)
            _put(self._by_label, (namespace, label, value), key)
        anti = pod.pod_anti_affinity
        scoring = (
            *(ScoringTerm(term, required=True) for term in pod.pod_affinity),
            *(ScoringTerm(term, weight) for weight, term in pod.preferred_affinity),
            *(ScoringTerm(term, -weight) for weight, term in pod.preferred_anti_affinity),
        )
        if anti or scoring:
            self._held[key] = (anti, scoring)
            for term in anti:
                holders = self.anti.setdefault(term, {})
                holders[key] = holders.get(key, 0) + 1
            for entry in scoring:
                holders = self.scoring.setdefault(entry, {})
                holders[key] = holders.get(key, 0) + 1

    def discard(self, key: str) -> None:
        pod = self.pods.pop(key, None)
        if pod is None:
            return
        self.version += 1
        del self.node[key]
        namespace = pod.namespace
        _drop(self._by_namespace, namespace, key)
        for label, value in pod.labels.items():
            _drop(self._by_key, (namespace, label), key)
            _drop(self._by_label, (namespace, label, value), key)
        anti, scoring = self._held.pop(key, ((), ()))
        for term in anti:
            _drop(self.anti, term, key)
        for entry in scoring:
            _drop(self.scoring, entry, key)

    def selected(self, namespaces: Iterable[str], selector: LabelSelector | None) -> Iterator[str]:
        """The keys of the placed pods in `namespaces` whose labels `selector` matches (None selects none)."""
        if selector is None:
            return
        pods = self.pods
        for namespace in namespaces:
            members, chosen = self._narrowest(namespace, selector)
            # The requirement that chose the set holds for every pod in it: only the others are checked.
            rest = [r for r in selector.requirements if r is not chosen]
            if not rest:
                yield from members
                continue
            for key in members:
                labels = pods[key].labels
                if all(requirement_matches(r, labels) for r in rest):
                    yield key

    def matching(self, term: PodAffinityTerm) -> Iterator[str]:
        """The keys of the placed pods that `term` selects (`filters.pod_matches_term`)."""
        return self.selected(self.term_namespaces(term), term.selector)

    def term_namespaces(self, term: PodAffinityTerm) -> Collection[str]:
        """The namespaces whose pods `term` may select: those it lists and, with a namespace selector, those of the
        placed pods' namespaces whose labels it matches (every one, for an empty selector), as kube-scheduler's
        PreFilter adds the namespaces its Namespace lister finds for the selector to the term's list."""
        chosen = term.namespace_selector
        if chosen is None:
            return term.namespaces
        if not chosen.requirements:
            return self._by_namespace.keys()
        listed, labels = term.namespaces, self.namespace_labels
        return [ns for ns in self._by_namespace if ns in listed or filters.selector_matches(chosen, labels(ns))]

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        """The namespace's labels, as its Namespace object has them; for a namespace not known, the name label the
        API server sets on every namespace (`filters.namespace_named`)."""
        known = self.namespaces.get(namespace)
        return known if known is not None else filters.namespace_named(namespace)

    def set_namespace(self, name: str, labels: Mapping[str, str] | None) -> bool:
        """A Namespace added or changed with its labels, or deleted (None). Returns whether its labels changed (a
        term's namespace selector may then select other pods: the caller's memos of what terms select are stale).
        The name label is always among them, as the API server (1.21+) keeps it on every Namespace: a document that
        lists other labels only (`kubegpu simulate`'s) is still selected by its name."""
        old = self.namespaces.get(name)
        if labels is None:
            if old is None:
                return False
            del self.namespaces[name]
        else:
            labels = {**labels, **filters.namespace_named(name)}
            if old == labels:
                return False
            self.namespaces[name] = labels
        self.version += 1
        return True

    def drawn(self, pod: PodRequest) -> bool:
        """Whether a placed pod's scoring term selects `pod` (InterPodAffinity then scores it)."""
        labels = self.namespace_labels
        return any(pod_matches_term(entry.term, pod, labels) for entry in self.scoring)

    def _narrowest(self, namespace: str, selector: LabelSelector) -> tuple[Collection[str], Requirement | None]:
        """A set of the namespace's pods that holds every pod `selector` can match, as small as its requirements
        allow: `In` limits to those values' pods, `Exists` to the key's; the others need the whole namespace. With
        the requirement that chose it (every pod in the set meets it; None: the whole namespace)."""
        best: Collection[str] = self._by_namespace.get(namespace, _EMPTY)
        chosen: Requirement | None = None
        size = len(best)
        for requirement in selector.requirements:
            if size == 0:
                break
            if requirement.operator == "In":
                values = dict.fromkeys(requirement.values)  # a value listed twice must not list its pods twice
                sets = [self._by_label.get((namespace, requirement.key, v), _EMPTY) for v in values]
                found = sum(len(s) for s in sets)
                if found < size:
                    size, chosen = found, requirement
                    best = sets[0] if len(sets) == 1 else [key for s in sets for key in s]
            elif requirement.operator == "Exists":
                members = self._by_key.get((namespace, requirement.key), _EMPTY)
                if len(members) < size:
                    best, size, chosen = members, len(members), requirement
        return best, chosen


def _put(table: dict[K, dict[str, None]], slot: K, key: str) -> None:
    members = table.get(slot)
    if members is None:
        table[slot] = {key: None}
    else:
        members[key] = None


def _drop(table: dict[K, dict[str, V]], slot: K, key: str) -> None:
    members = table.get(slot)
    if members is not None:
        members.pop(key, None)
        if not members:
            del table[slot]


# ---------------------------------------------------------------------------------------------------------------
# The cluster-wide states of one cycle, from the index (each equals its scan over every pod in `filters`/`scores`)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Domains:
    """The nodes whose pods count for a pod's topology spread constraints of one node inclusion policy (every
    constraint's topology key is on the node, and `filters.counts_toward_spread` admits it) with their labels, and
    each key's values over them."""

    nodes: Mapping[str, Mapping[str, str]]
    values: Mapping[str, tuple[str, ...]]

    @classmethod
    def of(
        cls,
        pod: PodRequest,
        keys: Iterable[str],
        nodes: Iterable[tuple[str, Mapping[str, str], Sequence[Taint]]],
        constraint: SpreadConstraint | None = None,
    ) -> Domains:
        """`constraint` gives the inclusion policy (None: the defaults, node affinity honoured, taints ignored)."""
        wanted = tuple(dict.fromkeys(keys))
        policy = constraint or _DEFAULT_POLICY
        eligible = {
            name: labels
            for name, labels, taints in nodes
            if all(k in labels for k in wanted) and filters.counts_toward_spread(pod, policy, name, labels, taints)
        }
        values = {k: tuple(dict.fromkeys(labels[k] for labels in eligible.values())) for k in wanted}
        return cls(eligible, values)


_DEFAULT_POLICY = SpreadConstraint(1, "", "DoNotSchedule", None)


def affinity_state(pod: PodRequest, index: PodIndex, labels: Labels) -> filters.AffinityState | None:
    """InterPodAffinity's PreFilter (`filters.affinity_counts` and `filters.anti_affinity_matches`) over only the
    placed pods a term can select: those the pod's first affinity term selects (a pod must match all of them), those
    one of its anti-affinity terms selects, and the holders of anti-affinity terms that select the pod."""
    state: filters.AffinityState | None = None
    where = index.node
    if pod.pod_affinity:
        candidates: dict[str, None] = dict.fromkeys(index.matching(pod.pod_affinity[0]))
        for term in pod.pod_anti_affinity:
            candidates.update(dict.fromkeys(index.matching(term)))
        state = filters.affinity_counts(pod, _located(candidates, index, labels), index.namespace_labels)
    elif pod.pod_anti_affinity:
        # `affinity_counts` without affinity terms: per anti-affinity term, the pods it selects counted in their
        # node's domain (the index names them: none is matched against the term again).
        state = filters.AffinityState(self_match=True)
        anti = state.anti
        for term in pod.pod_anti_affinity:
            _count_domains(term.topology_key, index.matching(term), where, labels, anti)
    if index.anti:
        # `anti_affinity_matches` over the holders of the placed terms that select the pod: each such term adds
        # its holders' domains (a holder's other terms that do not select the pod add nothing).
        existing: dict[str, set[str]] = {}
        namespace_labels = index.namespace_labels
        for term, holders in index.anti.items():
            if pod_matches_term(term, pod, namespace_labels):
                found: dict[tuple[str, str], int] = {}
                _count_domains(term.topology_key, holders, where, labels, found)
                if found:
                    existing.setdefault(term.topology_key, set()).update(value for _, value in found)
        if existing:
            state = state or filters.AffinityState()
            state.existing = existing
    return state


def affinity_scores(pod: PodRequest, index: PodIndex, labels: Labels, hard_weight: int) -> dict[tuple[str, str], int]:
    """InterPodAffinity's PreScore (`scores.affinity_prescore`) over only the placed pods that the pod's preferred
    terms select and those holding a scoring term that selects the pod: no other pod adds to any topology pair."""
    # The same sums as the scan, one term at a time: the pods a term selects are the index's to name, so no pod is
    # matched against a term twice.
    found: dict[tuple[str, str], int] = {}
    where = index.node

    def add(term: PodAffinityTerm, keys: Iterable[str], weight: int, times: Mapping[str, int] | None = None) -> None:
        key = term.topology_key
        for pod_key in keys:
            node_labels = labels(where[pod_key])
            if not node_labels:
                continue
            value = node_labels.get(key)
            if value is not None:
                pair = (key, value)
                found[pair] = found.get(pair, 0) + weight * (times[pod_key] if times is not None else 1)

    for weight, term in pod.preferred_affinity:
        add(term, index.matching(term), weight)
    for weight, term in pod.preferred_anti_affinity:
        add(term, index.matching(term), -weight)
    matched: dict[PodAffinityTerm, bool] = {}
    for entry, holders in index.scoring.items():
        if entry.required and hard_weight <= 0:
            continue
        hit = matched.get(entry.term)
        if hit is None:
            hit = matched[entry.term] = pod_matches_term(entry.term, pod, index.namespace_labels)
        if hit:
            add(entry.term, holders, hard_weight if entry.required else entry.weight, holders)
    return found


def spread_state(
    pod: PodRequest,
    index: PodIndex,
    domains: Sequence[Domains],
    constraints: Sequence[SpreadConstraint] | None = None,
) -> filters.SpreadState:
    """PodTopologySpread's PreFilter (`filters.spread_counts`): per `DoNotSchedule` constraint (`constraints`, or
    the pod's own), the matching pods (the pod's namespace, not terminating) on that constraint's `domains` nodes
    (one `Domains` per constraint, in order) per topology value, every value counted."""
    constraints = filters.hard_constraints(pod) if constraints is None else tuple(constraints)
    counts = []
    for constraint, eligible in zip(constraints, domains, strict=True):
        key = constraint.topology_key
        count = dict.fromkeys(eligible.values.get(key, ()), 0)
        for node, found in _members(pod, constraint, index).items():
            node_labels = eligible.nodes.get(node)
            if node_labels is not None:
                count[node_labels[key]] += found
        counts.append(count)
    minimum = tuple(filters.global_minimum(n, c.min_domains) for c, n in zip(constraints, counts, strict=True))
    return filters.SpreadState(constraints, tuple(counts), minimum, filters.own_matches(pod, constraints))


def spread_scores(
    pod: PodRequest,
    index: PodIndex,
    feasible: Sequence[tuple[str, Mapping[str, str]]],
    domains: Sequence[Domains],
    constraints: Sequence[SpreadConstraint] | None = None,
) -> scores.SpreadScores | None:
    """PodTopologySpread's PreScore (`scores.spread_prescore`, with the same `constraints`) from the index: the pairs
    of the feasible nodes, counted over each constraint's `domains` nodes (one `Domains` per constraint, in order);
    for a hostname constraint, the matching pods per node (`SpreadScores.hosts`)."""
    state = scores.spread_prescore(pod, feasible, (), constraints)
    if state is None:
        return None
    hosts: list[Mapping[str, int] | None] = []
    counted: dict[LabelSelector | None, dict[str, int]] = {}  # constraints often share a selector (the defaults do)
    for constraint, eligible in zip(state.constraints, domains, strict=True):
        on = counted.get(constraint.selector)
        if on is None:
            on = counted[constraint.selector] = _members(pod, constraint, index)
        if constraint.topology_key == scores.HOSTNAME:
            hosts.append(on)
            continue
        hosts.append(None)
        key, counts = constraint.topology_key, state.counts
        for node, found in on.items():
            node_labels = eligible.nodes.get(node)
            if node_labels is not None and (pair := (key, node_labels[key])) in counts:
                counts[pair] += found
    state.hosts = tuple(hosts)
    return state


def _members(pod: PodRequest, constraint: SpreadConstraint, index: PodIndex) -> dict[str, int]:
    """Per node, the placed pods a spread constraint counts: in the pod's namespace, selected, not terminating."""
    on: dict[str, int] = {}
    pods, where = index.pods, index.node
    for key in index.selected((pod.namespace,), constraint.selector):
        if not pods[key].terminating:
            node = where[key]
            on[node] = on.get(node, 0) + 1
    return on


def _count_domains(
    key: str, pods: Iterable[str], where: Mapping[str, str], labels: Labels, into: dict[tuple[str, str], int]
) -> None:
    """Add to `into` each of `pods` (placed pods' keys) under its node's (`key`, value): its node looked up once
    however many of them it holds; a node the engine does not know, or without the key, counts none."""
    per_node: dict[str, int] = {}
    for pod_key in pods:
        node = where[pod_key]
        per_node[node] = per_node.get(node, 0) + 1
    for node, found in per_node.items():
        node_labels = labels(node)
        if node_labels:
            value = node_labels.get(key)
            if value is not None:
                pair = (key, value)
                into[pair] = into.get(pair, 0) + found


def _located(keys: Iterable[str], index: PodIndex, labels: Labels) -> Iterator[tuple[PodRequest, Mapping[str, str]]]:
    pods, where = index.pods, index.node
    for key in keys:
        node_labels = labels(where[key])
        if node_labels is not None:
            yield pods[key], node_labels
