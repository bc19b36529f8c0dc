"""The placed-pod index (`kubegpu.scheduler.podindex`) answers exactly as a scan of every placed pod would.

The engine's pod affinity, anti-affinity and topology spread counts come from the index, which visits only the pods
a term can select. Here random clusters go through random placements, releases, node relabels and removals, and
owners (Services, ReplicaSets, ...) come and go, and after every step each answer of the index is compared with the
scan that `filters` and `scores` define: the oracle. A probe without spread constraints of its own is checked with
the default constraints its owners give it, whose selector is itself checked against a scan of every owner.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import label_selector, node_info, pod_request
from kubegpu.core.models import LabelSelector, PodRequest, Requirement, SpreadConstraint, Taint
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.status import Code
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler import filters, objects, podindex, scores
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.engine.kubefilters import PodTopologySpread

ZONE = "topology.kubernetes.io/zone"
TAINT = "example.com/dedicated"
HOST = "kubernetes.io/hostname"
NAMESPACES = ["a", "b"]
SPEC = {"containers": [{"name": "main"}]}

label_sets = st.dictionaries(st.sampled_from(["app", "tier"]), st.sampled_from(["x", "y", "z"]), max_size=2)
requirements = st.one_of(
    st.builds(
        lambda key, op, values: {"key": key, "operator": op, "values": values},
        st.sampled_from(["app", "tier"]),
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.sampled_from(["x", "y", "z"]), min_size=1, max_size=3),  # a value may be listed twice
    ),
    st.builds(
        lambda key, op: {"key": key, "operator": op},
        st.sampled_from(["app", "tier"]),
        st.sampled_from(["Exists", "DoesNotExist"]),
    ),
)
selectors = st.one_of(
    st.none(),  # no labelSelector: selects no pod
    st.builds(lambda labels: {"matchLabels": labels}, label_sets),  # {} selects every pod
    st.builds(lambda exprs: {"matchExpressions": exprs}, st.lists(requirements, min_size=1, max_size=2)),
)


# A term's namespaceSelector (1.22+): every namespace, those of a team label, those named (the label the API server
# sets on each), those without a team.
namespace_selectors = st.one_of(
    st.just({}),
    st.builds(lambda team: {"matchLabels": {"team": team}}, st.sampled_from(["x", "y"])),
    st.builds(
        lambda names: {"matchExpressions": [{"key": filters.NAMESPACE_NAME_LABEL, "operator": "In", "values": names}]},
        st.lists(st.sampled_from(NAMESPACES), min_size=1, max_size=2),
    ),
    st.just({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}),
)
# A Namespace's labels set (a team label, or none) or its object deleted (None: only its name label is known).
namespace_changes = st.tuples(
    st.just("namespace"),
    st.sampled_from(NAMESPACES),
    st.one_of(st.none(), st.builds(lambda team: {"team": team} if team else {}, st.sampled_from(["", "x", "y"]))),
)


@st.composite
def terms(draw: st.DrawFn) -> dict[str, Any]:
    term: dict[str, Any] = {"topologyKey": draw(st.sampled_from([ZONE, HOST, "rack"]))}
    selector = draw(selectors)
    if selector is not None:
        term["labelSelector"] = selector
    if draw(st.booleans()):
        term["namespaces"] = draw(st.lists(st.sampled_from(NAMESPACES), min_size=1, max_size=2))
    if draw(st.integers(0, 2)) == 0:
        term["namespaceSelector"] = draw(namespace_selectors)
    return term


@st.composite
def pod_documents(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    affinity: dict[str, Any] = {}
    for kind in ("podAffinity", "podAntiAffinity"):
        required = draw(st.lists(terms(), max_size=2))
        preferred = [
            {"weight": w, "podAffinityTerm": t}
            for w, t in draw(st.lists(st.tuples(st.integers(1, 100), terms()), max_size=2))
        ]
        if required or preferred:
            affinity[kind] = {
                "requiredDuringSchedulingIgnoredDuringExecution": required,
                "preferredDuringSchedulingIgnoredDuringExecution": preferred,
            }
    if affinity:
        spec["affinity"] = affinity
    spread = []
    for _ in range(draw(st.integers(0, 2))):
        constraint: dict[str, Any] = {
            "maxSkew": draw(st.integers(1, 3)),
            "topologyKey": draw(st.sampled_from([ZONE, HOST, "rack"])),
            "whenUnsatisfiable": draw(st.sampled_from(["DoNotSchedule", "ScheduleAnyway"])),
        }
        selector = draw(selectors)
        if selector is not None:
            constraint["labelSelector"] = selector
        # The fields of 1.27-1.33: minDomains (DoNotSchedule only), the node inclusion policies, matchLabelKeys.
        if constraint["whenUnsatisfiable"] == "DoNotSchedule" and draw(st.booleans()):
            constraint["minDomains"] = draw(st.integers(1, 4))
        for policy in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            value = draw(st.sampled_from([None, "Honor", "Ignore"]))
            if value is not None:
                constraint[policy] = value
        if draw(st.booleans()):
            constraint["matchLabelKeys"] = draw(st.lists(st.sampled_from(["app", "tier"]), max_size=2, unique=True))
        spread.append(constraint)
    if spread:
        spec["topologySpreadConstraints"] = spread
    if draw(st.booleans()):
        spec["tolerations"] = [{"key": TAINT, "operator": "Exists"}]
    if draw(st.booleans()):
        spec["nodeSelector"] = {ZONE: draw(st.sampled_from(["z1", "z2"]))}
    metadata: dict[str, Any] = {"namespace": draw(st.sampled_from(NAMESPACES)), "labels": draw(label_sets)}
    if draw(st.integers(0, 5)) == 0:
        metadata["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"kind": "Pod", "metadata": metadata, "spec": spec}


def shaped_node(name: str, shape: tuple[str | None, str | None, bool, str | None]) -> dict[str, Any]:
    zone, rack, hostname, effect = shape
    taints = [{"key": TAINT, "effect": effect}] if effect else []
    return node_manifest(name, labels=node_labels(name, zone, rack, hostname), taints=taints)


def node_labels(name: str, zone: str | None, rack: str | None, hostname: bool) -> dict[str, str]:
    labels = {HOST: name} if hostname else {}
    if zone is not None:
        labels[ZONE] = zone
    if rack is not None:
        labels["rack"] = rack
    return labels


node_shapes = st.tuples(
    st.sampled_from([None, "z1", "z2", "z3"]),
    st.sampled_from([None, "r1", "r2"]),
    st.booleans(),
    st.sampled_from([None, "NoSchedule", "PreferNoSchedule"]),  # a taint the probes may tolerate
)
# An owner set or deleted (selector None): Services and ReplicationControllers select by a map, the others by a
# LabelSelector; an empty one selects no pod.
owner_changes = st.one_of(
    st.tuples(
        st.just("own"),
        st.sampled_from(["Service", "ReplicationController"]),
        st.sampled_from(NAMESPACES),
        st.integers(0, 2),
        st.one_of(st.none(), label_sets),
    ),
    st.tuples(
        st.just("own"),
        st.sampled_from(["ReplicaSet", "StatefulSet"]),
        st.sampled_from(NAMESPACES),
        st.integers(0, 2),
        selectors,
    ),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), pod_documents(), st.integers(0, 5)),
        st.tuples(st.just("release"), st.integers(0, 100)),
        st.tuples(st.just("relabel"), st.integers(0, 5), node_shapes),
        st.tuples(st.just("remove"), st.integers(0, 5)),
        owner_changes,
        namespace_changes,
    ),
    min_size=1,
    max_size=25,
)
# The profile's default constraints: kube-scheduler's, or a list with a DoNotSchedule one (filters read it too).
DEFAULTS = [
    scores.SYSTEM_DEFAULT_SPREAD,
    (SpreadConstraint(1, "rack", "DoNotSchedule", None), SpreadConstraint(2, ZONE, "ScheduleAnyway", None)),
]


def request(document: dict[str, Any], name: str) -> PodRequest:
    document = {**document, "metadata": {**document["metadata"], "name": name}}
    return pod_request(document)[0]


def located(e: Engine) -> list[tuple[PodRequest, dict[str, str]]]:
    return [(p.request, dict(e.nodes[p.node].info.labels)) for p in e.pods.values() if p.node in e.nodes]


def on_nodes(e: Engine) -> list[tuple[str, dict[str, str], list[PodRequest]]]:
    return [(r.name, dict(r.info.labels), [e.pods[k].request for k in r.pods]) for r in e.nodes.values()]


def taints_of(e: Engine) -> dict[str, tuple[Taint, ...]]:
    return {r.name: r.info.taints for r in e.nodes.values()}


def scanned_affinity(e: Engine, pod: PodRequest) -> filters.AffinityState | None:
    """InterPodAffinity's PreFilter as a scan of every placed pod."""
    ns = e.placed.namespace_labels
    state = filters.affinity_counts(pod, located(e), ns) if pod.pod_affinity or pod.pod_anti_affinity else None
    existing: dict[str, set[str]] = {}
    filters.anti_affinity_matches(pod, [(p, labels) for p, labels in located(e) if p.pod_anti_affinity], existing, ns)
    if existing:
        state = state or filters.AffinityState()
        state.existing = existing
    return state


def own(e: Engine, owners: dict[tuple[str, str, str], LabelSelector | None], op: tuple[Any, ...]) -> None:
    """Apply an `own` operation to the engine, and to `owners`, the oracle's plain record of every owner."""
    _, kind, namespace, number, selector = op
    name = f"{kind.lower()}-{number}"
    parsed = None
    if selector is not None:
        document = {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector}}
        parsed = objects.owner(kind, document)[3]
    e.set_owner(kind, namespace, name, parsed)
    owners[(kind, namespace, name)] = parsed


def scanned_defaults(
    e: Engine, owners: dict[tuple[str, str, str], LabelSelector | None], probe: PodRequest
) -> tuple[SpreadConstraint, ...]:
    """kube-scheduler's buildDefaultConstraints as a scan of every owner: the requirements of every owner in the
    pod's namespace whose non-empty selector matches the pod, all on each default constraint."""
    if probe.spread:
        return probe.spread
    found: set[Requirement] = set()
    for (_, namespace, _), selector in owners.items():
        if namespace != probe.namespace or selector is None or not selector.requirements or not probe.labels:
            continue
        if filters.selector_matches(selector, probe.labels):
            found.update(selector.requirements)
    if not found:
        return ()
    constraints = e.spread_constraints(probe)
    assert all(c.selector is not None and set(c.selector.requirements) == found for c in constraints)
    expected = e.scoring.default_spread
    assert [(c.max_skew, c.topology_key, c.when_unsatisfiable) for c in constraints] == [
        (c.max_skew, c.topology_key, c.when_unsatisfiable) for c in expected
    ]
    return constraints


def check_against_scans(e: Engine, probe: PodRequest, owners: dict[tuple[str, str, str], Any] | None = None) -> None:
    index = e._placed
    ns = index.namespace_labels
    assert podindex.affinity_state(probe, index, e._labels) == scanned_affinity(e, probe)
    assert podindex.affinity_scores(probe, index, e._labels, 1) == scores.affinity_prescore(probe, located(e), 1, ns)
    assert index.drawn(probe) == any(
        filters.pod_matches_term(t, probe, ns) for p, _ in located(e) for t in scores.scoring_terms(p)
    )
    constraints = scanned_defaults(e, owners or {}, probe)
    assert e.spread_constraints(probe) == constraints
    plan = e.plan(probe)
    hard = tuple(c for c in constraints if c.when_unsatisfiable == "DoNotSchedule")
    assert plan.hard_spread == hard
    # A plan remembered from before a Namespace was relabelled is made again: whether a placed pod's anti-affinity
    # term selects the probe (the cluster-wide rules then judge it) may have changed with it.
    selected = any(filters.pod_matches_term(t, probe, ns) for p, _ in located(e) for t in p.pod_anti_affinity)
    assert plan.volatile == bool(probe.pod_affinity or probe.pod_anti_affinity or hard or selected)
    if hard:
        indexed = podindex.spread_state(probe, index, e._spread_domains(probe, hard), hard)
        assert indexed == filters.spread_counts(probe, on_nodes(e), hard, taints_of(e))
        # The nodes a fresh PodTopologySpread PreFilter names are those the filter refuses over a scan, each for the
        # filter's reason; the cycle's remembered judge refuses them alike (it runs first).
        judge, fresh = e._cluster_state(probe, plan).judge, PodTopologySpread().prefilter(e, probe, plan)
        assert fresh is not None and judge is not None
        for record in e.nodes.values():
            refused = fresh.get(record.name)
            fits = filters.spread_fits(probe, indexed, record.info.labels)
            assert (refused.reasons[0], refused.code is Code.UNSCHEDULABLE) == fits if refused else fits is None
            assert refused is None or judge(record.name, record.info.labels) == refused
    soft = tuple(c for c in constraints if c.when_unsatisfiable == "ScheduleAnyway")
    assert plan.soft_spread == soft
    if soft:
        feasible = [(r.name, dict(r.info.labels)) for r in e.nodes.values()]
        scanned = scores.spread_prescore(probe, feasible, on_nodes(e), soft, taints_of(e))
        indexed_scores = podindex.spread_scores(probe, index, feasible, e._spread_domains(probe, soft), soft)
        assert scanned is not None and indexed_scores is not None
        assert (indexed_scores.ignored, indexed_scores.counts, indexed_scores.weights) == (
            scanned.ignored,
            scanned.counts,
            scanned.weights,
        )
        for name, labels, pods in on_nodes(e):
            raw = scores.spread_raw(indexed_scores, probe, name, labels)
            assert raw == scores.spread_raw(scanned, probe, name, labels, pods)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(node_shapes, min_size=1, max_size=6),
    operations,
    st.lists(pod_documents(), min_size=1, max_size=4),
    st.sampled_from(DEFAULTS),
    st.lists(owner_changes, max_size=8),
    st.lists(st.tuples(st.sampled_from(NAMESPACES), label_sets), max_size=3),  # probes with no constraints
)
def test_index_answers_equal_a_scan_of_every_placed_pod(
    shapes: list[tuple[str | None, str | None, bool, str | None]],
    ops: list[tuple[Any, ...]],
    probes: list[dict[str, Any]],
    defaults: tuple[SpreadConstraint, ...],
    initial_owners: list[tuple[Any, ...]],
    plain: list[tuple[str, dict[str, str]]],
) -> None:
    profile = scores.Profile(scores.DEFAULT_WEIGHTS, default_spread=defaults)
    e = Engine(make_plugin_manager("scheduler", plugins=[], autoload=False), scoring=profile)
    owners: dict[tuple[str, str, str], LabelSelector | None] = {}
    for change in initial_owners:
        own(e, owners, change)
    for i, shape in enumerate(shapes):
        e.add_node(node_info(shaped_node(f"n{i}", shape)))
    probes += [{"kind": "Pod", "metadata": {"namespace": ns, "labels": labels}, "spec": SPEC} for ns, labels in plain]
    requests = [request(document, f"probe{i}") for i, document in enumerate(probes)]
    for step, op in enumerate(ops):
        if op[0] == "place" and f"n{op[2]}" in e.nodes:
            e.admit_bound(request(op[1], f"p{step}"), f"n{op[2]}", None)
        elif op[0] == "release" and e.pods:
            e.release(sorted(e.pods)[op[1] % len(e.pods)])
        elif op[0] == "relabel" and f"n{op[1]}" in e.nodes:
            e.add_node(node_info(shaped_node(f"n{op[1]}", op[2])))
        elif op[0] == "remove":
            e.remove_node(f"n{op[1]}")
        elif op[0] == "own":
            own(e, owners, op)
        elif op[0] == "namespace":
            e.set_namespace(op[1], op[2])
        assert set(e._placed.pods) == set(e.pods)
        for probe in requests:
            check_against_scans(e, probe, owners)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NAMESPACES), label_sets), max_size=24), st.integers(0, 24), selectors)
def test_selected_pods_are_exactly_those_the_selector_matches(
    pods: list[tuple[str, dict[str, str]]], released: int, selector: dict[str, Any] | None
) -> None:
    index = podindex.PodIndex()
    requests = [request({"kind": "Pod", "metadata": {"namespace": ns, "labels": labels}, "spec": SPEC}, f"p{i}")
                for i, (ns, labels) in enumerate(pods)]  # fmt: skip
    for pod in requests:
        index.add(pod.key, pod, "n0")
    for pod in requests[:released]:
        index.discard(pod.key)
    parsed = label_selector(selector, "selector") if selector is not None else None
    for namespaces in (["a"], ["b"], ["a", "b"]):
        found = list(index.selected(namespaces, parsed))
        assert len(found) == len(set(found))
        assert set(found) == {
            p.key
            for p in requests[released:]
            if p.namespace in namespaces and filters.selector_matches(parsed, p.labels)
        }


@pytest.mark.parametrize("hard_weight", [0, 1, 5])
def test_a_term_a_placed_pod_states_twice_scores_twice_as_in_the_scan(hard_weight: int) -> None:
    # The index keeps each distinct term once with how many times each holder states it; the scan visits the
    # holder's terms one by one, so a repeated term adds its weight (or hardPodAffinityWeight) once per statement.
    term = {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "x"}}}
    affinity = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term, term],
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 7, "podAffinityTerm": term}] * 2,
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 3, "podAffinityTerm": term}] * 2,
        },
    }
    metadata = {"namespace": "a", "labels": {"app": "y"}}
    holder = {"kind": "Pod", "metadata": metadata, "spec": {**SPEC, "affinity": affinity}}
    e = Engine(make_plugin_manager("scheduler", plugins=[], autoload=False))
    e.add_node(node_info(node_manifest("n0", labels=node_labels("n0", "z1", None, True))))
    e.admit_bound(request(holder, "holder"), "n0", None)
    probe = request({"kind": "Pod", "metadata": {"namespace": "a", "labels": {"app": "x"}}, "spec": SPEC}, "probe")
    scanned = scores.affinity_prescore(probe, located(e), hard_weight)
    assert scanned == {(ZONE, "z1"): 2 * hard_weight + 2 * 7 - 2 * 3}
    assert podindex.affinity_scores(probe, e._placed, e._labels, hard_weight) == scanned


def test_anti_affinity_counts_every_selected_pod_on_a_node_as_the_scan() -> None:
    """InterPodAffinity's PreFilter counts the pods an anti-affinity term selects per domain (the index counts each
    node's once, by its domain): three pods of app x, two on one node of zone z1 and one on z2, and a pod in zone z1
    holding a term that selects the probe, count as a scan of every placed pod counts them."""
    e = Engine(make_plugin_manager("scheduler", plugins=[], autoload=False))
    for name, zone in (("n0", "z1"), ("n1", "z2"), ("n2", "z1")):
        e.add_node(node_info(node_manifest(name, labels={ZONE: zone, HOST: name})))
    term = {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "x"}}}
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}

    def document(labels: dict[str, str], affinity: dict[str, Any] | None = None) -> dict[str, Any]:
        spec = {**SPEC, "affinity": affinity} if affinity else SPEC
        return {"kind": "Pod", "metadata": {"namespace": "a", "labels": labels}, "spec": spec}

    for step, node in enumerate(("n0", "n0", "n1")):
        e.admit_bound(request(document({"app": "x"}), f"x{step}"), node, None)
    e.admit_bound(request(document({"app": "w"}, anti), "holder"), "n2", None)
    probe = request(document({"app": "x"}, anti), "probe")
    state = podindex.affinity_state(probe, e._placed, e._labels)
    assert state is not None
    assert state.anti == {(ZONE, "z1"): 2, (ZONE, "z2"): 1}
    assert state.existing == {ZONE: {"z1"}}
    assert state == scanned_affinity(e, probe)
