"""The intel-gas scheduler plugin: GPU Aware Scheduling's per-card rules, as a scheduler user meets them."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import (
    DEVICES_KEY,
    decode_allocation,
    encode_allocation,
    encode_devices,
    merge_allocations,
)
from kubegpu.core.models import (
    DeviceInfo,
    DeviceInventory,
    NodeDevices,
    NodeInfo,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.core.scheduler_hooks import DeviceNodeState
from kubegpu.core.status import Code
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.intel_gas import scheduler
from kubegpu.plugins.intel_gas.cards import cards_from_labels, format_amount, parse_card_names

GAS = "intel-gas"
I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"
MEM = "gpu.intel.com/memory.max"
MILLI = "gpu.intel.com/millicores"
G = 10**9
NO_FIT = "Not enough GPU-resources for deployment: will not fit"


def intel_node(
    cards: int = 2,
    *,
    i915: int | None = None,
    memory: str = "16G",
    extra: Mapping[str, str | int] | None = None,
    devices: Sequence[tuple[str, bool]] | None = None,
) -> NodeInfo:
    """A node with `cards` cards listed in `gpu-numbers`; `i915` defaults to 4 shares per card.

    `devices` adds an advertised inventory of (card, healthy) pairs, which takes precedence over the label.
    """
    allocatable: dict[str, str | int] = {I915: 4 * cards if i915 is None else i915, MEM: memory}
    allocatable.update(extra or {})
    annotations = {}
    if devices is not None:
        inventory = DeviceInventory(plugin=GAS, devices=[DeviceInfo(id=d, healthy=ok) for d, ok in devices])
        annotations[DEVICES_KEY] = encode_devices(NodeDevices(inventories={GAS: inventory}))
    labels = {"gpu.intel.com/gpu-numbers": ".".join(str(i) for i in range(cards))}
    return make_node("intel-0", labels=labels, allocatable=allocatable, annotations=annotations)


def gpu_pod(name: str = "pod-0", i915: int = 1, memory: str | None = None, **kwargs: Any) -> PodRequest:
    resources: dict[str, str | int] = {I915: i915}
    if memory is not None:
        resources[MEM] = memory
    return make_pod(name, {"main": resources}, **kwargs)


class Gas:
    """The plugin as the engine drives it, through the plugin manager."""

    def __init__(self, pm: KubegpuPluginManager) -> None:
        self.pm = pm

    def __getattr__(self, hook: str) -> Callable[..., Any]:
        return lambda **kwargs: self.pm.call(GAS, f"kubegpu_scheduler_{hook}", **kwargs)

    def build(self, node: NodeInfo) -> DeviceNodeState:
        state = self.build_node(node=node)
        assert state is not None
        return state

    def schedule(self, state: DeviceNodeState, pod: PodRequest) -> PluginAllocation:
        status = self.fit(state=state, pod=pod)
        assert status.ok, status.message
        allocation = self.allocate(state=state, pod=pod)
        assert allocation is not None
        taken = self.take(state=state, pod_key=pod.key, allocation=allocation)
        assert taken.ok, taken.message
        return allocation

    def snapshot(self, state: DeviceNodeState) -> tuple[Any, Any]:
        return self.headroom(state=state), self.describe(state=state)


@pytest.fixture
def gas(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> Gas:
    return Gas(make_plugin_manager("scheduler", **{GAS: scheduler}))


def cards_of(allocation: PluginAllocation) -> str:
    return allocation.annotations["gas-container-cards"]


# ----------------------------------------------------------------------------------------------------------
# Which cards a node has
# ----------------------------------------------------------------------------------------------------------

NUMBERS = "gpu.intel.com/gpu-numbers"
CARDS = "gpu.intel.com/cards"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({NUMBERS: "0.1.2"}, ["card0", "card1", "card2"]),
        (
            {NUMBERS: "0.1.", f"{NUMBERS}2": "Z2.3", f"{NUMBERS}3": "Z.10"},
            ["card0", "card1", "card2", "card3", "card10"],
        ),
        ({NUMBERS: "10.2.1"}, ["card1", "card2", "card10"]),
        ({CARDS: "card0.card1"}, ["card0", "card1"]),
        ({NUMBERS: "3", CARDS: "card0.card1"}, ["card3"]),
        ({NUMBERS: "0.1", f"{NUMBERS}2": "2", CARDS: "card0.card5"}, ["card0", "card5"]),
        ({NUMBERS: "0..x.1.1"}, ["card0", "card1"]),
        ({}, []),
    ],
    ids=[
        "gpu-numbers",
        "continuations-strip-Z",
        "numeric-card-order",
        "deprecated-cards-label",
        "gpu-numbers-wins-over-cards",
        "continuation-without-Z-falls-back",
        "blanks-junk-repeats-skipped",
        "no-labels",
    ],
)
def test_cards_come_from_gpu_numbers_then_the_cards_label(labels: dict[str, str], expected: list[str]) -> None:
    assert cards_from_labels(labels) == expected


class CountingLabels(dict[str, str]):
    """A node's labels that count how many of them the plugin reads."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)


def test_a_node_labelled_with_endless_gpu_numbers_continuations_is_refused_after_a_few_reads(gas: Gas) -> None:
    """The labels are the node's: 20000 `gpu-numbers` continuations of ten card numbers each were all joined, one
    string concatenation at a time (18 s of the engine's one thread, on every update of that node), before the count
    of cards was refused. Joining now stops past what 1024 cards could need, naming the label."""
    labels = CountingLabels({"gpu.intel.com/gpu-numbers": "0"})
    for k in range(2, 20000):
        labels[f"gpu.intel.com/gpu-numbers{k}"] = "Z." + ".".join(str(10 * k + j) for j in range(10))
    with pytest.raises(ValueError, match=r"gpu-numbers label and its continuations .* run past 8192 characters"):
        cards_from_labels(labels)
    assert labels.reads < 200
    node = make_node("hostile", labels=labels, allocatable={I915: 8})
    with pytest.raises(PluginHookError, match="run past 8192 characters"):
        gas.build(node)


@pytest.mark.parametrize(
    ("resource", "value", "text"),
    [
        (MEM, 5 * G, "5G"),
        (MEM, 16 << 30, "16Gi"),
        (MEM, 3589934592, "3589934592 (~3.59G)"),
        (MEM, 8086, "8086"),
        (MEM, 0, "0"),
        (MILLI, 1000, "1000"),
        (I915, 4, "4"),
    ],
    ids=[
        "decimal-suffix",
        "binary-suffix",
        "inexact-bytes",
        "small-bytes",
        "zero",
        "millicores-plain",
        "i915",
    ],
)
def test_amounts_in_reasons_are_readable(resource: str, value: int, text: str) -> None:
    assert format_amount(resource, value) == text


def test_gas_allow_and_deny_values_are_comma_separated_card_names() -> None:
    assert parse_card_names(" card0, ,card1 ") == {"card0", "card1"}
    assert parse_card_names(None) == frozenset()


def test_a_node_without_intel_cards_gets_no_state(gas: Gas) -> None:
    assert gas.build_node(node=make_node("cpu-0", allocatable={MEM: "16G"})) is None


def test_every_intel_resource_is_split_evenly_over_the_cards(gas: Gas) -> None:
    state = gas.build(intel_node(3, i915=8, memory="16G", extra={MILLI: 3000}))
    headroom = gas.headroom(state=state)
    # 8 // 3 = 2 shares of i915 per card; 16G // 3 bytes of memory per card.
    assert headroom.free == {I915: 3, MEM: 3 * (16 * G // 3), MILLI: 3000}
    refused = gas.fit(state=state, pod=gpu_pod(memory=str(16 * G // 3 + 1)))
    assert refused.code is Code.UNRESOLVABLE
    assert refused.message == (
        f"{NO_FIT} ({MEM}: needs 5333333334 (~5.33G) on each of 1 card(s); a card of this node has 5333333333 (~5.33G))"
    )


# ----------------------------------------------------------------------------------------------------------
# The seed example and the reasons a user reads
# ----------------------------------------------------------------------------------------------------------


def test_seed_example_third_5g_pod_does_not_fit_two_8g_cards(gas: Gas) -> None:
    state = gas.build(intel_node(2, i915=8, memory="16G"))
    first = gas.schedule(state, gpu_pod("gas-0", memory="5G"))
    second = gas.schedule(state, gpu_pod("gas-1", memory="5G"))
    assert (cards_of(first), cards_of(second)) == ("card0", "card1")

    third = gas.fit(state=state, pod=gpu_pod("gas-2", memory="5G"))
    assert gas.headroom(state=state).free[MEM] == 6 * G  # enough in total ...
    assert third.code is Code.UNSCHEDULABLE  # ... but not on any one card
    assert third.message == f"{NO_FIT} ({MEM}: needs 5G on each of 1 card(s); the most free on any card is 3G)"
    assert gas.allocate(state=state, pod=gpu_pod("gas-2", memory="5G")) is None


def _fill(gas: Gas, state: DeviceNodeState, pods: Sequence[PodRequest]) -> None:
    for pod in pods:
        gas.schedule(state, pod)


@pytest.mark.parametrize(
    ("node", "earlier", "pod", "code", "reason"),
    [
        (
            intel_node(2),
            [],
            gpu_pod(i915=3),
            Code.UNRESOLVABLE,
            "node has 2 Intel GPU card(s); the container asks for 3",
        ),
        (
            intel_node(2),
            [],
            gpu_pod(memory="10G"),
            Code.UNRESOLVABLE,
            f"{NO_FIT} ({MEM}: needs 10G on each of 1 card(s); a card of this node has 8G)",
        ),
        (
            intel_node(2),
            [],
            make_pod("p", {"main": {I915: 1, MILLI: 100}}),
            Code.UNRESOLVABLE,
            f"{NO_FIT} ({MILLI}: needs 100 on each of 1 card(s); the node has none)",
        ),
        (
            intel_node(2),
            [],
            make_pod("p", {c: {I915: 1, MEM: "5G"} for c in ("a", "b", "c")}),
            Code.UNRESOLVABLE,
            f"{NO_FIT} ({MEM}: needs 5G on each of 1 card(s); the most free on any card is 3G)",
        ),
        (
            intel_node(2, i915=2),
            [gpu_pod("a"), gpu_pod("b")],
            gpu_pod(),
            Code.UNSCHEDULABLE,
            f"{NO_FIT} ({I915}: needs 1 on each of 1 card(s); the most free on any card is 0)",
        ),
        (
            intel_node(2),
            [gpu_pod("a", memory="5G")],
            gpu_pod(i915=2, memory="8G"),
            Code.UNSCHEDULABLE,
            f"{NO_FIT} ({MEM}: needs 4G on each of 2 card(s); only 1 card(s) have that much free)",
        ),
        (
            intel_node(2, i915=4),
            [gpu_pod("a"), gpu_pod("b"), gpu_pod("c", memory="5G")],
            gpu_pod(memory="5G"),
            Code.UNSCHEDULABLE,
            f"{NO_FIT} (needs 1 {I915}, 5G {MEM} on each of 1 card(s); no card has all of it free)",
        ),
    ],
    ids=[
        "more-cards-than-the-node-has",
        "per-card-amount-over-card-capacity",
        "resource-the-node-lacks",
        "own-containers-crowd-each-other-out",
        "i915-shares-used-up",
        "multi-card-partly-blocked",
        "i915-and-memory-free-on-different-cards",
    ],
)
def test_refusals_say_what_is_short_per_card(
    gas: Gas, node: NodeInfo, earlier: list[PodRequest], pod: PodRequest, code: Code, reason: str
) -> None:
    state = gas.build(node)
    _fill(gas, state, earlier)
    status = gas.fit(state=state, pod=pod)
    assert (status.code, status.message, status.plugin) == (code, reason, GAS)
    assert gas.score(state=state, pod=pod) == 0.0


def test_identical_situations_on_different_nodes_read_the_same(gas: Gas) -> None:
    messages = set()
    for name in ("intel-a", "intel-b"):
        node = make_node(name, labels={CARDS: "card0.card1"}, allocatable={I915: 8, MEM: "16G"})
        state = gas.build(node)
        _fill(gas, state, [gpu_pod("a", memory="5G"), gpu_pod("b", memory="5G")])
        messages.add(gas.fit(state=state, pod=gpu_pod("c", memory="5G")).message)
    assert len(messages) == 1
    assert "intel-" not in messages.pop()


# ----------------------------------------------------------------------------------------------------------
# Placements and the annotations GAS writes
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "cards", "shares"),
    [
        ({I915: 1, MEM: "5G"}, ["card0"], {I915: {"card0": 1}, MEM: {"card0": 5 * G}}),
        (
            {I915: 2, MEM: "10G"},
            ["card0", "card1"],
            {I915: {"card0": 1, "card1": 1}, MEM: {"card0": 5 * G, "card1": 5 * G}},
        ),
        (
            {I915: 2, MEM: str(10 * G + 1), MILLI: 300},
            ["card0", "card1"],
            {
                I915: {"card0": 1, "card1": 1},
                MEM: {"card0": 5 * G, "card1": 5 * G},
                MILLI: {"card0": 150, "card1": 150},
            },
        ),
        (
            {I915: 4},
            ["card0", "card1", "card2", "card3"],
            {I915: dict.fromkeys(["card0", "card1", "card2", "card3"], 1)},
        ),
    ],
    ids=["one-card", "two-cards-split-memory", "remainder-dropped-as-in-gas", "i915-only-all-cards"],
)
def test_a_container_gets_distinct_cards_and_an_even_split(
    gas: Gas, request_: dict[str, str | int], cards: list[str], shares: dict[str, dict[str, int]]
) -> None:
    state = gas.build(intel_node(4, memory="32G", extra={MILLI: 4000}))
    allocation = gas.schedule(state, make_pod("p", {"main": request_}))
    assert allocation.containers == {"main": {r: cards for r in shares}}
    assert allocation.shares == {"main": shares}
    assert cards_of(allocation) == ",".join(cards)


@pytest.mark.parametrize(
    ("i915", "annotations", "expected"),
    [
        (4, {}, "card0|card0"),
        (2, {}, "card0|card1"),
        (4, {"gas-allow": "card1"}, "card1|card1"),
    ],
    ids=["binpacked-onto-one-card", "one-i915-share-per-card", "gas-allow-one-card"],
)
def test_containers_of_one_pod_may_share_a_card(
    gas: Gas, i915: int, annotations: dict[str, str], expected: str
) -> None:
    state = gas.build(intel_node(2, i915=i915))
    pod = make_pod("p", {c: {I915: 1, MEM: "3G"} for c in ("a", "b")}, annotations=annotations)
    allocation = gas.schedule(state, pod)
    assert cards_of(allocation) == expected
    card_a, card_b = expected.split("|")
    assert allocation.shares["a"][MEM] == {card_a: 3 * G}
    assert allocation.shares["b"][MEM] == {card_b: 3 * G}


def test_the_fullest_fitting_card_is_chosen_first(gas: Gas) -> None:
    state = gas.build(intel_node(3, memory="24G"))
    _fill(gas, state, [gpu_pod("a", memory="2G", annotations={"gas-allow": "card2"})])
    _fill(gas, state, [gpu_pod("b", memory="6G", annotations={"gas-allow": "card1"})])
    # card1 is fuller than card2 but has 2G left: 3G goes to card2, 1G fills card1.
    assert cards_of(gas.schedule(state, gpu_pod("c", memory="3G"))) == "card2"
    assert cards_of(gas.schedule(state, gpu_pod("d", memory="1G"))) == "card1"


@pytest.mark.parametrize(
    ("annotations", "i915", "expected"),
    [
        ({"gas-allow": "card1"}, 1, "card1"),
        ({"gas-deny": "card0"}, 1, "card1"),
        ({"gas-allow": "card0, card1", "gas-deny": "card0"}, 1, "card1"),
        (
            {"gas-allow": "card7"},
            1,
            "the pod's gas-allow/gas-deny annotations exclude every Intel GPU card of this node",
        ),
        (
            {"gas-allow": "card1"},
            2,
            "the pod's gas-allow/gas-deny annotations leave 1 Intel GPU card(s) on this node; the container asks for 2",
        ),
    ],
    ids=["allow", "deny", "allow-minus-deny", "allow-unknown-card", "allow-too-few"],
)
def test_gas_allow_and_gas_deny_narrow_the_candidates(
    gas: Gas, annotations: dict[str, str], i915: int, expected: str
) -> None:
    state = gas.build(intel_node(2))
    pod = gpu_pod(i915=i915, annotations=annotations)
    status = gas.fit(state=state, pod=pod)
    if expected.startswith("card"):
        assert status.ok
        assert cards_of(gas.schedule(state, pod)) == expected
    else:
        assert (status.code, status.message) == (Code.UNRESOLVABLE, expected)


def test_gas_allow_waits_for_its_card_rather_than_taking_another(gas: Gas) -> None:
    state = gas.build(intel_node(2))
    _fill(gas, state, [gpu_pod("a", memory="8G", annotations={"gas-allow": "card1"})])
    status = gas.fit(state=state, pod=gpu_pod(memory="1G", annotations={"gas-allow": "card1"}))
    assert status.code is Code.UNSCHEDULABLE


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ({"a": {I915: 1}, "sidecar": {}, "c": {I915: 2}}, "card0||card0,card1"),
        ({"init-like": {"cpu": "1"}, "main": {I915: 1}}, "|card0"),
        ({"a": {I915: 2}, "b": {I915: 2}}, "card0,card1|card0,card1"),
    ],
    ids=["middle-container-without-gpu", "first-container-without-gpu", "two-multi-card-containers"],
)
def test_gas_container_cards_lists_containers_in_spec_order(
    gas: Gas, containers: dict[str, dict[str, str | int]], expected: str
) -> None:
    state = gas.build(intel_node(4))
    allocation = gas.schedule(state, make_pod("p", containers))
    assert cards_of(allocation) == expected
    assert set(allocation.containers) == {c for c, r in containers.items() if I915 in r}


def test_gas_ts_is_the_decision_time_in_unix_nanoseconds(gas: Gas) -> None:
    state = gas.build(intel_node(2))
    before = time.time_ns()
    allocation = gas.allocate(state=state, pod=gpu_pod())
    after = time.time_ns()
    assert allocation is not None
    stamp = allocation.annotations["gas-ts"]
    assert stamp.isdigit()
    assert before <= int(stamp) <= after


def test_xe_is_treated_like_i915(gas: Gas) -> None:
    node = make_node("xe-0", labels={NUMBERS: "0.1"}, allocatable={XE: 4, MEM: "16G"})
    state = gas.build(node)
    allocation = gas.schedule(state, make_pod("p", {"main": {XE: 2, MEM: "8G"}}))
    assert allocation.shares == {"main": {XE: {"card0": 1, "card1": 1}, MEM: {"card0": 4 * G, "card1": 4 * G}}}
    assert gas.headroom(state=state).free == {XE: 2, MEM: 8 * G}


def test_a_pod_without_intel_requests_is_left_alone(gas: Gas) -> None:
    state = gas.build(intel_node(2))
    pod = make_pod("cpu-only", {"main": {"cpu": "1"}})
    assert gas.fit(state=state, pod=pod).ok
    allocation = gas.allocate(state=state, pod=pod)
    assert allocation is not None
    assert (allocation.containers, allocation.annotations) == ({}, {})


def test_allocate_leaves_the_state_untouched(gas: Gas) -> None:
    state = gas.build(intel_node(2))
    before = gas.snapshot(state)
    assert gas.allocate(state=state, pod=gpu_pod(memory="5G")) is not None
    assert gas.snapshot(state) == before


def test_score_prefers_filling_cards_already_in_use(gas: Gas) -> None:
    busy, empty = gas.build(intel_node(2)), gas.build(intel_node(2))
    _fill(gas, busy, [gpu_pod("a", memory="4G")])
    pod = gpu_pod("b", memory="2G")
    busy_score, empty_score = gas.score(state=busy, pod=pod), gas.score(state=empty, pod=pod)
    assert 0.0 <= empty_score < busy_score <= 100.0
    assert busy_score == pytest.approx(75.0)  # card0 would hold 6G of 8G


# ----------------------------------------------------------------------------------------------------------
# Health, validation
# ----------------------------------------------------------------------------------------------------------


def test_an_unhealthy_advertised_card_is_never_chosen(gas: Gas) -> None:
    # Allocatable counts only what can be served: one healthy card's 8G and its single i915 share.
    state = gas.build(intel_node(4, i915=1, memory="8G", devices=[("card0", False), ("card1", True)]))
    assert [cell.id for cell in gas.describe(state=state)[0].cells] == ["card0", "card1"]  # inventory wins
    assert gas.headroom(state=state).free == {I915: 1, MEM: 8 * G}
    assert cards_of(gas.schedule(state, gpu_pod("a"))) == "card1"
    assert gas.fit(state=state, pod=gpu_pod("b")).code is Code.UNSCHEDULABLE
    two = gas.fit(state=state, pod=gpu_pod("c", i915=2))
    assert (two.code, two.message) == (
        Code.UNRESOLVABLE,
        "node has 1 healthy Intel GPU card(s); the container asks for 2",
    )
    # A pod placed on card0 before it failed keeps its share when the engine re-takes the node's pods (the kit keeps
    # whole devices alike); card0 is still never chosen.
    before = PluginAllocation(plugin=GAS, containers={"main": {I915: ["card0"]}}, shares={"main": {I915: {"card0": 1}}})
    assert gas.take(state=state, pod_key="default/before-the-failure", allocation=before).ok
    assert gas.release(state=state, pod_key="default/a", allocation=PluginAllocation(
        plugin=GAS, containers={"main": {I915: ["card1"]}}, shares={"main": {I915: {"card1": 1}}}
    )).ok  # fmt: skip
    assert cards_of(gas.schedule(state, gpu_pod("d"))) == "card1"


@pytest.mark.parametrize(
    ("resources", "reason"),
    [
        ({MEM: "5G"}, f"add {I915}: 1"),
        ({I915: 0, MEM: "5G"}, f"add {I915}: 1"),
        ({I915: 1, XE: 1}, "not both"),
        ({I915: 1, MEM: "5G"}, None),
        ({"cpu": "1"}, None),
    ],
    ids=["memory-without-i915", "i915-zero-with-memory", "i915-and-xe", "well-formed", "no-intel-resource"],
)
def test_validate_refuses_requests_gas_cannot_place(
    gas: Gas, resources: dict[str, str | int], reason: str | None
) -> None:
    pod = make_pod("p", {"main": resources})
    status = gas.validate(pod=pod)
    if reason is None:
        assert status is None
    else:
        assert status.code is Code.UNRESOLVABLE and reason in status.message
        assert gas.fit(state=gas.build(intel_node(2)), pod=pod).code is Code.UNRESOLVABLE


@pytest.mark.parametrize(
    ("annotation", "what"),
    [("gas-allocate-xelink", "cards connected by Xe Link"), ("gas-allocate-single-numa", "cards of one NUMA node")],
)
def test_gas_placement_asks_kubegpu_does_not_follow_are_refused_not_ignored(
    gas: Gas, annotation: str, what: str
) -> None:
    """GAS reads these annotations by their presence; kubegpu placed such a pod on any cards, linked or not."""
    pod = make_pod("p", {"main": {I915: 2}}, annotations={annotation: "true"})
    status = gas.validate(pod=pod)
    assert status is not None and (status.code, status.message) == (
        Code.UNRESOLVABLE,
        f"the pod's {annotation} annotation asks GAS for {what}, which kubegpu does not place by: remove the "
        "annotation to take any cards that fit",
    )
    # A pod that asks no Intel card is not this plugin's to refuse.
    assert gas.validate(pod=make_pod("cpu", {"main": {"cpu": "1"}}, annotations={annotation: "true"})) is None


# ----------------------------------------------------------------------------------------------------------
# The ledger: take and release
# ----------------------------------------------------------------------------------------------------------


def _alloc(containers: dict[str, dict[str, dict[str, int]]], plugin: str = GAS) -> PluginAllocation:
    """An allocation from shares alone: container -> resource -> card -> amount."""
    return PluginAllocation(
        plugin=plugin,
        containers={c: {r: list(cards) for r, cards in res.items()} for c, res in containers.items()},
        shares=containers,
    )


@pytest.mark.parametrize(
    ("allocation", "error"),
    [
        (
            _alloc({"main": {I915: {"card0": 1}, MEM: {"card0": 5 * G}}}),
            f"card0 has 3G of {MEM} free; the allocation takes 5G",
        ),
        (
            _alloc({"main": {I915: {"card0": 1, "card1": 1}, MEM: {"card0": 4 * G, "card1": 4 * G}}}),
            f"card0 has 3G of {MEM} free; the allocation takes 4G",
        ),
        (
            _alloc(
                {
                    "a": {I915: {"card0": 1}, MEM: {"card0": 2 * G}},
                    "b": {I915: {"card0": 1}, MEM: {"card0": 2 * G}},
                }
            ),
            f"card0 has 3G of {MEM} free; the allocation takes 4G",
        ),
        (
            PluginAllocation(plugin=GAS, containers={"main": {I915: ["card1"]}}, shares={"main": {I915: {"card0": 1}}}),
            "do not match its shares",
        ),
        (
            PluginAllocation(plugin=GAS, containers={"main": {I915: ["card1"]}}),
            "lists cards for",
        ),
        (_alloc({"main": {"nvidia.com/gpu": {"card1": 1}}}), "nvidia.com/gpu is not an Intel GPU resource"),
        (_alloc({"main": {I915: {"card1": -1}}}), "negative"),
        (_alloc({"main": {I915: {"card1": 1}}}, plugin="nvidia"), "belongs to plugin 'nvidia'"),
    ],
    ids=[
        "over-the-share",
        "second-card-over-after-first-fits",
        "two-containers-together-over",
        "cards-and-shares-disagree",
        "shares-missing",
        "foreign-resource",
        "negative-share",
        "another-plugins-allocation",
    ],
)
def test_take_refuses_a_bad_allocation_and_changes_nothing(gas: Gas, allocation: PluginAllocation, error: str) -> None:
    state = gas.build(intel_node(2))
    _fill(gas, state, [gpu_pod("a", memory="5G")])  # card0: 3G left
    before = gas.snapshot(state)
    status = gas.take(state=state, pod_key="default/bad", allocation=allocation)
    assert status.code is Code.ERROR and status.plugin == GAS
    assert error in status.message
    assert gas.snapshot(state) == before


def test_release_restores_headroom_exactly(gas: Gas) -> None:
    state = gas.build(intel_node(2, extra={MILLI: 2000}))
    empty = gas.snapshot(state)
    first = gas.schedule(state, make_pod("a", {"x": {I915: 2, MEM: "6G", MILLI: 500}, "y": {I915: 1}}))
    after_first = gas.snapshot(state)
    second = gas.schedule(state, gpu_pod("b", memory="4G"))
    assert gas.snapshot(state) != after_first

    assert gas.release(state=state, pod_key="default/b", allocation=second).ok
    assert gas.snapshot(state) == after_first
    assert gas.release(state=state, pod_key="default/a", allocation=first).ok
    assert gas.snapshot(state) == empty

    again = gas.release(state=state, pod_key="default/a", allocation=first)
    assert again.ok, "release is idempotent (Unreserve): a second one changes nothing"
    assert gas.snapshot(state) == empty


def test_a_decoded_allocation_annotation_is_taken_back_after_a_restart(gas: Gas) -> None:
    node = intel_node(2)
    state = gas.build(node)
    pod = make_pod("p", {"a": {I915: 2, MEM: "6G"}, "b": {I915: 1, MEM: "1G"}})
    allocation = gas.schedule(state, pod)
    text = encode_allocation(merge_allocations(node.name, pod.uid, [allocation]))

    record = decode_allocation(text)
    replayed = PluginAllocation(plugin=GAS, containers=record.containers, shares=record.shares)
    rebuilt = gas.build(node)
    assert gas.take(state=rebuilt, pod_key=pod.key, allocation=replayed).ok
    assert gas.snapshot(rebuilt) == gas.snapshot(state)


def test_describe_draws_one_cell_per_card(gas: Gas) -> None:
    state = gas.build(intel_node(3, memory="24G"))
    _fill(gas, state, [gpu_pod("a", memory="6G"), gpu_pod("b", memory="1G")])
    [occupancy] = gas.describe(state=state)
    assert (occupancy.family, occupancy.layout, occupancy.total) == (GAS, "cells", 3)
    assert [(c.id, c.holders, c.used) for c in occupancy.cells] == [
        ("card0", ["default/a", "default/b"], 0.875),
        ("card1", [], 0.0),
        ("card2", [], 0.0),
    ]
    assert (occupancy.free, occupancy.largest_fit) == (2, 3)


# ----------------------------------------------------------------------------------------------------------
# Property: no card is ever over its share
# ----------------------------------------------------------------------------------------------------------

_container = st.one_of(
    st.none(),
    st.tuples(st.integers(1, 3), st.integers(0, 9), st.integers(0, 6)),  # i915, memory in G, millicores / 100
)
_operation = st.one_of(
    st.tuples(st.just("add"), st.lists(_container, min_size=1, max_size=3), st.sampled_from(["", "card0", "card1"])),
    st.tuples(st.just("delete"), st.integers(0, 100), st.just("")),
)


def _pod(name: str, containers: list[tuple[int, int, int] | None], allow: str) -> PodRequest:
    spec: dict[str, dict[str, str | int]] = {}
    for k, shape in enumerate(containers):
        if shape is None:
            spec[f"c{k}"] = {"cpu": "1"}
        else:
            i915, memory, milli = shape
            spec[f"c{k}"] = {
                I915: i915,
                **({MEM: f"{memory}G"} if memory else {}),
                **({MILLI: milli * 100} if milli else {}),
            }
    return make_pod(name, spec, annotations={"gas-allow": allow} if allow else {})


@settings(max_examples=120, deadline=None)
@given(
    cards=st.integers(1, 4),
    shares=st.integers(1, 3),
    memory=st.sampled_from([4, 8]),
    operations=st.lists(_operation, max_size=20),
)
def test_random_workloads_never_put_a_card_over_its_share(
    cards: int, shares: int, memory: int, operations: list[tuple[Any, Any, Any]]
) -> None:
    node = intel_node(cards, i915=cards * shares, memory=f"{cards * memory}G", extra={MILLI: cards * 1000})
    capacity = {I915: shares, MEM: memory * G, MILLI: 1000}
    state = scheduler.plugin.kubegpu_scheduler_build_node(node)
    assert state is not None
    initial = scheduler.plugin.kubegpu_scheduler_headroom(state)
    live: dict[str, PluginAllocation] = {}

    for step, (kind, arg, allow) in enumerate(operations):
        if kind == "delete":
            if live:
                key = sorted(live)[arg % len(live)]
                assert scheduler.plugin.kubegpu_scheduler_release(state, key, live.pop(key)).ok
            continue
        pod = _pod(f"p{step}", arg, allow)
        prepared = scheduler.plugin.kubegpu_scheduler_prepare(pod)
        fit = scheduler.plugin.kubegpu_scheduler_fit(state, pod, prepared)
        allocation = scheduler.plugin.kubegpu_scheduler_allocate(state, pod, prepared)
        assert fit.ok == (allocation is not None)
        if allocation is None:
            _assert_truly_full(pod, live, capacity, cards, fit.code)
            continue
        for container in pod.containers:
            i915 = container.resources.get(I915, 0)
            if i915:
                assert len(set(allocation.containers[container.name][I915])) == i915
        assert scheduler.plugin.kubegpu_scheduler_take(state, pod.key, allocation, pod).ok
        live[pod.key] = allocation

        used = _ledger(live)
        for (_, resource), amount in used.items():
            assert amount <= capacity[resource]
        free = scheduler.plugin.kubegpu_scheduler_headroom(state).free
        assert free[MEM] == cards * capacity[MEM] - sum(a for (_, r), a in used.items() if r == MEM)

    for key, allocation in list(live.items()):
        assert scheduler.plugin.kubegpu_scheduler_release(state, key, allocation).ok
    assert scheduler.plugin.kubegpu_scheduler_headroom(state) == initial


def _ledger(live: Mapping[str, PluginAllocation]) -> dict[tuple[str, str], int]:
    used: dict[tuple[str, str], int] = {}
    for allocation in live.values():
        for by_resource in allocation.shares.values():
            for resource, by_card in by_resource.items():
                for card, amount in by_card.items():
                    used[(card, resource)] = used.get((card, resource), 0) + amount
    return used


def _assert_truly_full(
    pod: PodRequest, live: Mapping[str, PluginAllocation], capacity: Mapping[str, int], cards: int, code: Code
) -> None:
    """A refused one-container pod without gas-allow: fewer than n cards had the per-card amount free."""
    intel = [c for c in pod.containers if c.resources.get(I915)]
    if len(intel) != 1 or pod.annotations:
        return
    [container] = intel
    n = container.resources[I915]
    need = {r: (1 if r == I915 else amount // n) for r, amount in container.resources.items() if r.startswith("gpu.")}
    used = _ledger(live) if code is Code.UNSCHEDULABLE else {}
    fitting = [k for k in range(cards) if all(capacity[r] - used.get((f"card{k}", r), 0) >= x for r, x in need.items())]
    assert len(fitting) < n
