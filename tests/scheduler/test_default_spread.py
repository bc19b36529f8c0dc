"""PodTopologySpread's default constraints, as kube-scheduler 1.20 applies them (DefaultPodTopologySpread on).

A pod that sets no `topologySpreadConstraints` is spread by the profile's default constraints (by default hostname
maxSkew 3 and zone maxSkew 5, ScheduleAnyway), selecting the pods its Services, ReplicationControllers, ReplicaSets
and StatefulSets select. Here: which owners give a pod which selector, the score each node gets (computed by hand,
the formula next to each table), the replicas of a ReplicaSet spreading where the same pods without one pack
together, and the configuration turning the defaults off or replacing them.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import LabelSelector, PodRequest, Requirement, SpreadConstraint
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler import objects, scores
from kubegpu.scheduler.config import parse_config
from kubegpu.scheduler.engine import Engine

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
WEB = {"app": "web", "pod-template-hash": "5d8f"}
REQUESTS = {"cpu": "500m", "memory": "2Gi"}  # 1/16 of SIX_NODES' cpu and memory: BalancedAllocation scores them alike


def node(name: str, zone: str | None, **kwargs: Any) -> dict[str, Any]:
    labels = {HOST: name} if zone is None else {HOST: name, ZONE: zone}
    return node_manifest(name, labels=labels, **kwargs)


def cluster(*nodes: dict[str, Any], profile: scores.Profile | None = None) -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), policy="binpack", scoring=profile)
    for manifest in nodes:
        e.add_node(node_info(manifest))
    return e


def pod(name: str, labels: dict[str, str], spec: dict[str, Any] | None = None, namespace: str = "shop") -> PodRequest:
    document = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "main", "resources": {"requests": REQUESTS}}], **(spec or {})},
    }
    return pod_request(document)[0]


def own(e: Engine, kind: str, name: str, selector: Any, namespace: str = "shop") -> None:
    document = {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector}}
    e.set_owner(*objects.owner(kind, document))


def place(e: Engine, name: str, node_name: str, labels: dict[str, str]) -> None:
    decision = e.schedule(pod(name, labels, {"nodeName": node_name}))
    assert decision.node == node_name, decision.reason


def requirement(key: str, value: str) -> Requirement:
    return Requirement(key, "In", (value,))


def defaults(*requirements: Requirement) -> tuple[SpreadConstraint, ...]:
    selector = LabelSelector(tuple(requirements))
    return SpreadConstraint(3, HOST, "ScheduleAnyway", selector), SpreadConstraint(5, ZONE, "ScheduleAnyway", selector)


# ---------------------------------------------------------------------------------------------------------------
# Which owners select the pod, and the selector they give it (kube-scheduler's DefaultSelector)
# ---------------------------------------------------------------------------------------------------------------

EXISTS_TIER = {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}


@pytest.mark.parametrize(
    ("owners", "labels", "expected"),
    [
        ([("Service", {"app": "web"})], WEB, defaults(requirement("app", "web"))),
        (
            [("Service", {"app": "web"}), ("ReplicaSet", {"matchLabels": WEB})],
            WEB,
            defaults(requirement("app", "web"), requirement("pod-template-hash", "5d8f")),
        ),
        ([("ReplicationController", {"app": "web"})], WEB, defaults(requirement("app", "web"))),
        (
            [("StatefulSet", {"matchLabels": {"app": "web"}, **EXISTS_TIER})],
            {**WEB, "tier": "front"},
            defaults(requirement("app", "web"), Requirement("tier", "Exists")),
        ),
        (
            [("Service", {"app": "web"}), ("Service", {"tier": "front"})],
            {**WEB, "tier": "front"},
            defaults(requirement("app", "web"), requirement("tier", "front")),
        ),
        ([("Service", {"app": "db"})], WEB, ()),
        ([("Service", {}), ("ReplicaSet", {}), ("ReplicationController", None)], WEB, ()),
        ([("Service", {"app": "web"})], {}, ()),
        ([], WEB, ()),
    ],
    ids=[
        "a-service",
        "service-and-replicaset-add-up",
        "a-replication-controller",
        "statefulset-expressions-kept",
        "two-services-merge",
        "an-owner-selecting-other-pods",
        "empty-selectors-select-nothing",
        "a-pod-without-labels",
        "no-owner",
    ],
)
def test_the_owners_that_select_a_pod_give_its_default_constraints_their_selector(
    owners: list[tuple[str, Any]], labels: dict[str, str], expected: tuple[SpreadConstraint, ...]
) -> None:
    e = cluster(node("a1", "a"))
    for i, (kind, selector) in enumerate(owners):
        own(e, kind, f"owner-{i}", selector)
    own(e, "Service", "elsewhere", {"app": "web"}, namespace="other")  # another namespace's owner never counts
    assert e.spread_constraints(pod("p", labels)) == expected


def test_a_pod_with_constraints_of_its_own_keeps_them_and_gets_no_defaults() -> None:
    e = cluster(node("a1", "a"))
    own(e, "Service", "web", {"app": "web"})
    spec = {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule",
                                           "labelSelector": {"matchLabels": {"app": "web"}}}]}  # fmt: skip
    request = pod("p", WEB, spec)
    assert e.spread_constraints(request) == request.spread


def test_an_owner_changed_or_deleted_changes_the_constraints_of_the_next_cycle() -> None:
    e = cluster(node("a1", "a"))
    request = pod("p", WEB)
    assert e.plan(request).soft_spread == ()
    own(e, "ReplicaSet", "web", {"matchLabels": WEB})
    assert e.plan(request).soft_spread == defaults(requirement("app", "web"), requirement("pod-template-hash", "5d8f"))
    own(e, "ReplicaSet", "web", {"matchLabels": {"app": "web"}})
    assert e.plan(request).soft_spread == defaults(requirement("app", "web"))
    e.set_owner("ReplicaSet", "shop", "web", None)
    assert e.plan(request).soft_spread == () and e.owner_keys() == []


# ---------------------------------------------------------------------------------------------------------------
# The score, by hand
# ---------------------------------------------------------------------------------------------------------------
#
# Nodes a1, a2 (zone a), b1 (zone b) and c1 (no zone label); web pods placed: two on a1, one on a2, one on b1, and
# one db pod on b1. The incoming web pod has no constraints; a Service selects app=web, so it is scored by
# hostname (maxSkew 3) and zone (maxSkew 5), both selecting app=web.
#
# kube-scheduler 1.20 (podtopologyspread/scoring.go), over the feasible nodes:
#   c1 lacks the zone key: ignored, raw 0, normalized 0.
#   hostname weight  = ln(feasible - ignored + 2) = ln(3 + 2) = 1.6094
#   zone weight      = ln(zones among the feasible + 2) = ln(2 + 2) = 1.3863
#   raw(node)        = int(hostname count x 1.6094 + (3 - 1) + zone count x 1.3863 + (5 - 1))
#     a1: 2 x 1.6094 + 2 + 3 x 1.3863 + 4 = 13.38 -> 13
#     a2: 1 x 1.6094 + 2 + 3 x 1.3863 + 4 = 11.77 -> 11
#     b1: 1 x 1.6094 + 2 + 1 x 1.3863 + 4 =  8.99 -> 8
#   normalized       = 100 x (max + min - raw) // max, over the nodes not ignored (max 13, min 8)
#     a1: 100 x 8 // 13 = 61    a2: 100 x 10 // 13 = 76    b1: 100 x 13 // 13 = 100

HAND_COMPUTED = {"a1": (13, 61), "a2": (11, 76), "b1": (8, 100), "c1": (0, 0)}


def scored_cluster(profile: scores.Profile | None = None) -> Engine:
    e = cluster(node("a1", "a"), node("a2", "a"), node("b1", "b"), node("c1", None), profile=profile)
    place(e, "web-0", "a1", WEB)
    place(e, "web-1", "a1", WEB)
    place(e, "web-2", "a2", WEB)
    place(e, "web-3", "b1", WEB)
    place(e, "db-0", "b1", {"app": "db"})
    own(e, "Service", "web", {"app": "web"})
    return e


def spread_scores(e: Engine, request: PodRequest) -> dict[str, tuple[int, int]]:
    """The raw and normalized PodTopologySpread scores of every node, from the engine's constraints for the pod."""
    feasible = [(name, dict(r.info.labels)) for name, r in e.nodes.items()]
    on = [(name, dict(r.info.labels), [e.pods[k].request for k in r.pods]) for name, r in e.nodes.items()]
    soft = e.plan(request).soft_spread
    state = scores.spread_prescore(request, feasible, on, soft)
    assert state is not None
    raw = [scores.spread_raw(state, request, name, labels, pods) for name, labels, pods in on]
    normalized = scores.normalize_spread(raw, [name in state.ignored for name, _ in feasible])
    return {name: (r, n) for (name, _), r, n in zip(feasible, raw, normalized, strict=True)}


def test_default_constraints_score_each_node_as_computed_by_hand() -> None:
    assert math.isclose(math.log(5), 1.6094, abs_tol=1e-4) and math.isclose(math.log(4), 1.3863, abs_tol=1e-4)
    e = scored_cluster()
    assert spread_scores(e, pod("web-4", WEB)) == HAND_COMPUTED
    # Spread weighs 2 and outweighs binpack: the pod goes to b1 (zone b, one web pod), not a2 or the bare c1.
    assert e.schedule(pod("web-4", WEB)).node == "b1"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # One zone constraint with maxSkew 2: weight ln(2 + 2); a*: 3 x 1.3863 + 1 = 5.16 -> 5, b1: 1.3863 + 1 = 2.39
        # -> 2; normalized over max 5, min 2: a*: 100 x 2 // 5 = 40, b1: 100 x 5 // 5 = 100; c1 ignored.
        (
            {"defaultConstraints": [{"maxSkew": 2, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"}]},
            {"a1": (5, 40), "a2": (5, 40), "b1": (2, 100), "c1": (0, 0)},
        ),
        # One hostname constraint with maxSkew 1: c1 has the key now, so nothing is ignored; weight ln(4 + 2) =
        # 1.7918; a1: 2 x 1.7918 = 3.58 -> 3, a2 and b1: 1.79 -> 1, c1: 0; max 3, min 0: a1 0, a2 and b1 66, c1 100.
        (
            {"defaultConstraints": [{"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "ScheduleAnyway"}]},
            {"a1": (3, 0), "a2": (1, 66), "b1": (1, 66), "c1": (0, 100)},
        ),
    ],
    ids=["zone-only-max-skew-2", "hostname-only-max-skew-1"],
)
def test_configured_default_constraints_replace_the_system_ones(
    args: dict[str, Any], expected: dict[str, tuple[int, int]]
) -> None:
    e = scored_cluster(configured(args))
    assert spread_scores(e, pod("web-4", WEB)) == expected


def configured(args: dict[str, Any], policy: str = "binpack") -> scores.Profile:
    document = {
        "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"pluginConfig": [{"name": "PodTopologySpread", "args": args}]}],
    }
    return parse_config(document, policy).profile


# ---------------------------------------------------------------------------------------------------------------
# Stories: replicas spread, unless the configuration turns the defaults off
# ---------------------------------------------------------------------------------------------------------------

SIX_NODES = [node(f"{zone}{i}", zone, cpu="8", memory="32Gi") for zone in "abc" for i in (1, 2)]


def replicas(e: Engine, count: int) -> list[str]:
    placed = []
    for i in range(count):
        decision = e.schedule(pod(f"web-{i}", WEB))
        assert decision.node is not None, decision.reason
        placed.append(decision.node)
    return placed


def test_replicas_of_a_replicaset_spread_over_zones_and_hosts_where_binpack_would_stack_them() -> None:
    alone = cluster(*SIX_NODES)
    assert replicas(alone, 6) == ["a1"] * 6  # binpack: the busiest node that fits

    owned = cluster(*SIX_NODES)
    own(owned, "ReplicaSet", "web-5d8f", {"matchLabels": WEB})
    placed = replicas(owned, 6)
    assert sorted(placed) == ["a1", "a2", "b1", "b2", "c1", "c2"]  # one per host
    assert sorted(name[0] for name in placed[:3]) == ["a", "b", "c"]  # the first three cover the three zones


@pytest.mark.parametrize(
    "args",
    [{"defaultingType": "List"}, {"defaultingType": "List", "defaultConstraints": []}],
    ids=["list-without-constraints", "list-with-an-empty-list"],
)
def test_defaulting_type_list_without_constraints_turns_the_defaults_off(args: dict[str, Any]) -> None:
    e = cluster(*SIX_NODES, profile=configured(args))
    own(e, "ReplicaSet", "web-5d8f", {"matchLabels": WEB})
    assert replicas(e, 4) == ["a1"] * 4


def test_an_empty_list_alone_keeps_the_system_defaults_as_in_kube_scheduler_1_20() -> None:
    e = cluster(*SIX_NODES, profile=configured({"defaultConstraints": []}))
    own(e, "ReplicaSet", "web-5d8f", {"matchLabels": WEB})
    assert len(set(replicas(e, 3))) == 3


def test_a_configured_do_not_schedule_default_refuses_a_node_that_would_skew_the_zones() -> None:
    args = {"defaultConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}]}
    e = cluster(node("a1", "a"), node("b1", "b", taints=[{"key": "full", "effect": "NoSchedule"}]),
                profile=configured(args))  # fmt: skip
    own(e, "Service", "web", {"app": "web"})
    place(e, "web-0", "a1", WEB)
    decision = e.schedule(pod("web-1", WEB))
    assert not decision.scheduled
    assert "node(s) didn't match pod topology spread constraints" in (decision.reason or "")
    e.set_owner("Service", "shop", "web", None)  # no owner: no default constraint, so a1 takes it
    assert e.schedule(pod("web-1", WEB)).node == "a1"


def test_a_service_changing_its_selector_changes_the_spread_filters_answer_for_the_same_pod() -> None:
    # The custom scheduler asks again about the same pending pod; between the two asks only a Service changes (no
    # node, no placed pod), and the zones' counts must follow its new selector.
    args = {"defaultConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}]}
    e = cluster(node("a1", "a"), node("b1", "b"), profile=configured(args))
    place(e, "web-0", "a1", WEB)
    waiting = pod("web-1", {**WEB, "tier": "front"})
    own(e, "Service", "web", {"tier": "front"})  # selects web-1 alone: zone a 0 + itself 1 - zone b 0 = 1, fits
    assert e.filter_node("a1", waiting).ok
    own(e, "Service", "web", {"app": "web"})  # selects web-0 too: zone a 1 + 1 - 0 = 2 > maxSkew 1
    status = e.filter_node("a1", waiting)
    assert status.reasons == ("node(s) didn't match pod topology spread constraints",)
    assert e.filter_node("b1", waiting).ok  # zone b 0 + 1 - 0 = 1


def test_a_pod_gets_the_selector_of_its_own_namespaces_owners_only() -> None:
    # Pods with the same labels in two namespaces, each selected by its own namespace's owners.
    e = cluster(node("a1", "a"))
    own(e, "Service", "web", {"app": "web"}, namespace="shop")
    own(e, "ReplicaSet", "web-5d8f", {"matchLabels": WEB}, namespace="blog")
    assert e.spread_constraints(pod("web-0", WEB, namespace="shop")) == defaults(requirement("app", "web"))
    assert e.spread_constraints(pod("web-0", WEB, namespace="blog")) == defaults(
        requirement("app", "web"), requirement("pod-template-hash", "5d8f")
    )
    assert e.spread_constraints(pod("web-0", WEB, namespace="shop")) == defaults(requirement("app", "web"))


@pytest.mark.parametrize("count", [300, 500, 5000])
def test_a_services_replicas_spread_over_every_zone_when_kube_scheduler_samples_fewer_nodes_than_the_cluster(
    count: int,
) -> None:
    """Above 100 nodes kube-scheduler scores only a sample (`numFeasibleNodesToFind`: 47% of 300 nodes, 46% of 500,
    10% of 5,000) taken from its node list interleaved zone by zone, from a start that moves on every cycle: each zone
    is in every sample, so the zone maxSkew is kept however the nodes were added (here zone by zone)."""
    zones = "abc"
    nodes = [node(f"{zone}{i:04d}", zone, cpu="8", memory="32Gi") for zone in zones for i in range(count // 3)]
    e = cluster(*nodes)
    own(e, "Service", "web", {"app": "web"})
    placed = replicas(e, 27)
    per_zone = {zone: sum(name[0] == zone for name in placed) for zone in zones}
    assert min(per_zone.values()) > 0, per_zone
    assert max(per_zone.values()) - min(per_zone.values()) <= 5, per_zone  # the default zone constraint's maxSkew
    assert len(set(placed)) == 27  # and the hostname one's: no host took two
