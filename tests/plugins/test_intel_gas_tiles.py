"""Tiles of Intel GPU cards, as a GAS user shares a Data Center GPU Max card: each container asking
`gpu.intel.com/tiles` gets tiles of its own, named in the signed allocation and in GAS's `gas-container-tiles`, and the
node side masks the container to them with Level Zero's `ZE_AFFINITY_MASK`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.annotations import (
    DEVICES_KEY,
    AllocationRecord,
    decode_allocation,
    encode_allocation,
    encode_devices,
    merge_allocations,
)
from kubegpu.core.manifests import pod_request
from kubegpu.core.models import (
    ContainerAllocation,
    ContainerEdit,
    DeviceInfo,
    DeviceInventory,
    NodeDevices,
    NodeInfo,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.core.status import Code
from kubegpu.core.testing import make_node, make_pod, pod_manifest
from kubegpu.plugins.intel_gas import device, scheduler
from kubegpu.plugins.intel_gas.tiles import affinity_mask, gas_tiles_annotation
from kubegpu.scheduler.engine import Engine

from .test_intel_gas import Gas

GAS = "intel-gas"
I915 = "gpu.intel.com/i915"
TILES = "gpu.intel.com/tiles"
NO_FIT = "Not enough GPU-resources for deployment: will not fit"


def max_node(cards: int = 1, *, tiles_per_card: int = 2, shares_per_card: int = 4) -> NodeInfo:
    """A node of Data Center GPU Max cards as NFD labels it: `tiles` and `i915` node totals, cards in `gpu-numbers`."""
    labels = {"gpu.intel.com/gpu-numbers": ".".join(str(i) for i in range(cards))}
    allocatable: dict[str, str | int] = {I915: shares_per_card * cards, TILES: tiles_per_card * cards}
    return make_node("max-0", labels=labels, allocatable=allocatable)


def tile_pod(name: str, tiles: int = 1, i915: int = 1) -> PodRequest:
    return make_pod(name, {"main": {I915: i915, TILES: tiles}})


@pytest.fixture
def gas(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> Gas:
    return Gas(make_plugin_manager("scheduler", **{GAS: scheduler}))


@pytest.fixture
def node_side(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    manager: KubegpuPluginManager = make_plugin_manager("device", **{GAS: device})
    return manager


def tiles_of(allocation: PluginAllocation) -> str:
    return allocation.annotations["gas-container-tiles"]


# ----------------------------------------------------------------------------------------------------------
# Scheduler side: which tiles, booked one by one
# ----------------------------------------------------------------------------------------------------------


def test_two_one_tile_pods_on_one_two_tile_card_get_different_tiles_and_a_third_is_refused_naming_the_card(
    gas: Gas,
) -> None:
    state = gas.build(max_node(1))

    first = gas.schedule(state, tile_pod("a"))
    second = gas.schedule(state, tile_pod("b"))

    assert (tiles_of(first), tiles_of(second)) == ("card0:gt0", "card0:gt1")
    assert first.fields == {"tiles": {"main": {"card0": [0]}}, "tilesPerCard": 2}
    assert second.fields == {"tiles": {"main": {"card0": [1]}}, "tilesPerCard": 2}
    third = gas.fit(state=state, pod=tile_pod("c"))
    assert third.code == Code.UNSCHEDULABLE
    assert third.message == f"{NO_FIT} ({TILES}: needs 1 on each of 1 card(s); card0 has no free tile)"


def test_a_released_tile_is_the_next_pods_and_release_is_idempotent(gas: Gas) -> None:
    state = gas.build(max_node(1))
    first = gas.schedule(state, tile_pod("a"))
    gas.schedule(state, tile_pod("b"))

    assert gas.release(state=state, pod_key="default/a", allocation=first).ok
    assert gas.release(state=state, pod_key="default/a", allocation=first).ok  # Unreserve may run twice

    assert tiles_of(gas.schedule(state, tile_pod("c"))) == "card0:gt0"
    assert gas.fit(state=state, pod=tile_pod("d")).code == Code.UNSCHEDULABLE


def test_a_container_asking_one_card_gets_all_its_tiles_on_that_card(gas: Gas) -> None:
    state = gas.build(max_node(2))
    gas.schedule(state, tile_pod("a"))  # card0:gt0: card0 has one tile left

    both = gas.schedule(state, tile_pod("b", tiles=2))

    assert tiles_of(both) == "card1:gt0+gt1"
    assert both.containers == {"main": {I915: ["card1"], TILES: ["card1"]}}
    assert tiles_of(gas.schedule(state, tile_pod("c"))) == "card0:gt1"


def test_tiles_over_several_cards_are_divided_evenly_as_gas_divides_them(gas: Gas) -> None:
    state = gas.build(max_node(2))

    spread = gas.schedule(state, tile_pod("a", tiles=2, i915=2))

    assert tiles_of(spread) == "card0:gt0,card1:gt0"
    assert spread.fields["tiles"] == {"main": {"card0": [0], "card1": [0]}}


def test_the_annotation_has_one_column_per_container_in_spec_order(gas: Gas) -> None:
    state = gas.build(max_node(1))
    pod = make_pod(
        "p", {"first": {I915: 1, TILES: 1}, "sidecar": {"cpu": "1"}, "whole": {I915: 1}, "last": {I915: 1, TILES: 1}}
    )

    allocation = gas.schedule(state, pod)

    assert allocation.annotations["gas-container-cards"] == "card0||card0|card0"
    assert tiles_of(allocation) == "card0:gt0|||card0:gt1"
    assert allocation.fields["tiles"] == {"first": {"card0": [0]}, "last": {"card0": [1]}}


def test_a_pod_asking_no_tiles_gets_no_tile_annotation_and_no_fields(gas: Gas) -> None:
    state = gas.build(max_node(1))

    allocation = gas.schedule(state, make_pod("p", {"main": {I915: 1}}))

    assert "gas-container-tiles" not in allocation.annotations
    assert allocation.fields == {}


def test_a_whole_card_container_shares_a_card_with_tile_containers_as_gas_lets_it(gas: Gas) -> None:
    """GAS books a container asking no tiles by its `i915` share only: it may land on a card whose tiles others
    hold (and sees the whole card). kubegpu keeps that rule."""
    state = gas.build(max_node(1))
    gas.schedule(state, tile_pod("a"))
    gas.schedule(state, tile_pod("b"))

    whole = gas.schedule(state, make_pod("w", {"main": {I915: 1}}))

    assert whole.annotations["gas-container-cards"] == "card0"


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ([[("card0", (0, 1))], [], [("card1", (1,)), ("card2", (0,))]], "card0:gt0+gt1||card1:gt1,card2:gt0"),
        ([[("card3", (1,))]], "card3:gt1"),
        ([[], [("card0", (0,))]], "|card0:gt0"),
    ],
    ids=["three-containers", "one", "first-without"],
)
def test_the_gas_tiles_annotation_format(shape: list[list[tuple[str, tuple[int, ...]]]], expected: str) -> None:
    assert gas_tiles_annotation(shape) == expected


def record_of(node: NodeInfo, pod: PodRequest, allocation: PluginAllocation) -> PluginAllocation:
    record = decode_allocation(encode_allocation(merge_allocations(node.name, pod.uid, [allocation])))
    return PluginAllocation(
        plugin=GAS, containers=record.containers, shares=record.shares, fields=record.plugins.get(GAS, {})
    )


def test_tiles_read_back_from_the_signed_allocation_are_held_after_a_restart(gas: Gas) -> None:
    node = max_node(1)
    state = gas.build(node)
    a, b = tile_pod("a"), tile_pod("b")
    first, second = gas.schedule(state, a), gas.schedule(state, b)

    rebuilt = gas.build(node)
    assert gas.take(state=rebuilt, pod_key=a.key, allocation=record_of(node, a, first)).ok
    assert gas.release(state=state, pod_key=b.key, allocation=second).ok
    assert tiles_of(gas.schedule(rebuilt, tile_pod("c"))) == "card0:gt1"


def test_an_allocation_naming_a_held_tile_is_refused_naming_its_holder(gas: Gas) -> None:
    node = max_node(1)
    state = gas.build(node)
    a = tile_pod("a")
    first = gas.schedule(state, a)

    copy = record_of(node, a, first)
    refused = gas.take(state=state, pod_key="default/copy", allocation=copy)

    assert not refused.ok
    assert refused.message == "tile gt0 of card0 is already held by default/a"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"tiles": {"main": {"card0": [0, 1]}}}, f"the allocation names 2 tile(s) of card0, but its {TILES} share"),
        ({"tiles": {"main": {"card0": [5]}}}, "card0 has 2 tile(s); the allocation names tile gt5"),
        ({"tiles": {"other": {"card0": [0]}}}, "the allocation gives tiles to container other but lists no cards"),
        ({"tiles": {"main": {"card0": ["0"]}}}, "the tiles of card0 are not numbers from 0 to 63"),
        ({"tiles": {"main": {"card0": [0, 0]}}}, "the allocation names a tile of card0 twice"),
    ],
    ids=["count", "past-the-card", "stray-container", "not-a-number", "twice"],
)
def test_an_allocation_whose_tiles_do_not_add_up_is_refused(gas: Gas, fields: dict[str, Any], reason: str) -> None:
    state = gas.build(max_node(1))
    allocation = PluginAllocation(
        plugin=GAS,
        containers={"main": {I915: ["card0"], TILES: ["card0"]}},
        shares={"main": {I915: {"card0": 1}, TILES: {"card0": 1}}},
        fields=fields,
    )

    status = gas.take(state=state, pod_key="default/p", allocation=allocation)

    assert not status.ok
    assert reason in status.message


def test_an_allocation_signed_before_tiles_were_named_books_their_amount(gas: Gas) -> None:
    state = gas.build(max_node(1))
    legacy = PluginAllocation(
        plugin=GAS,
        containers={"main": {I915: ["card0"], TILES: ["card0"]}},
        shares={"main": {I915: {"card0": 1}, TILES: {"card0": 2}}},
    )

    assert gas.take(state=state, pod_key="default/old", allocation=legacy).ok

    assert gas.fit(state=state, pod=tile_pod("new")).code == Code.UNSCHEDULABLE


# ----------------------------------------------------------------------------------------------------------
# Node side: Level Zero's mask
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cards", "tiles", "per_card", "hierarchy", "mask"),
    [
        (["card0"], {"card0": [1]}, 2, "", "1"),
        (["card1", "card2"], {"card1": [1], "card2": [0]}, 2, "FLAT", "1,2"),
        (["card1", "card2"], {"card1": [1], "card2": [0]}, 2, "COMPOSITE", "0.1,1.0"),
        (["card0"], {"card0": [0, 1]}, 2, "composite", "0.0,0.1"),
        (["card1", "card5"], {"card1": [3], "card5": [1]}, 8, "COMBINED", "3,9"),
        (["card0"], {"card0": [0]}, 1, "", ""),
        (["card0"], {}, 2, "", ""),
        (["card0", "card1"], {"card0": [0], "card1": [0, 1]}, {"card0": 3, "card1": 2}, "", "0,3,4"),
        (["card0", "card1"], {"card0": [0], "card1": [1]}, {"card0": 1, "card1": 3}, "", "0,2"),
        (["card0", "card1"], {"card0": [0], "card1": [1]}, {"card0": 1, "card1": 3}, "COMPOSITE", "0.0,1.1"),
        (["card0", "card1"], {"card0": [0], "card1": [0]}, {"card0": 1, "card1": 1}, "", ""),
    ],
    ids=[
        "flat",
        "flat-two-cards",
        "composite",
        "composite-lowercase",
        "combined-is-flat",
        "one-tile-cards",
        "none",
        "unequal-cards",
        "unequal-cards-few-first",
        "unequal-cards-composite",
        "each-card-one-tile",
    ],
)
def test_the_affinity_mask_numbers_tiles_as_level_zero_does(
    cards: list[str], tiles: Mapping[str, list[int]], per_card: int | Mapping[str, int], hierarchy: str, mask: str
) -> None:
    assert affinity_mask(cards, tiles, per_card, hierarchy) == mask


def edit_for(
    pm: KubegpuPluginManager, tmp_path: Path, cards: list[str], fields: dict[str, Any], envs: dict[str, str]
) -> ContainerEdit:
    (tmp_path / "dri").mkdir(exist_ok=True)
    edit = ContainerEdit(envs=dict(envs))
    edit.remove_owned(pm.call(GAS, "kubegpu_device_owned"))  # what the CRI shim does before the plugin edits
    allocation = ContainerAllocation(
        pod_uid="u", node="n", container="main", resources={I915: cards, TILES: cards}, fields=fields
    )
    pm.call(GAS, "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=tmp_path)
    return edit


def test_a_container_given_a_tile_is_masked_to_it_and_a_tenants_own_mask_is_replaced(
    node_side: KubegpuPluginManager, tmp_path: Path
) -> None:
    fields = {"tiles": {"main": {"card0": [1]}}, "tilesPerCard": 2}

    edit = edit_for(node_side, tmp_path, ["card0"], fields, {"ZE_AFFINITY_MASK": "0,1", "PATH": "/bin"})

    assert edit.envs == {
        "PATH": "/bin",
        "KUBEGPU_INTEL_CARDS": "card0",
        "ZE_AFFINITY_MASK": "1",
        "ZE_FLAT_DEVICE_HIERARCHY": "FLAT",
    }


def test_the_container_s_composite_hierarchy_gets_the_composite_mask(
    node_side: KubegpuPluginManager, tmp_path: Path
) -> None:
    fields = {"tiles": {"main": {"card0": [1], "card1": [0]}}, "tilesPerCard": 2}

    edit = edit_for(node_side, tmp_path, ["card0", "card1"], fields, {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"})

    assert edit.envs["ZE_AFFINITY_MASK"] == "0.1,1.0"


@pytest.mark.parametrize(
    ("envs", "mask", "hierarchy"),
    [({}, "1", "FLAT"), ({"ZE_FLAT_DEVICE_HIERARCHY": "composite"}, "0.1", "COMPOSITE"),
     ({"ZE_FLAT_DEVICE_HIERARCHY": "COMBINED"}, "1", "FLAT")],
    ids=["unset", "composite-lowercase", "combined"],
)  # fmt: skip
def test_the_mask_is_read_in_the_hierarchy_it_was_written_for(
    node_side: KubegpuPluginManager, tmp_path: Path, envs: dict[str, str], mask: str, hierarchy: str
) -> None:
    """The mask for tile 1 of card0 is `1` in FLAT numbering, but in COMPOSITE `1` is a second card and `0` the whole
    of card0, both tiles: an image whose own ENV says `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE` (the CRI config carries
    the spec's env, not the image's; in device-plugin mode the edit sees no env at all), or a spelling Level Zero
    does not read as the plugin did, would read a FLAT mask as cards. The edit sets the hierarchy it wrote the mask
    for, which ranks above the image's ENV."""
    fields = {"tiles": {"main": {"card0": [1]}}, "tilesPerCard": 2}

    edit = edit_for(node_side, tmp_path, ["card0"], fields, envs)

    assert (edit.envs["ZE_AFFINITY_MASK"], edit.envs.get("ZE_FLAT_DEVICE_HIERARCHY")) == (mask, hierarchy)


def test_a_whole_card_container_gets_no_mask_and_loses_its_own(node_side: KubegpuPluginManager, tmp_path: Path) -> None:
    edit = edit_for(node_side, tmp_path, ["card0"], {}, {"ZE_AFFINITY_MASK": "0.1"})

    assert "ZE_AFFINITY_MASK" not in edit.envs
    assert edit.envs["KUBEGPU_INTEL_CARDS"] == "card0"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"tiles": {"main": {"card3": [0]}}, "tilesPerCard": 2}, "gives tiles of card3, which is not one of"),
        ({"tiles": {"main": {"card0": [2]}}, "tilesPerCard": 2}, "gives tile(s) [2] of card0, a card of 2 tile(s)"),
        ({"tiles": {"main": {"card0": [0]}}}, "a card of 0 tile(s)"),
        (
            {"tiles": {"main": {"card0": [1]}}, "tilesPerCard": 2, "cardTiles": {"card0": 1}},
            "gives tile(s) [1] of card0, a card of 1 tile(s)",
        ),
        ({"tiles": {"main": {"card0": [0]}}, "tilesPerCard": 2, "cardTiles": {"card0": 0}}, "cardTiles is not a map"),
    ],
    ids=["not-its-card", "past-the-card", "no-tiles-per-card", "past-its-own-tiles", "card-tiles-unreadable"],
)
def test_tiles_the_allocation_cannot_give_fail_the_edit(
    node_side: KubegpuPluginManager, tmp_path: Path, fields: dict[str, Any], reason: str
) -> None:
    with pytest.raises(PluginHookError) as caught:
        edit_for(node_side, tmp_path, ["card0"], fields, {})

    assert reason in str(caught.value)


def test_the_mask_is_the_plugins_so_the_shim_strips_it_from_containers_without_intel_cards(
    node_side: KubegpuPluginManager,
) -> None:
    edit = ContainerEdit(envs={"ZE_AFFINITY_MASK": "0,1", "PATH": "/bin"})

    removed = edit.remove_owned(node_side.call(GAS, "kubegpu_device_owned"))

    assert removed == ["env ZE_AFFINITY_MASK"]
    assert edit.envs == {"PATH": "/bin"}


def advertised_node(tiles: list[int], healthy: list[bool] | None = None, shares: int = 1) -> NodeInfo:
    """A node as kubegpu's advertiser writes it: its cards in the inventory, each with the tiles it counted in sysfs,
    and node totals over the healthy cards (`shares` containers per card: 1, as the advertiser writes it)."""
    healthy = healthy or [True] * len(tiles)
    devices = [
        DeviceInfo(id=f"card{i}", healthy=ok, attributes={"tiles": n})
        for i, (n, ok) in enumerate(zip(tiles, healthy, strict=True))
    ]
    annotations = {
        DEVICES_KEY: encode_devices(NodeDevices(inventories={GAS: DeviceInventory(plugin=GAS, devices=devices)}))
    }
    serving = [n for n, ok in zip(tiles, healthy, strict=True) if ok]
    allocatable: dict[str, str | int] = {I915: shares * len(serving), TILES: sum(serving)}
    return make_node("max-0", allocatable=allocatable, annotations=annotations)


def test_cards_of_unequal_tiles_are_booked_each_by_its_own_tiles(gas: Gas) -> None:
    """A card of one tile beside a card of three: the node's 4 tiles split evenly gave each card 2, so a pod asking
    2 tiles of one card was given card0's gt0 and a gt1 it does not have (its mask named a tile Level Zero does not
    show: the container ran on one), and a pod asking card1's 3 tiles was refused. The advertiser says each card's
    tiles: each card is booked by its own."""
    state = gas.build(advertised_node([1, 3]))

    three = gas.schedule(state, tile_pod("a", tiles=3))
    one = gas.schedule(state, tile_pod("b", tiles=1))

    assert (tiles_of(three), tiles_of(one)) == ("card1:gt0+gt1+gt2", "card0:gt0")
    state = gas.build(advertised_node([1, 3]))
    assert tiles_of(gas.schedule(state, tile_pod("c", tiles=2))) == "card1:gt0+gt1"
    refused = gas.fit(state=state, pod=tile_pod("d", tiles=2))
    assert refused.code == Code.UNSCHEDULABLE
    assert refused.message.endswith("needs 2 on each of 1 card(s); card0 has 1 free tile, card1 has 1 free tile)")


def test_an_unhealthy_cards_tiles_are_its_own_and_no_one_elses(gas: Gas) -> None:
    """card1 failed: the 6 tiles of the healthy cards split over them gave each 3, card0 a gt2 it does not have and
    card2 one tile short of its 4."""
    state = gas.build(advertised_node([2, 4, 4], healthy=[True, False, True]))
    first = gas.schedule(state, tile_pod("a", tiles=2))
    second = gas.schedule(state, tile_pod("b", tiles=4))
    assert (tiles_of(first), tiles_of(second)) == ("card0:gt0+gt1", "card2:gt0+gt1+gt2+gt3")


def test_a_container_given_tiles_of_cards_of_unequal_tiles_is_masked_to_the_tiles_it_was_given(
    gas: Gas, node_side: KubegpuPluginManager, tmp_path: Path
) -> None:
    """card0 has one tile, card1 three: in Level Zero's FLAT numbering card0's tile is device 0 and card1's are 1 to
    3. The mask written as if every card had the most tiles (`p * 3 + t`) named card1's gt2 for its gt0, a tile the
    scheduler gave another container, which then shared it."""
    state = gas.build(advertised_node([1, 3], shares=2))
    spread = gas.schedule(state, tile_pod("a", tiles=2, i915=2))
    other = gas.schedule(state, tile_pod("b", tiles=2))
    assert (tiles_of(spread), tiles_of(other)) == ("card0:gt0,card1:gt0", "card1:gt1+gt2")
    assert spread.fields == {
        "tiles": {"main": {"card0": [0], "card1": [0]}},
        "tilesPerCard": 3,
        "cardTiles": {"card0": 1, "card1": 3},
    }

    edit = edit_for(node_side, tmp_path, ["card0", "card1"], dict(spread.fields), {})

    assert edit.envs["ZE_AFFINITY_MASK"] == "0,1"


# ----------------------------------------------------------------------------------------------------------
# Classic init containers asking tiles: counted as kube-scheduler counts them, masked on the node
# ----------------------------------------------------------------------------------------------------------


def init_pod(name: str, init_tiles: int, app_tiles: int) -> dict[str, Any]:
    """A pod whose classic init container `prep` asks one card and `init_tiles` tiles, before `main` asks one card and
    `app_tiles` tiles."""
    manifest = pod_manifest(name, {"main": {I915: 1, TILES: app_tiles}})
    prep = {"name": "prep", "resources": {"limits": {I915: "1", TILES: str(init_tiles)}}}
    manifest["spec"]["initContainers"] = [prep]
    return manifest


def masks(node_side: KubegpuPluginManager, tmp_path: Path, record: AllocationRecord) -> dict[str, str | None]:
    """Each container's `ZE_AFFINITY_MASK` as the node side sets it from the signed allocation (None: whole cards)."""
    (tmp_path / "dri").mkdir(exist_ok=True)
    seen: dict[str, str | None] = {}
    for container in ("prep", "main"):
        given = record.given(container)
        allocation = ContainerAllocation(
            pod_uid=record.podUID, node=record.node, container=container,
            resources={r: list(ids) for r, ids in given.items()}, fields=dict(record.plugins.get(GAS, {})),
        )  # fmt: skip
        edit = ContainerEdit()
        node_side.call(GAS, "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=tmp_path)
        seen[container] = edit.envs.get("ZE_AFFINITY_MASK")
    return seen


@pytest.mark.parametrize(
    ("init_tiles", "masked", "other"),
    [(1, {"prep": "0", "main": "0"}, "card0:gt1"), (2, {"prep": "0,1", "main": "0"}, None)],
    ids=["init-asks-as-many-as-the-app", "init-asks-more-than-the-app"],
)
def test_a_classic_init_container_asking_tiles_gets_its_pods_tiles_and_the_pod_holds_the_most_it_needs(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    node_side: KubegpuPluginManager,
    tmp_path: Path,
    init_tiles: int,
    masked: dict[str, str | None],
    other: str | None,
) -> None:
    """An init container asking `gpu.intel.com/tiles` was given its app's card with no mask: the whole card, the
    other tile too, which the scheduler then gave another pod (and kube-scheduler counts the pod's tiles as the more
    of the init container's and the app's). It runs on tiles of its pod's, masked to them; where it asks more than
    the app holds on that card, the pod holds the rest besides, read back the same after a restart."""
    plugins = make_plugin_manager("scheduler", **{GAS: scheduler})
    engine = Engine(plugins, signing_key=b"k" * 32)
    node = max_node(1)
    engine.add_node(node)
    pod = pod_request(init_pod("checked", init_tiles, 1), plugins.qualifiers)[0]

    decision = engine.schedule(pod)

    assert decision.allocation is not None, decision.reason
    assert masks(node_side, tmp_path, decision.allocation) == masked
    neighbour = engine.schedule(tile_pod("neighbour"))
    if other is None:  # the pod holds both tiles (kube-scheduler's node total says so too)
        assert neighbour.allocation is None and TILES in (neighbour.reason or ""), neighbour
    else:
        assert neighbour.annotations.get("gas-container-tiles") == other, neighbour.reason
    # A restarted scheduler reads the signed allocation back to the same books.
    record = decode_allocation(encode_allocation(decision.allocation))
    gas = Gas(plugins)
    rebuilt = gas.build(node)
    shares = {c: record.shares[c] for c in record.containers}  # the engine's part: the init containers' are lent
    plugin_part = PluginAllocation(plugin=GAS, containers=record.containers, shares=shares, fields=record.plugins[GAS])
    assert gas.take(state=rebuilt, pod_key=pod.key, allocation=plugin_part).ok
    if other is None:
        fit = gas.fit(state=rebuilt, pod=tile_pod("neighbour"))
        assert not fit.ok and "card0 has no free tile" in fit.message, fit
    else:
        assert tiles_of(gas.schedule(rebuilt, tile_pod("neighbour"))) == other


@pytest.mark.parametrize("order", [("checked", "plain"), ("plain", "checked")], ids=["init-first", "plain-first"])
def test_pods_alike_but_for_an_init_container_asking_tiles_are_placed_each_with_its_own_init_tiles(
    make_plugin_manager: Callable[..., KubegpuPluginManager], order: tuple[str, str]
) -> None:
    """Two pods alike in their containers and requests, one with an init container asking the tile its app asks: the
    engine prepared them as one, and the plugin's placement memo of a node answered the second pod with the first's,
    so a pod without init containers was signed `initTiles` for one (and, the other way, an init container went
    unmasked)."""
    plugins = make_plugin_manager("scheduler", **{GAS: scheduler})
    engine = Engine(plugins, signing_key=b"k" * 32)
    for name, shares in (("roomy", 4), ("tight", 1)):
        labels = {"gpu.intel.com/gpu-numbers": "0"}
        engine.add_node(make_node(name, labels=labels, allocatable={I915: shares, TILES: 2}))
    manifests = {"checked": init_pod("checked", 1, 1), "plain": pod_manifest("plain", {"main": {I915: 1, TILES: 1}})}
    signed = {}
    for name in order:
        decision = engine.schedule(pod_request(manifests[name], plugins.qualifiers)[0])
        assert decision.allocation is not None, decision.reason
        signed[name] = decision.allocation.plugins[GAS].get("initTiles")
    assert signed == {"checked": {"prep": {"card0": [0]}}, "plain": None}
