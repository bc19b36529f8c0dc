"""The Filter extension point's node rules are plugins of one shape, enabled, disabled and ordered by name.

kube-scheduler 1.20's node-local filters are registered by name in its order (`kubefilters.KUBE_FILTERS`); a profile
turns any of them off by that name; a third party adds a rule of its own through the engine's `filters`, and the same
profile turns it off by its name.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.status import Status
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine, NodeRecord, Plan
from kubegpu.scheduler.engine.framework import FilterContext, NodeFilter
from kubegpu.scheduler.engine.kubefilters import KUBE_FILTERS

SPOT = "node.example.com/spot"
REFUSED = "node(s) are spot instances and the pod asked for none"


class NoSpotForCritical:
    """A non-device rule a third party adds: pods labelled critical stay off nodes labelled spot."""

    name, reads_usage = "NoSpotForCritical", False

    def __init__(self) -> None:
        self.asked = 0

    def applies(self, pod: PodRequest) -> bool:
        return pod.labels.get("tier") == "critical"

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        self.asked += 1
        return Status.unresolvable(REFUSED) if record.info.labels.get(SPOT) == "true" else None


def cluster(rules: tuple[NodeFilter, ...] = (), off: frozenset[str] = frozenset()) -> Engine:
    profile = replace(scores.Profile.default(), filters_off=off)
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), scoring=profile, filters=rules)
    for i in range(4):
        e.add_node(make_node(f"spot-{i}", labels={SPOT: "true"}))
    e.add_node(make_node("steady", cpu="1"))
    return e


def critical(name: str, cpu: str = "2") -> PodRequest:
    return replace(make_pod(name, {"main": {"cpu": cpu}}), labels={"tier": "critical"})


def test_kube_schedulers_node_filters_are_registered_by_name_in_its_order() -> None:
    assert [rule.name for rule in KUBE_FILTERS] == [
        "NodeUnschedulable",
        "NodeReady",
        "TaintToleration",
        "NodeAffinity",
        "NodePorts",
        "NodeResourcesFit",
        "VolumeBinding",
        "DynamicResources",
    ]
    configurable = set(scores.FILTER_PLUGINS) - {"PodTopologySpread", "InterPodAffinity"}  # cluster-wide: PreFilter
    assert configurable <= {rule.name for rule in KUBE_FILTERS}


def test_a_third_party_rule_refuses_nodes_by_its_own_reason() -> None:
    rule = NoSpotForCritical()
    e = cluster((rule,))
    decision = e.schedule(critical("db"))
    # Four spot nodes refused by the rule, counted under its reason; the steady node too small for two cpus.
    assert not decision.scheduled
    assert decision.reason == f"0/5 nodes are available: 1 Insufficient cpu, 4 {REFUSED}."
    assert e.schedule(critical("small", cpu="500m")).node == "steady"
    # A pod the rule does not apply to (its PreFilter) is never asked about.
    asked = rule.asked
    assert e.schedule(make_pod("batch", {"main": {"cpu": "2"}})).node.startswith("spot-")
    assert rule.asked == asked


def test_a_profile_turns_a_third_party_rule_off_by_name_as_it_does_kube_schedulers() -> None:
    e = cluster((NoSpotForCritical(),), off=frozenset({"NoSpotForCritical", "NodeResourcesFit"}))
    assert e.schedule(critical("db", cpu="64")).scheduled


def test_a_rule_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="named twice: NodePorts"):
        cluster((replace_name(NoSpotForCritical(), "NodePorts"),))


def replace_name(rule: NoSpotForCritical, name: str) -> NoSpotForCritical:
    rule.name = name
    return rule


@pytest.mark.parametrize(
    ("containers", "want"),
    [
        ({"main": {"cpu": "5"}}, Status.unresolvable("Insufficient cpu")),
        ({"main": {"cpu": "5", "memory": "300Gi"}}, Status.unschedulable("Insufficient cpu", "Insufficient memory")),
        ({"main": {"memory": "300Gi"}}, Status.unresolvable("Insufficient memory")),
        ({"main": {"cpu": "2"}}, Status.unschedulable("Insufficient cpu")),
    ],
    ids=["more-than-it-has", "two-short", "memory", "taken"],
)
def test_node_resources_fit_refuses_nodes_alike_with_one_refusal(
    containers: dict[str, dict[str, str]], want: Status
) -> None:
    # NodeResourcesFit makes each refusal once (a status is immutable): nodes refused alike share it, worded as
    # kube-scheduler words it (the oracle: the status made afresh), and a node with room is not refused.
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    for i in range(3):
        e.add_node(make_node(f"node-{i}", cpu="4", memory="8Gi"))
    for i in range(3):
        assert e.schedule(make_pod(f"filler-{i}", {"main": {"cpu": "3"}})).scheduled
    pod = make_pod("asker", containers)
    plan = e.plan(pod)
    fit = next(rule for rule in KUBE_FILTERS if rule.name == "NodeResourcesFit")
    answers = [fit.filter(e, e.nodes[name], pod, plan) for name in e.node_names()]
    assert answers == [want] * 3
    assert len({id(answer) for answer in answers}) == 1
    roomy = make_pod("small", {"main": {"cpu": "1"}})
    assert fit.filter(e, e.nodes["node-0"], roomy, e.plan(roomy)) is None


@pytest.mark.parametrize(
    ("containers", "want"),
    [
        ({"main": {"cpu": "1"}}, Status.unschedulable("Too many pods")),
        ({"main": {"cpu": "5"}}, Status.unschedulable("Too many pods", "Insufficient cpu")),
        (
            {"main": {"cpu": "2", "memory": "300Gi"}},
            Status.unschedulable("Too many pods", "Insufficient cpu", "Insufficient memory"),
        ),
        ({"main": {"example.com/card": "1"}}, Status.unschedulable("Too many pods", "Insufficient example.com/card")),
    ],
    ids=["pods-only", "pods-and-more-than-it-has", "pods-and-two-short", "pods-and-unlisted"],
)
def test_node_resources_fit_names_too_many_pods_first_and_never_unresolvable(
    containers: dict[str, dict[str, str]], want: Status
) -> None:
    # A node whose pods are all taken refuses every pod, first for that, then for each resource short; never as
    # unresolvable, since the pods leaving frees it (kube-scheduler: `Too many pods` is one of the reasons).
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    e.add_node(make_node("full", cpu="4", memory="8Gi", allocatable={"pods": 1}))
    assert e.schedule(make_pod("filler", {"main": {"cpu": "3"}})).scheduled
    pod = make_pod("asker", containers)
    fit = next(rule for rule in KUBE_FILTERS if rule.name == "NodeResourcesFit")
    assert fit.filter(e, e.nodes["full"], pod, e.plan(pod)) == want
