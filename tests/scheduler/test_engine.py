"""The engine's own behaviour, with a toy plugin: what a user of any device family would notice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation, verify_allocation
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler.engine import Engine, summarize_reasons

from . import toy_plugin as toy

CARD = toy.RESOURCE


@pytest.fixture(autouse=True)
def _unbreak() -> Iterator[None]:
    toy.BROKEN_HOOKS.clear()
    yield
    toy.BROKEN_HOOKS.clear()


def engine(policy: str = "binpack", **kwargs: object) -> Engine:
    pm = make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False)
    return Engine(pm, policy=policy, **kwargs)  # type: ignore[arg-type]


def toy_node(name: str, cards: int, **kwargs: object) -> object:
    labels = {"toy.example/cards": str(cards)} if cards else {}
    labels.update(kwargs.pop("labels", {}))  # type: ignore[arg-type]
    allocatable = {CARD: cards} if cards else {}
    allocatable.update(kwargs.pop("allocatable", {}))  # type: ignore[arg-type]
    return make_node(name, labels=labels, allocatable=allocatable, **kwargs)  # type: ignore[arg-type]


def test_places_devices_and_writes_the_allocation_annotation() -> None:
    e = engine()
    e.add_node(toy_node("n1", 4))  # type: ignore[arg-type]
    decision = e.schedule(make_pod("p", {"main": {CARD: 2}}))
    assert decision.scheduled and decision.node == "n1"
    record = decode_allocation(decision.annotations[ALLOCATION_KEY])
    assert record.node == "n1" and record.containers == {"main": {CARD: ["0", "1"]}}
    assert decision.annotations["toy.example/seen"] == "yes"


def test_signed_allocations_verify_with_the_same_key_only() -> None:
    e = engine(signing_key=b"secret")
    e.add_node(toy_node("n1", 4))  # type: ignore[arg-type]
    record = decode_allocation(e.schedule(make_pod("p", {"main": {CARD: 1}})).annotations[ALLOCATION_KEY])
    assert verify_allocation(record, b"secret")
    assert not verify_allocation(record, b"other")


def test_reasons_are_aggregated_like_kube_scheduler() -> None:
    e = engine()
    e.add_node(toy_node("full", 1))  # type: ignore[arg-type]
    e.add_node(toy_node("cpu-only", 0))  # type: ignore[arg-type]
    e.add_node(toy_node("tainted", 4, taints=[{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]))  # type: ignore[arg-type]
    assert e.schedule(make_pod("a", {"main": {CARD: 1}})).node == "full"
    decision = e.schedule(make_pod("b", {"main": {CARD: 1}}))
    assert not decision.scheduled
    assert decision.reason == (
        "0/3 nodes are available: 1 node(s) had taint {dedicated: infra}, that the pod didn't tolerate, "
        f"2 Insufficient {CARD}."
    )


def test_tolerations_node_selector_and_cpu_are_filters() -> None:
    e = engine()
    e.add_node(toy_node("gpu", 2, labels={"pool": "a"}, taints=[{"key": "gpu", "effect": "NoSchedule"}]))  # type: ignore[arg-type]
    tolerant = make_pod(
        "t", {"main": {CARD: 1}}, tolerations=[{"key": "gpu", "operator": "Exists"}], node_selector={"pool": "a"}
    )
    assert e.schedule(tolerant).scheduled
    wrong_pool = make_pod("w", {"main": {CARD: 1}}, tolerations=[{"operator": "Exists"}], node_selector={"pool": "b"})
    assert e.schedule(wrong_pool).reason == "0/1 nodes are available: 1 node(s) didn't match node selector."
    hungry = make_pod("h", {"main": {"cpu": "500"}}, tolerations=[{"operator": "Exists"}])
    assert e.schedule(hungry).reason == "0/1 nodes are available: 1 Insufficient cpu."


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_policy_prefers_busy_or_idle_nodes(policy: str) -> None:
    e = engine(policy)
    e.add_node(toy_node("a", 4))  # type: ignore[arg-type]
    e.add_node(toy_node("b", 4))  # type: ignore[arg-type]
    seed = e.schedule(make_pod("seed", {"main": {CARD: 1}}, node_selector={}))
    busy = seed.node
    idle = "b" if busy == "a" else "a"
    decision = e.schedule(make_pod("next", {"main": {CARD: 1}}))
    assert decision.node == (busy if policy == "binpack" else idle)


def test_delete_releases_exactly_what_was_taken() -> None:
    e = engine()
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    assert e.schedule(make_pod("a", {"main": {CARD: 2}})).scheduled
    assert not e.schedule(make_pod("b", {"main": {CARD: 1}})).scheduled
    released = e.release("default/a")
    assert released is not None and released.allocation is not None
    assert released.allocation.containers == {"main": {CARD: ["0", "1"]}}
    assert e.schedule(make_pod("b", {"main": {CARD: 2}})).scheduled
    assert e.release("default/missing") is None


KEY = b"k" * 32


def signed_placement(e: Engine, name: str, cards: int) -> tuple[object, object]:
    """Schedule a pod in `e`, then forget it: (its request bound to its node, its signed allocation)."""
    pod = make_pod(name, {"main": {CARD: cards}})
    decision = e.schedule(pod)
    assert decision.scheduled and decision.allocation is not None
    e.release(pod.key)
    return pod, decision.allocation


def test_assume_refuses_a_device_already_held() -> None:
    e = engine(signing_key=KEY)
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    pod_b, allocation_b = signed_placement(e, "b", 1)
    first = e.schedule(make_pod("a", {"main": {CARD: 1}}))
    assert first.allocation is not None and first.allocation.containers == allocation_b.containers  # type: ignore[attr-defined]
    # a's allocation was issued after b's: b's is the stale one and holds nothing.
    status = e.admit_bound(pod_b, "n1", allocation_b)  # type: ignore[arg-type]
    assert not status.ok and "is stale: its devices are held by default/a" in status.message
    assert "default/b" not in e.pods and "default/a" in e.pods


@pytest.mark.parametrize(
    ("tamper", "problem"),
    [
        ({"podUID": "another-pods-uid"}, "it was issued to the pod with UID 'another-pods-uid'"),
        ({"node": "n2"}, "it names node 'n2' but the pod is bound to 'n1'"),
        ({"signature": None}, "its signature does not verify"),
        ({"signature": "00" * 32}, "its signature does not verify"),
        ({"containers": {"main": {CARD: ["0", "1"]}}}, "its signature does not verify"),
    ],
    ids=["copied-from-another-pod", "other-node", "unsigned", "forged-signature", "devices-added-after-signing"],
)
def test_only_a_verified_allocation_holds_devices(tamper: dict[str, object], problem: str) -> None:
    e = engine(signing_key=KEY)
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    e.add_node(toy_node("n2", 2))  # type: ignore[arg-type]
    pod, allocation = signed_placement(e, "squatter", 1)
    claim = allocation.model_copy(update=tamper)  # type: ignore[attr-defined]
    status = e.admit_bound(pod, "n1", claim)  # type: ignore[arg-type]
    assert not status.ok and problem in status.message
    assert "default/squatter" not in e.pods
    # The claimed devices stay free for everyone else.
    assert {e.schedule(make_pod(f"other-{i}", {"main": {CARD: 2}})).node for i in range(2)} == {"n1", "n2"}


def test_a_later_allocation_displaces_a_stale_one_and_a_count_hold() -> None:
    e = engine(signing_key=KEY)
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    stale_pod, stale = signed_placement(e, "stale", 2)
    fresh_pod, fresh = signed_placement(e, "fresh", 1)
    assert fresh.issued > stale.issued  # type: ignore[attr-defined]
    counted = make_pod("counted", {"main": {CARD: 1}})
    # Restart order: the stale allocation and a pod bound without one are seen first.
    assert e.admit_bound(stale_pod, "n1", stale).ok  # type: ignore[arg-type]
    assert not e.admit_by_count(counted, "n1").scheduled  # both cards are taken by the stale allocation
    assert e.admit_bound(fresh_pod, "n1", fresh).ok  # type: ignore[arg-type]
    assert "default/stale" not in e.pods
    assert e.pods["default/fresh"].allocation == fresh
    # The freed card is not handed out twice: the pod bound by count takes it, and a count hold yields to a
    # verified allocation that names its card.
    assert e.admit_by_count(counted, "n1").scheduled
    assert e.pods["default/counted"].by_count
    assert not e.schedule(make_pod("late", {"main": {CARD: 1}})).scheduled


def test_a_verified_allocation_takes_over_a_card_held_by_count() -> None:
    e = engine(signing_key=KEY)
    e.add_node(toy_node("n1", 1))  # type: ignore[arg-type]
    pod, allocation = signed_placement(e, "real", 1)
    assert e.admit_by_count(make_pod("counted", {"main": {CARD: 1}}), "n1").scheduled
    assert e.admit_bound(pod, "n1", allocation).ok  # type: ignore[arg-type]
    assert e.pods["default/real"].allocation == allocation
    assert "default/counted" not in e.pods  # no card left to set aside for it: logged, not double-counted


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (RuntimeError("toy fit exploded"), "RuntimeError: toy fit exploded"),
        (SystemExit("toy fit: bad settings"), "SystemExit: toy fit: bad settings"),
    ],
    ids=["raising", "exiting"],
)
def test_a_plugin_failing_in_fit_names_the_plugin_and_the_engine_survives(
    failure: BaseException, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook that raises, or calls `sys.exit` (a plugin parsing its settings with argparse on first use: that ended
    the engine's caller, the scheduler process, at the first pod that reached the plugin and again at every
    restart), is that plugin's failure: the reason names the plugin and the hook, as the README promises."""

    def fails(hook: str) -> None:
        if hook in toy.BROKEN_HOOKS:
            raise failure

    monkeypatch.setattr(toy, "_maybe_break", fails)
    e = engine()
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    toy.BROKEN_HOOKS.add("fit")
    decision = e.schedule(make_pod("a", {"main": {CARD: 1}}))
    assert not decision.scheduled
    assert f"plugin 'toy' failed in kubegpu_scheduler_fit: {said}" in (decision.reason or "")
    toy.BROKEN_HOOKS.clear()
    assert e.schedule(make_pod("plain", {"main": {"cpu": "1"}})).scheduled
    assert e.schedule(make_pod("a", {"main": {CARD: 1}})).scheduled


def test_a_failing_take_rolls_back_and_holds_nothing() -> None:
    e = engine()
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    toy.BROKEN_HOOKS.add("take")
    decision = e.schedule(make_pod("a", {"main": {CARD: 1}}))
    assert not decision.scheduled and "toy take exploded" in (decision.reason or "")
    assert e.pods == {} and e.nodes["n1"].used["pods"] == 0


def test_validate_refusal_is_the_reason() -> None:
    e = engine()
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    decision = e.schedule(make_pod("a", {"main": {CARD: 1}}, annotations={"toy.example/refuse": "1"}))
    assert decision.reason == "toy requests marked refuse are refused"


def test_node_update_keeps_the_pods_it_holds() -> None:
    e = engine()
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    assert e.schedule(make_pod("a", {"main": {CARD: 2}})).scheduled
    e.add_node(toy_node("n1", 3))  # type: ignore[arg-type]
    assert e.schedule(make_pod("b", {"main": {CARD: 1}})).allocation.containers == {"main": {CARD: ["2"]}}  # type: ignore[union-attr]
    assert not e.schedule(make_pod("c", {"main": {CARD: 1}})).scheduled


def test_a_node_that_no_longer_lists_a_device_a_running_pod_holds_gives_none_of_its_devices_until_it_leaves() -> None:
    """Card 3 fell off the bus: the node lists three cards where it listed four while `a` runs on cards 0 and 3. The
    re-take of `a` on the changed node failed and `a` was dropped from the books, still running: card 0 went to `b`
    (two live pods on one card) and a's cpu to `c`. `a` stays counted; the node's cards wait until it leaves."""
    e = engine()
    e.add_node(toy_node("n1", 4, allocatable={"cpu": "4"}))  # type: ignore[arg-type]
    for name, cards in (("p1", 1), ("p2", 2), ("p3", 1)):
        assert e.schedule(make_pod(name, {"main": {CARD: cards}})).scheduled
    e.release("default/p1")
    e.release("default/p3")
    a = e.schedule(make_pod("a", {"main": {CARD: 2, "cpu": "2"}}))
    assert a.allocation is not None and a.allocation.containers == {"main": {CARD: ["0", "3"]}}
    e.release("default/p2")
    e.add_node(toy_node("n1", 3, allocatable={"cpu": "4"}))  # type: ignore[arg-type]
    b = e.schedule(make_pod("b", {"main": {CARD: 1}}))
    assert not b.scheduled, f"b was given {b.allocation.containers if b.allocation else None} beside a"
    assert "pod default/a runs on devices this node no longer lists" in (b.reason or ""), b.reason
    assert not e.schedule(make_pod("c", {"main": {"cpu": "3"}})).scheduled, "a's cpu was given to c"
    e.release("default/a")
    b = e.schedule(make_pod("b", {"main": {CARD: 1}}))
    assert b.allocation is not None and b.allocation.containers == {"main": {CARD: ["0"]}}


def test_summary_without_reasons() -> None:
    assert summarize_reasons(0, __import__("collections").Counter()) == "0/0 nodes are available."


def test_a_replaced_or_removed_node_keeps_the_count_of_placed_priorities_true() -> None:
    """Preemption's quick check ("nothing of lower priority anywhere") reads that count."""
    e = engine()
    e.add_node(toy_node("n1", 2))  # type: ignore[arg-type]
    assert e.schedule(make_pod("a", {"main": {CARD: 1}})).scheduled
    e.add_node(toy_node("n1", 2, labels={"changed": "yes"}))  # type: ignore[arg-type]
    assert "default/a" in e.pods
    assert +e._priorities == {0: 1}
    e.remove_node("n1")
    assert +e._priorities == {}
