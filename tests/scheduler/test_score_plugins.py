"""The score plugins are objects of one shape (`framework.ScorePlugin`), weighed and turned off by name.

kube-scheduler 1.20's score plugins are registered by name (`kubescores.KUBE_SCORES`); the profile weighs each; a third
party adds a score plugin of its own through the engine's `score_plugins`, on with weight 1 unless the profile names
it; the cluster-wide filters are objects of their own shape, turned off by name like the node filters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from kubegpu.core.models import PodRequest, SpreadConstraint
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine, NodeRecord, Plan
from kubegpu.scheduler.engine.framework import ScoreContext, ScorePlugin
from kubegpu.scheduler.engine.kubefilters import CLUSTER_FILTERS
from kubegpu.scheduler.engine.kubescores import KUBE_SCORES

GREEN = "node.example.com/green"


class PreferGreen:
    """A third party's score: nodes labelled green score 100, others 0."""

    name, local = "PreferGreen", True

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return True

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        return True

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        return [100.0 if r.info.labels.get(GREEN) == "true" else 0.0 for r in records]

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return raw


def cluster(plugins: tuple[ScorePlugin, ...] = (), profile: scores.Profile | None = None) -> Engine:
    e = Engine(
        make_plugin_manager("scheduler", plugins=(), autoload=False),
        policy="spread",
        scoring=profile,
        score_plugins=plugins,
    )
    e.add_node(make_node("empty", cpu="8"))
    e.add_node(make_node("green", cpu="8", labels={GREEN: "true"}))
    e.schedule(replace(make_pod("busy", {"main": {"cpu": "4"}}), node_name="green"))
    return e


def test_kube_schedulers_score_plugins_are_registered_by_name() -> None:
    assert {plugin.name for plugin in KUBE_SCORES} == set(scores.SCORE_PLUGINS)
    assert [rule.name for rule in CLUSTER_FILTERS] == ["PodTopologySpread", "InterPodAffinity"]


def test_a_third_party_score_plugin_weighs_one_unless_the_profile_says_otherwise() -> None:
    # LeastAllocated and BalancedAllocation prefer the empty node; the third party's score outweighs them.
    assert cluster().schedule(make_pod("p", {"main": {"cpu": "1"}})).node == "empty"
    assert cluster((PreferGreen(),)).schedule(make_pod("p", {"main": {"cpu": "1"}})).node == "green"
    off = replace(scores.Profile.default("spread"), scores_off=frozenset({"PreferGreen"}))
    assert cluster((PreferGreen(),), off).schedule(make_pod("p", {"main": {"cpu": "1"}})).node == "empty"


def test_a_profile_weighs_kube_schedulers_score_plugins_by_name() -> None:
    # With LeastAllocated weighed 0 and BalancedAllocation 0, the third party's score alone decides; with
    # LeastAllocated weighed 5, it outweighs it again.
    default = scores.Profile.default("spread")
    only = replace(default, weights={**default.weights, scores.LEAST_ALLOCATED: 5, scores.BALANCED: 0})
    assert cluster((PreferGreen(),), only).schedule(make_pod("p", {"main": {"cpu": "1"}})).node == "empty"


def test_a_profile_turns_the_cluster_wide_filters_off_by_name() -> None:
    pod = make_pod("p", {"main": {"cpu": "1"}})
    spread = replace(pod, spread=(SpreadConstraint(1, "zone", "DoNotSchedule", None),))
    assert not cluster().schedule(spread).scheduled  # no node has the zone label
    off = replace(scores.Profile.default("spread"), filters_off=frozenset({"PodTopologySpread"}))
    assert cluster(profile=off).schedule(spread).scheduled


class PreferGreenQuietly(PreferGreen):
    """PreferGreen, but saying it cannot rank the nodes otherwise than the policy's order."""

    name = "PreferGreenQuietly"

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return False


@pytest.mark.parametrize(("plugin", "found"), [(PreferGreen(), True), (PreferGreenQuietly(), False)])
def test_a_third_party_score_that_matters_has_kube_schedulers_count_of_nodes_ranked(
    plugin: ScorePlugin, found: bool
) -> None:
    """A cycle finds the policy's first few feasible nodes unless a score plugin says it may rank them otherwise
    (`matters`); a third party's is asked like kube-scheduler's own (the engine leaves out only the built-in plugins
    whose `matters` is always False), and its green node, far down the candidates, is then found and chosen."""
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), policy="spread", score_plugins=(plugin,))
    for i in range(60):
        e.add_node(make_node(f"n{i:02d}", cpu="8"))
    e.add_node(make_node("zz-green", cpu="8", labels={GREEN: "true"}))
    for i in range(60):
        e.schedule(replace(make_pod(f"busy{i}", {"main": {"cpu": "1"}}), node_name=f"n{i:02d}"))
    e.schedule(replace(make_pod("busy-green", {"main": {"cpu": "1"}}), node_name="zz-green"))
    assert (e.schedule(make_pod("p", {"main": {"cpu": "1"}})).node == "zz-green") is found
