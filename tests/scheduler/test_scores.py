"""The score phase, table by table: among nodes that all fit, the engine prefers the one kube-scheduler 1.20 would.

Each story starts from nodes that every filter passes, so only the scores decide: a pod that prefers zone b, one
that would rather not share a zone with its database's replicas, a node tainted `PreferNoSchedule`. The pure
functions of `kubegpu.scheduler.scores` are checked against kube-scheduler's arithmetic directly.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler import objects, scores
from kubegpu.scheduler.engine import Engine

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def node(name: str, zone: str, **kwargs: Any) -> dict[str, Any]:
    labels = {HOST: name, ZONE: zone, **kwargs.pop("labels", {})}
    return node_manifest(name, labels=labels, **kwargs)


def cluster(*nodes: dict[str, Any], profile: scores.Profile | None = None, policy: Any = "binpack") -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), policy=policy, scoring=profile)
    for manifest in nodes:
        e.add_node(node_info(manifest))
    return e


def pod(name: str, spec: dict[str, Any] | None = None, **meta: Any) -> PodRequest:
    document = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": meta.pop("namespace", "default"), **meta},
        "spec": {"containers": [{"name": "main"}], **(spec or {})},
    }
    request, _ = pod_request(document)
    return request


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)} if values else {"key": key, "operator": operator}


def matching(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [expr(key, operator, *values)]}


def prefer_nodes(*weighted: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    terms = [{"weight": weight, "preference": preference} for weight, preference in weighted]
    return {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}}


def prefer_pods(kind: str, *weighted: tuple[int, str, dict[str, str]]) -> dict[str, Any]:
    terms = [
        {"weight": weight, "podAffinityTerm": {"topologyKey": key, "labelSelector": {"matchLabels": labels}}}
        for weight, key, labels in weighted
    ]
    return {"affinity": {kind: {"preferredDuringSchedulingIgnoredDuringExecution": terms}}}


def soft_spread(key: str, labels: dict[str, str], skew: int = 1) -> dict[str, Any]:
    constraint = {
        "maxSkew": skew,
        "topologyKey": key,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": labels},
    }
    return {"topologySpreadConstraints": [constraint]}


def place(e: Engine, name: str, node_name: str, spec: dict[str, Any] | None = None, **meta: Any) -> None:
    decision = e.schedule(pod(name, {**(spec or {}), "nodeName": node_name}, **meta))
    assert decision.node == node_name, decision.reason


THREE_ZONES = [node("a1", "a", labels={"disk": "hdd"}), node("b1", "b", labels={"disk": "ssd"}), node("c1", "c")]


# ---------------------------------------------------------------------------------------------------------------
# NodeAffinity: preferred terms
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preferences", "chosen"),
    [
        ([(50, matching(ZONE, "In", "b"))], "b1"),
        ([(10, matching(ZONE, "In", "c")), (30, matching("disk", "In", "ssd"))], "b1"),
        ([(40, matching(ZONE, "In", "c")), (30, matching("disk", "In", "ssd"))], "c1"),
        ([(20, matching("disk", "DoesNotExist"))], "c1"),
        ([(20, {"matchFields": [expr("metadata.name", "In", "b1")]})], "b1"),
        ([(100, {})], "a1"),
        ([(50, matching(ZONE, "NotIn", "c", "not a label value")), (10, matching(ZONE, "In", "c"))], "c1"),
    ],
    ids=[
        "one-term",
        "weights-add-up",
        "heavier-term-wins",
        "does-not-exist",
        "match-fields",
        "empty-term-none",
        "invalid-term-scores-nothing",
    ],
)
def test_preferred_node_affinity_picks_the_node_with_the_most_weight(
    preferences: list[tuple[int, dict[str, Any]]], chosen: str
) -> None:
    assert cluster(*THREE_ZONES).schedule(pod("p", prefer_nodes(*preferences))).node == chosen


def test_a_profile_without_node_affinity_ignores_preferences() -> None:
    profile = scores.Profile({scores.MOST_ALLOCATED: 1})
    preference = prefer_nodes((50, {"matchExpressions": [expr(ZONE, "In", "b")]}))
    assert cluster(*THREE_ZONES, profile=profile).schedule(pod("p", preference)).node == "a1"


# ---------------------------------------------------------------------------------------------------------------
# TaintToleration: PreferNoSchedule
# ---------------------------------------------------------------------------------------------------------------

SOFT = {"key": "spot", "value": "yes", "effect": "PreferNoSchedule"}


@pytest.mark.parametrize(
    ("tolerations", "chosen"),
    [
        ([], "b1"),
        ([{"key": "spot", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}], "b1"),
        ([{"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}], "a1"),
        ([{"key": "spot", "operator": "Exists"}], "a1"),
        ([{"key": "spot", "operator": "Equal", "value": "no"}], "b1"),
    ],
    ids=["untolerated", "other-effect-does-not-count", "tolerated", "empty-effect-tolerates", "other-value"],
)
def test_prefer_no_schedule_taints_are_avoided_unless_tolerated(tolerations: list[dict[str, str]], chosen: str) -> None:
    e = cluster(node("a1", "a", taints=[SOFT]), node("b1", "a"))
    assert e.schedule(pod("p", {"tolerations": tolerations})).node == chosen


def test_fewer_untolerated_soft_taints_score_higher() -> None:
    two = [SOFT, {"key": "old", "effect": "PreferNoSchedule"}]
    e = cluster(node("a1", "a", taints=two), node("b1", "a", taints=[SOFT]), node("c1", "a", taints=two))
    assert e.schedule(pod("p")).node == "b1"


# ---------------------------------------------------------------------------------------------------------------
# InterPodAffinity: preferred terms, and existing pods' terms
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "labels", "chosen"),
    [
        (prefer_pods("podAffinity", (50, ZONE, {"app": "db"})), {}, "b1"),
        (prefer_pods("podAffinity", (50, HOST, {"app": "db"})), {}, "b1"),
        (prefer_pods("podAffinity", (50, ZONE, {"app": "nothing"})), {}, "a1"),
        (prefer_pods("podAntiAffinity", (50, ZONE, {"app": "db"})), {}, "a1"),
        (prefer_pods("podAntiAffinity", (50, ZONE, {"app": "web"})), {}, "c1"),
        ({}, {"app": "cache"}, "c1"),
        ({}, {"app": "api"}, "a1"),
    ],
    ids=[
        "affinity-zone",
        "affinity-host",
        "affinity-matching-nothing-changes-nothing",
        "anti-affinity-leaves-the-zone",
        "anti-affinity-avoids-both-web-zones",
        "an-existing-pods-required-affinity-draws-the-pod",
        "an-existing-pods-preferred-anti-affinity-pushes-it-away",
    ],
)
def test_pod_affinity_scores_read_the_pods_already_placed(
    spec: dict[str, Any], labels: dict[str, str], chosen: str
) -> None:
    e = cluster(*THREE_ZONES)
    place(e, "db", "b1", labels={"app": "db"})
    place(e, "web-a", "a1", labels={"app": "web"})
    place(e, "web-b", "b1", labels={"app": "web"})
    # Existing pods' own terms: one requires cache pods in its zone, one would rather not have api pods in its zone.
    required = {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "cache"}}}]}}}  # fmt: skip
    place(e, "cache-friend", "c1", {**required, "tolerations": []}, labels={"app": "cache"})
    place(e, "api-hater", "b1", prefer_pods("podAntiAffinity", (100, ZONE, {"app": "api"})), labels={"x": "y"})
    place(e, "api-hater-2", "c1", prefer_pods("podAntiAffinity", (100, ZONE, {"app": "api"})), labels={"x": "y"})
    assert e.schedule(pod("incoming", spec, labels=labels)).node == chosen


# ---------------------------------------------------------------------------------------------------------------
# PodTopologySpread: ScheduleAnyway
# ---------------------------------------------------------------------------------------------------------------


def test_schedule_anyway_spreads_replicas_over_zones_but_never_refuses() -> None:
    e = cluster(node("a1", "a"), node("a2", "a"), node("b1", "b"), node("c1", "c"))
    spec = soft_spread(ZONE, {"app": "web"})
    zones = [
        e.nodes[e.schedule(pod(f"w{i}", spec, labels={"app": "web"})).node or ""].info.labels[ZONE] for i in range(6)
    ]
    assert sorted(zones) == ["a", "a", "b", "b", "c", "c"]
    # Only zone a has room now: ScheduleAnyway still places the pod.
    tight = cluster(node("a1", "a"), node("b1", "b", taints=[{"key": "x", "effect": "NoSchedule"}]))
    place(tight, "w0", "a1", labels={"app": "web"})
    assert tight.schedule(pod("w1", spec, labels={"app": "web"})).node == "a1"


def test_schedule_anyway_by_hostname_prefers_the_emptiest_node() -> None:
    e = cluster(node("a1", "a"), node("a2", "a"), node("a3", "a"))
    place(e, "w0", "a1", labels={"app": "web"})
    place(e, "w1", "a2", labels={"app": "web"})
    place(e, "other", "a3", labels={"app": "db"})
    assert e.schedule(pod("w2", soft_spread(HOST, {"app": "web"}), labels={"app": "web"})).node == "a3"


def test_nodes_without_the_topology_key_score_zero_for_spread() -> None:
    e = cluster(node_manifest("bare"), node("a1", "a"))
    place(e, "w0", "a1", labels={"app": "web"})
    assert e.schedule(pod("w1", soft_spread(ZONE, {"app": "web"}), labels={"app": "web"})).node == "a1"


# ---------------------------------------------------------------------------------------------------------------
# NodeResourcesBalancedAllocation and the policy
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu", "memory", "cpu_capacity", "memory_capacity", "expected"),
    [
        (1000, 1 << 30, 4000, 4 << 30, 100),
        (2000, 1 << 30, 4000, 4 << 30, 75),
        (4000, 1 << 30, 4000, 4 << 30, 0),
        (0, 0, 0, 4 << 30, 0),
        (3000, 0, 4000, 4 << 30, 25),
    ],
    ids=["equal-shares", "quarter-apart", "cpu-full", "no-cpu-capacity", "three-quarters-apart"],
)
def test_balanced_allocation_is_kube_schedulers(
    cpu: int, memory: int, cpu_capacity: int, memory_capacity: int, expected: int
) -> None:
    assert scores.balanced_allocation(cpu, memory, cpu_capacity, memory_capacity) == expected


def test_requests_count_kube_schedulers_defaults_when_absent() -> None:
    assert scores.nonzero_requests(pod("p")) == (100, 200 * 1024 * 1024)
    sized = pod("q", {"containers": [{"name": "a", "resources": {"requests": {"cpu": "2"}}}, {"name": "b"}]})
    assert scores.nonzero_requests(sized) == (2100, 400 * 1024 * 1024)


def test_balanced_allocation_keeps_cpu_and_memory_in_step() -> None:
    profile = scores.Profile({scores.BALANCED: 1})
    e = cluster(node("a1", "a", cpu="4", memory="4Gi"), node("b1", "a", cpu="4", memory="4Gi"), profile=profile)
    place(
        e, "memory-hog", "a1", {"containers": [{"name": "m", "resources": {"requests": {"cpu": "1", "memory": "3Gi"}}}]}
    )
    place(e, "cpu-hog", "b1", {"containers": [{"name": "m", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}]})
    wants_cpu = {"containers": [{"name": "m", "resources": {"requests": {"cpu": "2", "memory": "100Mi"}}}]}
    assert e.schedule(pod("p", wants_cpu)).node == "a1"


@pytest.mark.parametrize(("policy", "chosen"), [("binpack", "a1"), ("spread", "b1")])
def test_the_policy_score_follows_most_or_least_allocated(policy: Any, chosen: str) -> None:
    e = cluster(node("a1", "a", cpu="4", memory="4Gi"), node("b1", "a", cpu="4", memory="4Gi"), policy=policy)
    place(e, "half", "a1", {"containers": [{"name": "m", "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}}]})
    assert e.schedule(pod("p")).node == chosen


# ---------------------------------------------------------------------------------------------------------------
# Normalization, as kube-scheduler's NormalizeScore
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reverse", "expected"),
    [
        ([0, 10, 20], False, [0, 50, 100]),
        ([1, 3], False, [33, 100]),
        ([0, 0], False, [0, 0]),
        ([0, 0], True, [100, 100]),
        ([0, 1, 2], True, [100, 50, 0]),
    ],
)
def test_default_normalization(raw: list[int], reverse: bool, expected: list[int]) -> None:
    assert scores.normalize_default(raw, reverse=reverse) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [([5, 10], [50, 100]), ([-10, 0, 10], [0, 50, 100]), ([-4, -2], [0, 50]), ([0, 0], [0, 0])],
    ids=["zero-counts-as-the-minimum", "negative-to-positive", "all-negative", "flat"],
)
def test_affinity_normalization(raw: list[int], expected: list[int]) -> None:
    assert scores.normalize_affinity(raw) == expected


@pytest.mark.parametrize(
    ("raw", "ignored", "expected"),
    [([1, 3], [False, False], [100, 33]), ([0, 0], [False, False], [100, 100]), ([2, 5], [False, True], [100, 0])],
    ids=["fewer-pods-score-higher", "no-pods-anywhere", "ignored-nodes-score-zero"],
)
def test_spread_normalization(raw: list[int], ignored: list[bool], expected: list[int]) -> None:
    assert scores.normalize_spread(raw, ignored) == expected


@pytest.mark.parametrize(
    ("nodes", "percentage", "expected"), [(30, 0, 30), (99, 0, 99), (100, 0, 100), (1000, 0, 420), (5000, 0, 500),
                                          (1000, 20, 200), (300, 100, 300), (20000, 0, 1000)],
)  # fmt: skip
def test_feasible_nodes_to_find_is_kube_schedulers(nodes: int, percentage: int, expected: int) -> None:
    assert scores.feasible_to_find(nodes, percentage) == expected


# ---------------------------------------------------------------------------------------------------------------
# The engine's memory of raw scores stays true after every change
# ---------------------------------------------------------------------------------------------------------------

APPS = ["web", "db"]


@st.composite
def shapes(draw: st.DrawFn) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    found = []
    for i in range(draw(st.integers(3, 10))):
        app, other = draw(st.sampled_from(APPS)), draw(st.sampled_from(APPS))
        # "plain" pods set no spread constraints: when an owner selects their app they get the default ones.
        kind = draw(st.sampled_from(["plain", "prefer-zone", "prefer-pod", "avoid-pod", "soft-spread", "cpu"]))
        spec: dict[str, Any] = {}
        if kind == "prefer-zone":
            spec = prefer_nodes((draw(st.integers(1, 100)), {"matchExpressions": [expr(ZONE, "In", "b")]}))
        elif kind == "prefer-pod":
            spec = prefer_pods("podAffinity", (draw(st.integers(1, 100)), ZONE, {"app": other}))
        elif kind == "avoid-pod":
            spec = prefer_pods("podAntiAffinity", (draw(st.integers(1, 100)), HOST, {"app": other}))
        elif kind == "soft-spread":
            spec = soft_spread(draw(st.sampled_from([ZONE, HOST])), {"app": app})
        elif kind == "cpu":
            spec = {"containers": [{"name": "m", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
        found.append((f"p{i}", spec, {"app": app}))
    return found


def ranking(e: Engine, probe: PodRequest) -> str | None:
    feasible = [name for name in e.nodes if e.filter_node(name, probe).ok]
    return e._rank(feasible, probe, e.plan(probe)) if feasible else None


# Owners toggled between steps (`Engine.set_owner`): a ReplicaSet of web pods, a Service of db pods, a Service
# selecting both apps' pods by an expression.
OWNERS = [
    ("ReplicaSet", "web", {"matchLabels": {"app": "web"}}),
    ("Service", "db", {"app": "db"}),
    ("StatefulSet", "both", {"matchExpressions": [{"key": "app", "operator": "In", "values": APPS}]}),
]


def toggle_owner(e: Engine, which: int) -> None:
    kind, name, selector = OWNERS[which]
    if (kind, "default", name) in e.owner_keys():
        e.set_owner(kind, "default", name, None)
    else:
        document = {"metadata": {"name": name}, "spec": {"selector": selector}}
        e.set_owner(*objects.owner(kind, document))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes(), st.lists(st.integers(0, 9), max_size=3), st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2))))
def test_remembered_scores_equal_fresh_ones_after_every_change(
    workload: list[tuple[str, dict[str, Any], dict[str, str]]],
    deletions: list[int],
    owners: list[tuple[int, int]],
) -> None:
    e = cluster(
        node("a1", "a", cpu="4", memory="8Gi"),
        node("a2", "a", taints=[SOFT]),
        node("b1", "b", cpu="8", memory="8Gi"),
        node("c1", "c"),
    )
    pods = [pod(name, spec, labels=labels) for name, spec, labels in workload]
    placed: list[str] = []
    for index, request in enumerate(pods):
        if index in deletions and placed:
            e.release(placed.pop(0))
        for step, which in owners:
            if step == index:
                toggle_owner(e, which)
        for probe in pods:
            remembered = ranking(e, probe)
            for record in e.nodes.values():
                record.last_check = {}
            e._raws.clear()
            e._passing.clear()
            e._plans.clear()
            e._defaulted.clear()
            e._owners._memo.clear()
            assert ranking(e, probe) == remembered
        if e.schedule(request).scheduled:
            placed.append(request.key)
