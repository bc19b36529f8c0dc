"""A third party adds a non-device rule the way it adds a device family: a plugin implementing
`kubegpu_scheduler_rules`, found through the `kubegpu.scheduler` entry points, whose node filters and score plugins the
engine runs beside kube-scheduler's, turned off and weighed by name through the same profile.

The rules come from `tests/fixtures/spot_rules`, a distribution of its own, loaded here in-process;
`tests/test_third_party_plugin.py` installs it into a fresh virtual environment and schedules with `kubegpu
simulate`. A rule that breaks its
contract, or a plugin whose hook does, costs only itself: the error names the plugin and the rule, and every other
pod is scheduled.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from kubegpu.core import plugin_manager
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.scheduler_hooks import hookimpl
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "spot_rules"
SPOT = {"node.example.com/spot": "true"}
CHEAP = {"node.example.com/cost": "low"}


@pytest.fixture(scope="module")
def spot() -> ModuleType:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(FIXTURE))
        return importlib.import_module("kubegpu_spot_rules")


def cluster(*plugins: tuple[str, object], profile: scores.Profile | None = None) -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=plugins, autoload=False), policy="spread", scoring=profile)
    for i in range(3):
        e.add_node(make_node(f"spot-{i}", cpu="8", labels=SPOT))
    e.add_node(make_node("steady", cpu="8"))
    e.add_node(make_node("cheap", cpu="8", labels=CHEAP))
    return e


def pod(name: str, **labels: str) -> PodRequest:
    return replace(make_pod(name, {"main": {"cpu": "1"}}), labels=labels)


def test_a_plugins_filter_keeps_critical_pods_off_spot_nodes_and_its_score_draws_pods_to_cheap_ones(
    spot: ModuleType,
) -> None:
    e = cluster(("spot", spot.plugin))
    assert e.schedule(pod("batch")).node == "cheap"  # PreferCheap outweighs the spread policy's tie
    e.remove_node("cheap")
    for i in range(4):
        assert e.schedule(pod(f"db-{i}", tier="critical")).node == "steady"
    e.remove_node("steady")
    refused = e.schedule(pod("db-last", tier="critical"))
    assert not refused.scheduled
    assert refused.reason == f"0/3 nodes are available: 3 {spot.REFUSED}."


def test_a_profile_turns_a_plugins_filter_off_and_weighs_its_score_by_name(spot: ModuleType) -> None:
    default = scores.Profile.default("spread")
    profile = replace(
        default, filters_off=frozenset({"NoSpotForCritical"}), weights={**default.weights, "PreferCheap": 0}
    )
    e = cluster(("spot", spot.plugin), profile=profile)
    e.remove_node("steady")
    e.remove_node("cheap")
    assert e.schedule(pod("db", tier="critical")).node.startswith("spot-")


def test_a_rule_that_answers_wrongly_costs_only_the_pods_it_refuses(
    spot: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    e = cluster(("spot", spot.plugin))
    with caplog.at_level(logging.WARNING, logger="kubegpu.plugins"):
        probe = e.schedule(pod("probe", probe="broken"))
        again = e.schedule(pod("probe-2", probe="broken"))
    assert not probe.scheduled
    assert "plugin 'spot' failed in rule Broken (filter): WrongAnswer: returned 'no' (str)" in (probe.reason or "")
    assert not again.scheduled
    assert len([r for r in caplog.records if "rule Broken" in r.getMessage()]) == 1  # logged once
    # Counted once per node: the answer is remembered per node and pod shape, so the second probe asks no rule.
    assert e.plugins.hook_failures[("spot", "rule Broken (filter)")] == 5
    assert e.schedule(pod("batch")).scheduled  # every other pod is served


class Raising:
    """A plugin whose rules raise, whose hook answers a string, and whose rules take built-in names."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    @hookimpl
    def kubegpu_scheduler_rules(self) -> object:
        return self.answer


class Explodes:
    name = "Explodes"

    def filter(self, node: object, pod: object) -> None:
        raise RuntimeError("boom")

    def score(self, node: object, pod: object) -> float:
        raise RuntimeError("boom")


class Taken:
    name = "NodeAffinity"

    def filter(self, node: object, pod: object) -> None:
        raise AssertionError("a rule under a taken name is never asked")


def test_a_rule_that_raises_refuses_with_an_error_naming_it_and_scores_zero() -> None:
    e = cluster(("raising", Raising([Explodes()])))
    decision = e.schedule(pod("p"))
    assert not decision.scheduled
    assert "plugin 'raising' failed in rule Explodes (filter): RuntimeError: boom" in (decision.reason or "")
    off = replace(scores.Profile.default("spread"), filters_off=frozenset({"Explodes"}))
    assert cluster(("raising", Raising([Explodes()])), profile=off).schedule(pod("p")).scheduled


@pytest.mark.parametrize(
    "answer",
    ["NoSpot", [object()], [Taken()]],
    ids=["hook answers a string", "a rule without a name", "a rule under a built-in name"],
)
def test_a_broken_hook_or_a_taken_name_leaves_the_rule_out_and_the_engine_serves(
    answer: object, spot: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        e = cluster(("raising", Raising(answer)), ("spot", spot.plugin))
    assert "raising" in caplog.text
    assert e.schedule(pod("batch")).node == "cheap"  # the other plugin's rules still run
    assert e.schedule(pod("db", tier="critical")).scheduled


class Slow:
    name = "Slow"

    def filter(self, node: object, pod: object) -> None:
        time.sleep(0.03)

    def score(self, node: object, pod: object) -> float:
        time.sleep(0.03)
        return 1.0


def test_a_slow_rule_is_reported_naming_the_plugin_and_the_rule(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rule calling out to a slow service held every pod while nothing said which rule: each call over
    `SLOW_HOOK_SECONDS` is counted and logged as a hook's is."""
    monkeypatch.setattr(plugin_manager, "SLOW_HOOK_SECONDS", 0.02)
    e = cluster(("slow", Raising([Slow()])))
    with caplog.at_level(logging.WARNING, logger="kubegpu.plugins"):
        assert e.schedule(pod("p")).scheduled
    slow = e.plugins.slow_hooks
    assert slow[("slow", "rule Slow (filter)")] == 5 and slow[("slow", "rule Slow (score)")] == 5, slow
    logged = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert [m.split(" took ")[0] for m in logged] == ["plugin 'slow'"] * 2, logged
    assert any("in rule Slow (filter)" in m for m in logged) and any("in rule Slow (score)" in m for m in logged)
