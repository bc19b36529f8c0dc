"""What GAS users bring with them to the intel-gas plugin: `gas-same-gpu`, and pods requesting `gpu.intel.com/*`
without `i915`, which GAS leaves to the default scheduler."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.status import Code
from kubegpu.core.testing import make_pod
from kubegpu.plugins.intel_gas import scheduler

from .test_intel_gas import GAS, I915, MEM, MILLI, XE, G, Gas, cards_of, intel_node

SAME = "gas-same-gpu"


@pytest.fixture
def gas(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> Gas:
    return Gas(make_plugin_manager("scheduler", **{GAS: scheduler}))


def same_gpu_pod(value: str, containers: dict[str, dict[str, str | int]] | None = None) -> PodRequest:
    containers = containers or {
        "nginx": {I915: 1, MILLI: 400},
        "busybox2": {I915: 1, MILLI: 100},
        "busybox1": {I915: 1, MILLI: 100},
    }
    return make_pod("demo", containers, annotations={SAME: value})


def test_gas_same_gpu_puts_the_listed_containers_on_one_card(gas: Gas) -> None:
    # GAS's documented example: busybox1 and busybox2 share a card; nginx goes where it fits best.
    state = gas.build(intel_node(2, i915=20, extra={MILLI: 2000}))
    allocation = gas.schedule(state, same_gpu_pod("busybox1,busybox2"))
    nginx, busybox2, busybox1 = cards_of(allocation).split("|")
    assert busybox1 == busybox2
    assert allocation.shares["busybox1"][MILLI] == {busybox1: 100}
    assert allocation.shares["busybox2"][MILLI] == {busybox2: 100}
    assert allocation.shares["nginx"][MILLI] == {nginx: 400}


def test_without_gas_same_gpu_the_same_containers_land_on_two_cards(gas: Gas) -> None:
    containers = {"a": {I915: 1, MILLI: 400}, "b": {I915: 1, MILLI: 400}}
    results = []
    for extra in ({}, {SAME: "a,b"}):
        state = gas.build(intel_node(2, i915=20, extra={MILLI: 2000}))  # 1000 millicores a card
        gas.schedule(state, make_pod("busy", {"main": {I915: 1, MILLI: 500}}, annotations={"gas-allow": "card1"}))
        results.append(cards_of(gas.schedule(state, make_pod("p", containers, annotations=extra))))
    # Container by container, a fills the busier card1 and b no longer fits there; together they need card0.
    assert results == ["card1|card0", "card0|card0"]


def test_gas_same_gpu_needs_one_card_with_the_sum_free(gas: Gas) -> None:
    state = gas.build(intel_node(2, i915=20, extra={MILLI: 2000}))  # 1000 millicores a card
    for card in ("card0", "card1"):
        gas.schedule(state, make_pod(f"half-{card}", {"main": {I915: 1, MILLI: 500}}, annotations={"gas-allow": card}))
    # 500 free on each card: two 300-millicore containers fit apart, but not together.
    pod = make_pod("pair", {"a": {I915: 1, MILLI: 300}, "b": {I915: 1, MILLI: 300}}, annotations={SAME: "a,b"})
    status = gas.fit(state=state, pod=pod)
    assert status.code is Code.UNSCHEDULABLE and "gpu.intel.com/millicores: needs 600" in status.message
    apart = make_pod("apart", {"a": {I915: 1, MILLI: 300}, "b": {I915: 1, MILLI: 300}})
    assert gas.fit(state=state, pod=apart).ok
    # Larger than any card even when empty: unresolvable.
    huge = make_pod("huge", {"a": {I915: 1, MILLI: 600}, "b": {I915: 1, MILLI: 500}}, annotations={SAME: "a,b"})
    assert gas.fit(state=state, pod=huge).code is Code.UNRESOLVABLE


@pytest.mark.parametrize(
    ("value", "containers", "reason"),
    [
        ("busybox1", None, "is malformed"),
        ("", None, "is malformed"),
        ("busybox1,busybox1", None, "is malformed"),
        ("busybox1,busybox5", None, "'busybox5', which is not a container of the pod"),
        ("a,b", {"a": {I915: 2}, "b": {I915: 1}}, "container a is listed in gas-same-gpu: it must request exactly 1"),
        ("a,b", {"a": {I915: 1}, "b": {"cpu": "1"}}, "container b is listed in gas-same-gpu"),
        ("a,b", {"a": {I915: 1, "gpu.intel.com/tiles": 1}, "b": {I915: 1}}, "cannot request gpu.intel.com/tiles"),
    ],
    ids=["single-name", "empty", "duplicate", "absent-container", "two-cards", "no-i915", "tiles"],
)
def test_a_gas_same_gpu_value_gas_would_reject_is_refused_with_the_reason(
    gas: Gas, value: str, containers: dict[str, dict[str, str | int]] | None, reason: str
) -> None:
    status = gas.validate(pod=same_gpu_pod(value, containers))
    assert status is not None and status.code is Code.UNRESOLVABLE
    assert reason in status.message


def test_xe_containers_may_share_a_card_too(gas: Gas) -> None:
    from kubegpu.core.testing import make_node

    node = make_node("xe-0", labels={"gpu.intel.com/gpu-numbers": "0.1"}, allocatable={XE: 8, MEM: "16G"})
    state = gas.build(node)
    pod = make_pod("p", {"a": {XE: 1, MEM: "3G"}, "b": {XE: 1, MEM: "3G"}}, annotations={SAME: "b,a"})
    allocation = gas.schedule(state, pod)
    card_a, card_b = cards_of(allocation).split("|")
    assert card_a == card_b
    assert allocation.shares["a"][MEM] == {card_a: 3 * G}


def test_without_i915_is_refused_by_default_and_ignored_on_request(gas: Gas, monkeypatch: pytest.MonkeyPatch) -> None:
    state = gas.build(intel_node(2))
    pod = make_pod("memory-only", {"main": {MEM: "5G"}})
    status = gas.validate(pod=pod)
    assert status is not None and "must also request gpu.intel.com/i915" in status.message
    monkeypatch.setenv(scheduler.WITHOUT_I915_ENV, "ignore")
    ignored = make_pod("memory-only", {"main": {MEM: "5G"}})
    assert gas.validate(pod=ignored) is None
    assert gas.fit(state=state, pod=ignored).ok
    allocation = gas.allocate(state=state, pod=ignored)
    assert allocation is not None and allocation.containers == {} and allocation.annotations == {}
    # An i915 pod beside it is still placed card by card.
    assert cards_of(gas.schedule(state, make_pod("gpu", {"main": {I915: 1, MEM: "5G"}}))) == "card0"
