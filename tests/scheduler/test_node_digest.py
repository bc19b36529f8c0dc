"""`kubegpu_scheduler_node_digest`: what a plugin's state reads of a node beyond its labels, allocatable and
inventories. The engine takes nodes alike in those for one class, whose unresolvable refusal in a cycle settles every
node of it, and wakes the pods that fit nowhere only when a node changes one of them. A third-party plugin that reads
a node annotation (here a card's firmware, as the nvidia plugin reads HAMi's GPU registration) says so through the
hook: nodes that differ in it are then told apart, and a change to it wakes the waiting pods. An answer that is no
key costs its node its class, logged naming the plugin, never the cycle."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kubegpu.core import scheduler_hooks
from kubegpu.core.kit import WholeDeviceNodeState, WholeDevicePlugin, WholeDevicePodState, label_devices
from kubegpu.core.models import DeviceInfo, NodeInfo, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine

CARD = "cards.example/card"
FIRMWARE = "cards.example/firmware"  # a node annotation the card's own agent writes; a pod asks one by annotation


class Firmware(WholeDevicePlugin):
    """Cards from the label `cards.example/card.count`, whose firmware (the node's annotation) a pod may require."""

    resources = (CARD,)

    def devices(self, node: NodeInfo) -> tuple[list[DeviceInfo], Any] | None:
        return label_devices(node.labels, f"{CARD}.count", "card"), node.annotations.get(FIRMWARE)

    def read(self, pod: PodRequest) -> Any:
        return pod.annotations.get(FIRMWARE)

    def eligible(self, state: WholeDeviceNodeState, request: WholeDevicePodState) -> tuple[int, str | None]:
        wanted = request.extra
        if wanted is not None and state.extra != wanted:
            return 0, f"node(s) have no card of firmware {wanted}"
        return state.healthy, None


class Digesting(Firmware):
    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_node_digest(self, node: NodeInfo) -> Any:
        return node.annotations.get(FIRMWARE)


class Unhashable(Firmware):
    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_node_digest(self, node: NodeInfo) -> Any:
        return [node.annotations.get(FIRMWARE)]  # a list: no key


def card_node(name: str, firmware: str) -> NodeInfo:
    return make_node(name, labels={f"{CARD}.count": "2"}, allocatable={CARD: 2}, annotations={FIRMWARE: firmware})


def wants(name: str, firmware: str) -> PodRequest:
    return make_pod(name, {"main": {CARD: 1}}, annotations={FIRMWARE: firmware})


def engine_with(plugin: Firmware, percentage: int = 0) -> Engine:
    plugins = make_plugin_manager("scheduler", plugins=[("cards", plugin)], autoload=False)
    return Engine(plugins, scoring=scores.Profile(percentage_of_nodes_to_score=percentage))


@pytest.mark.parametrize("percentage", [0, 100], ids=["sampled", "every-node"])
def test_nodes_that_differ_in_what_the_plugin_reads_are_not_one_class(percentage: int) -> None:
    engine = engine_with(Digesting(), percentage)
    for i in range(4):
        engine.add_node(card_node(f"old-{i}", "1.0"))
    engine.add_node(card_node("new", "2.0"))
    decision = engine.schedule(wants("p", "2.0"))
    assert decision.scheduled and decision.node == "new", decision.reason
    assert engine.nodes["new"].klass != engine.nodes["old-0"].klass
    assert engine.nodes["old-1"].klass == engine.nodes["old-0"].klass  # alike stay one class


def test_a_change_to_what_the_plugin_reads_wakes_the_waiting_pods_and_nothing_else_does() -> None:
    engine = engine_with(Digesting())
    before = card_node("n", "1.0")
    engine.add_node(before)
    assert not engine.schedule(wants("p", "2.0")).scheduled
    upgraded = card_node("n", "2.0")
    assert engine.node_change_may_help(before, upgraded) == "what a plugin reads of the node"
    assert engine.node_change_may_help(before, card_node("n", "1.0")) is None
    engine.add_node(upgraded)
    assert engine.schedule(wants("p", "2.0")).node == "n"


def test_a_digest_that_is_no_key_costs_its_node_its_class_not_the_cycle(caplog: pytest.LogCaptureFixture) -> None:
    engine = engine_with(Unhashable())
    with caplog.at_level(logging.ERROR):
        for i in range(3):
            engine.add_node(card_node(f"old-{i}", "1.0"))
        engine.add_node(card_node("new", "2.0"))
    assert "cards" in caplog.text and "kubegpu_scheduler_node_digest" in caplog.text and "hashable" in caplog.text
    assert len({record.klass for record in engine.nodes.values()}) == 4  # each node its own class: none settles another
    decision = engine.schedule(wants("p", "2.0"))
    assert decision.scheduled and decision.node == "new", decision.reason


class Failing(Firmware):
    asked = 0

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_node_digest(self, node: NodeInfo) -> Any:
        type(self).asked += 1
        raise RuntimeError("firmware agent unreachable")


def test_a_digest_failing_on_every_update_is_asked_once_per_update_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A plugin's digest that raises on every Node update (a card agent gone): asked once per update, where it was
    asked three times (the class, then the wake's old and new node), and logged once until it answers again for
    the node (before: three error lines per node per update, a HAMi handshake's rewrite every 30 s on each node)."""
    Failing.asked = 0
    engine = engine_with(Failing())
    previous = None
    with caplog.at_level(logging.DEBUG):
        for firmware in ("1.0", "1.1", "1.2", "1.3"):
            info = card_node("n", firmware)
            engine.add_node(info)
            engine.node_change_may_help(previous, info)
            previous = info
        engine.recheck_digests()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "firmware agent unreachable" in errors[0], errors
    assert Failing.asked == 5  # four updates and one recheck
    assert engine.recheck_digests() == []  # a failure is the same class each time: not built again
    engine.remove_node("n")
    assert not engine._digest_failing  # forgotten with its node
