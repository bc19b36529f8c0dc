"""Pods kubegpu did not place hold exactly the device ids their kubelet reports (`Engine.set_held_devices`).

A pod bound without a verified allocation is held by count: some free cards are set aside for it, and a verified
allocation may take them over. Once the node side publishes the ids the kubelet really gave it (PodResources), the
ledger holds those ids instead, and kubegpu never hands them to another pod.
"""

from __future__ import annotations

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.scheduler.engine import Engine

from . import toy_plugin as toy

CARD = toy.RESOURCE
KEY = b"k" * 32


def engine() -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False), signing_key=KEY)
    e.add_node(make_node("n1", labels={"toy.example/cards": "4"}, allocatable={CARD: 4}))
    return e


def held(e: Engine, key: str) -> list[str]:
    return sorted(i for part in e.pods[key].parts.values() for ids in part.containers.values() for i in ids[CARD])


def test_a_pod_held_by_count_moves_to_the_ids_its_kubelet_reports() -> None:
    e = engine()
    foreign = make_pod("foreign", {"main": {CARD: 2}})
    assert e.admit_by_count(foreign, "n1").scheduled and e.pods[foreign.key].by_count
    assert held(e, foreign.key) == ["0", "1"]  # a guess: the first free cards
    assert e.set_held_devices("n1", {foreign.key: {"main": {CARD: ["2", "3"]}}}) == [foreign.key]
    assert held(e, foreign.key) == ["2", "3"] and not e.pods[foreign.key].by_count
    placed = e.schedule(make_pod("placed", {"main": {CARD: 2}}))
    assert placed.allocation is not None and placed.allocation.containers["main"][CARD] == ["0", "1"]
    assert e.set_held_devices("n1", {foreign.key: {"main": {CARD: ["2", "3"]}}}) == []  # unchanged: nothing to do


def test_a_pod_held_after_publication_takes_its_ids_at_once_and_displaces_a_count_hold() -> None:
    e = engine()
    counted = make_pod("counted", {"main": {CARD: 1}})
    assert e.admit_by_count(counted, "n1").scheduled and held(e, counted.key) == ["0"]
    foreign = make_pod("foreign", {"main": {CARD: 1}})
    e.set_held_devices("n1", {foreign.key: {"main": {CARD: ["0"]}}})
    assert e.admit_by_count(foreign, "n1").scheduled
    assert held(e, foreign.key) == ["0"] and not e.pods[foreign.key].by_count
    assert e.pods[counted.key].by_count and held(e, counted.key) == ["1"]  # set aside again, elsewhere


def test_a_verified_allocation_cannot_take_over_ids_the_kubelet_reports_for_another_pod() -> None:
    e = engine()
    pod = make_pod("real", {"main": {CARD: 1}})
    decision = e.schedule(pod)
    assert decision.allocation is not None and decision.allocation.containers["main"][CARD] == ["0"]
    e.release(pod.key)
    foreign = make_pod("foreign", {"main": {CARD: 1}})
    e.set_held_devices("n1", {foreign.key: {"main": {CARD: ["0"]}}})
    assert e.admit_by_count(foreign, "n1").scheduled
    assert not e.admit_bound(pod, "n1", decision.allocation).ok  # the card is really in use by the foreign pod
    assert held(e, foreign.key) == ["0"]


def test_published_ids_that_do_not_fit_leave_the_pod_held_by_count() -> None:
    e = engine()
    foreign = make_pod("foreign", {"main": {CARD: 1}})
    e.set_held_devices("n1", {foreign.key: {"main": {CARD: ["9"]}}})  # no such card
    assert e.admit_by_count(foreign, "n1").scheduled and e.pods[foreign.key].by_count
