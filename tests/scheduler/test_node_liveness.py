"""Node liveness: a node whose advertiser stopped renewing its Lease takes no new device pods.

The engine part (`Engine.set_node_live`) with the toy plugin, the Lease bookkeeping (`NodeLeases`) on a fake clock,
and the extender's remembered answers checked against a fresh extender after a node dies and comes back.
"""

from __future__ import annotations

import math

import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.liveness import NodeLeases, lease_name, parse_time

from . import toy_plugin as toy

CARD = toy.RESOURCE
DEAD = "node(s) had an expired kubegpu node lease (kube-node-lease/kubegpu-a, last renewed 9s ago)"


def engine() -> Engine:
    return Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False))


def toy_node(name: str, cards: int = 4) -> object:
    return make_node(name, labels={"toy.example/cards": str(cards)}, allocatable={CARD: cards})


def test_a_dead_node_refuses_device_pods_with_the_reason_and_keeps_everything_else() -> None:
    e = engine()
    e.add_node(toy_node("a"))  # type: ignore[arg-type]
    assert e.schedule(make_pod("running", {"main": {CARD: 1}})).node == "a"
    assert e.set_node_live("a", False, DEAD)
    decision = e.schedule(make_pod("new", {"main": {CARD: 1}}))
    assert not decision.scheduled
    assert decision.reason == f"0/1 nodes are available: 1 {DEAD}."
    assert "default/running" in e.pods  # running pods are untouched
    assert e.schedule(make_pod("web", {"main": {"cpu": "100m"}})).node == "a"  # no device request: unaffected
    assert not e.set_node_live("a", False, DEAD)  # nothing changed
    assert e.set_node_live("a", True)
    assert e.schedule(make_pod("new", {"main": {CARD: 1}})).node == "a"


def test_a_dead_node_does_not_settle_its_class_and_the_pod_goes_to_a_live_twin() -> None:
    e = engine()
    for name in ("a", "b"):
        e.add_node(toy_node(name))  # type: ignore[arg-type]
    e.set_node_live("a", False, DEAD)
    for i in range(3):
        assert e.schedule(make_pod(f"p{i}", {"main": {CARD: 1}})).node == "b"
    e.set_node_live("b", False, DEAD.replace("kubegpu-a", "kubegpu-b"))
    reason = e.schedule(make_pod("late", {"main": {CARD: 1}})).reason or ""
    assert "kubegpu-a" in reason and "kubegpu-b" in reason


def test_a_pod_bound_to_a_dead_node_is_still_counted() -> None:
    e = engine()
    e.add_node(toy_node("a", 1))  # type: ignore[arg-type]
    e.set_node_live("a", False, DEAD)
    assert e.admit_by_count(make_pod("bound-elsewhere", {"main": {CARD: 1}}), "a").scheduled
    e.set_node_live("a", True)
    assert not e.schedule(make_pod("new", {"main": {CARD: 1}})).scheduled


def test_liveness_changes_name_the_node_as_changed_and_survive_a_node_update() -> None:
    e = engine()
    e.add_node(toy_node("a"))  # type: ignore[arg-type]
    generation = e.generation
    e.set_node_live("a", False, DEAD)
    assert e.changed_since(generation) == {"a"}
    generation = e.generation
    e.set_node_live("a", False, DEAD.replace("9s", "10s"))  # the wording only
    assert e.changed_since(generation) == {"a"}
    e.add_node(toy_node("a"))  # type: ignore[arg-type]  # the Node object changed: still not live
    assert not e.schedule(make_pod("new", {"main": {CARD: 1}})).scheduled


def test_the_extenders_remembered_answers_follow_liveness() -> None:
    from kubegpu.core.testing import pod_manifest

    from .test_extender_answers import answers, fresh_answers, make_extender  # a fresh extender is the oracle

    e = engine()
    for name in ("a", "b"):
        e.add_node(toy_node(name))  # type: ignore[arg-type]
    extender = make_extender(e)
    pod = pod_manifest("p", {"main": {CARD: 1}})
    answers(extender, pod, ["a", "b"])
    for name, live in (("a", False), ("a", True), ("b", False)):
        e.set_node_live(name, live, None if live else DEAD)
        assert answers(extender, pod, ["a", "b"]) == fresh_answers(e, pod, ["a", "b"])
    filtered, _ = answers(extender, pod, ["a", "b"])
    assert filtered["NodeNames"] == ["a"] and set(filtered["FailedAndUnresolvableNodes"]) == {"b"}


# -- the Leases ------------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, 1_700_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def lease(node: str, renew: str | None, duration: int = 8) -> dict[str, object]:
    return {
        "metadata": {"name": lease_name(node), "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "renewTime": renew, "leaseDurationSeconds": duration},
    }


def rfc3339(seconds: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((seconds % 1) * 1e6):06d}Z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20.250000Z", 1_700_000_000.25),
        ("2023-11-14T23:13:20+01:00", 1_700_000_000.0),
        ("yesterday", None),
        (None, None),
        ("2023-13-45T99:99:99Z", None),
    ],
    ids=["time", "microtime", "offset", "words", "none", "out-of-range"],
)
def test_kubernetes_times_parse(text: object, expected: float | None) -> None:
    parsed = parse_time(text)
    assert parsed == expected if expected is None else math.isclose(parsed or 0, expected)


def test_a_lease_expires_after_its_duration_on_the_schedulers_clock() -> None:
    clock = Clock()
    leases = NodeLeases(clock=lambda: clock.mono, wall=lambda: clock.wall)
    assert leases.verdicts(["a"]) == {"a": None}  # not synced yet: nobody is judged
    leases.observe("SYNC", [lease("a", rfc3339(clock.wall - 1))])
    assert leases.verdicts(["a", "no-lease"]) == {"a": None, "no-lease": None}  # auto: no lease, not judged
    clock.advance(6.5)
    assert leases.verdicts(["a"]) == {"a": None}
    clock.advance(1)
    reason = leases.verdicts(["a"])["a"]
    assert reason is not None and reason.startswith(
        "node(s) had an expired kubegpu node lease (kube-node-lease/kubegpu-a, last renewed 8s ago"
    )
    # A renewal written by a clock an hour behind still counts from when the scheduler saw it.
    leases.observe("MODIFIED", lease("a", rfc3339(clock.wall - 3600)))
    assert leases.verdicts(["a"]) == {"a": None}
    clock.advance(300)
    assert "last renewed 5m ago" in (leases.verdicts(["a"])["a"] or "")
    leases.observe("DELETED", lease("a", None))
    assert leases.verdicts(["a"]) == {"a": None}  # auto: deleting the Lease takes the node out of the check


def test_a_lease_first_seen_long_expired_is_dead_at_once_and_required_mode_wants_one() -> None:
    clock = Clock()
    leases = NodeLeases(mode="required", clock=lambda: clock.mono, wall=lambda: clock.wall)
    leases.observe("SYNC", [lease("a", rfc3339(clock.wall - 7200)), lease("b", rfc3339(clock.wall + 60))])
    verdicts = leases.verdicts(["a", "b", "c"])
    assert "last renewed 2h ago" in (verdicts["a"] or "")
    assert verdicts["b"] is None  # a clock running ahead gains nothing: it counts from now
    assert verdicts["c"] == (
        "node(s) had no kubegpu node lease (kube-node-lease/kubegpu-c; is kubegpu advertise running there?)"
    )
    clock.advance(8.5)
    assert leases.verdicts(["b"])["b"] is not None


def test_leases_that_are_not_kubegpus_are_ignored() -> None:
    leases = NodeLeases(mode="required")
    leases.observe("SYNC", [{"metadata": {"name": "a"}, "spec": {}}, {"metadata": {"name": "kubegpu-"}}, "junk"])
    assert leases.leases == {}
