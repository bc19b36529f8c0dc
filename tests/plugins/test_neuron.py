"""The Neuron scheduler plugin: catalog, ring and torus rules, cores, least fragmentation, and the ledger."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.kit import TURNED_AWAY_WEIGHT, SizeMix
from kubegpu.core.models import (
    DeviceInfo,
    DeviceInventory,
    NodeDevices,
    NodeInfo,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom
from kubegpu.core.status import Code, Status
from kubegpu.core.testing import assert_allocation, make_node, make_pod
from kubegpu.plugins.neuron import scheduler
from kubegpu.plugins.neuron import topology as topo

DEVICE = "aws.amazon.com/neurondevice"
NEURON = "aws.amazon.com/neuron"
CORE = "aws.amazon.com/neuroncore"
TYPE_LABEL = "node.kubernetes.io/instance-type"


# ------------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------------


class Node:
    """One node's neuron state driven through the plugin manager, as the engine drives it."""

    def __init__(self, pm: KubegpuPluginManager, node: NodeInfo) -> None:
        self.pm = pm
        state = pm.call("neuron", "kubegpu_scheduler_build_node", node=node)
        assert state is not None
        self.state: DeviceNodeState = state
        self.held: dict[str, PluginAllocation] = {}

    def call(self, hook: str, **kwargs: Any) -> Any:
        return self.pm.call("neuron", f"kubegpu_scheduler_{hook}", state=self.state, **kwargs)

    def fit(self, pod: PodRequest) -> Status:
        status: Status = self.call("fit", pod=pod)
        return status

    def headroom(self) -> Headroom:
        headroom: Headroom = self.call("headroom")
        return headroom

    def place(self, pod: PodRequest) -> PluginAllocation:
        """Allocate and take, as the engine's reserve phase does."""
        allocation: PluginAllocation | None = self.call("allocate", pod=pod)
        assert allocation is not None, self.fit(pod).message
        assert self.call("take", pod_key=pod.key, allocation=allocation, pod=pod).ok
        self.held[pod.key] = allocation
        return allocation

    def hold(self, key: str, resource: str, ids: list[str], placed: PodRequest | None = None) -> Status:
        """Take `ids` for `key`; `placed`: the pod being placed, which the plugin learns from (None: a what-if's)."""
        allocation = PluginAllocation(plugin="neuron", containers={"main": {resource: ids}})
        status: Status = self.call("take", pod_key=key, allocation=allocation, pod=placed)
        if status.ok:
            self.held[key] = allocation
        return status

    def release(self, key: str) -> Status:
        status: Status = self.call("release", pod_key=key, allocation=self.held.pop(key))
        return status

    def picture(self) -> Any:
        return self.call("describe")[0]


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    return make_plugin_manager("scheduler", neuron=scheduler)


@pytest.fixture
def node_of(pm: KubegpuPluginManager) -> Callable[..., Node]:
    def factory(instance_type: str | None = None, **kwargs: Any) -> Node:
        labels = {TYPE_LABEL: instance_type} if instance_type else {}
        return Node(pm, make_node(labels=labels, **kwargs))

    return factory


def inventory_node(devices: list[DeviceInfo], topology: dict[str, Any], **attributes: Any) -> NodeInfo:
    inventory = DeviceInventory(plugin="neuron", devices=devices, topology=topology, attributes=attributes)
    annotation = encode_devices(NodeDevices(inventories={"neuron": inventory}))
    return make_node(labels={TYPE_LABEL: "inf2.48xlarge"}, annotations={DEVICES_KEY: annotation})


def pod(amount: int, resource: str = DEVICE, name: str = "p") -> PodRequest:
    return make_pod(name, {"main": {resource: amount}})


def ids(first: int, last: int) -> list[str]:
    return [str(i) for i in range(first, last + 1)]


# ------------------------------------------------------------------------------------------------------------
# Node inventory
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance_type", "devices", "cores", "layout", "columns"),
    [
        ("inf1.xlarge", 1, 4, "ring", 1),
        ("inf1.2xlarge", 1, 4, "ring", 1),
        ("inf1.6xlarge", 4, 4, "ring", 4),
        ("inf1.24xlarge", 16, 4, "ring", 16),
        ("inf2.xlarge", 1, 2, "ring", 1),
        ("inf2.8xlarge", 1, 2, "ring", 1),
        ("inf2.24xlarge", 6, 2, "ring", 6),
        ("inf2.48xlarge", 12, 2, "ring", 12),
        ("trn1.2xlarge", 1, 2, "ring", 1),
        ("trn1.32xlarge", 16, 2, "grid", 4),
        ("trn1n.32xlarge", 16, 2, "grid", 4),
        ("trn2.3xlarge", 1, 4, "ring", 1),
        ("trn2.48xlarge", 16, 4, "grid", 4),
        ("trn2u.48xlarge", 16, 4, "grid", 4),
    ],
    ids=lambda v: str(v),
)
def test_catalog_gives_devices_cores_and_layout(
    node_of: Callable[..., Node], instance_type: str, devices: int, cores: int, layout: str, columns: int
) -> None:
    node = node_of(instance_type)
    picture = node.picture()
    assert (picture.total, picture.layout, picture.columns) == (devices, layout, columns)
    assert node.headroom().free == {NEURON: devices, DEVICE: devices, CORE: devices * cores}
    assert node.call("allocate", pod=pod(1)).fields == {
        "coresPerDevice": cores,
        "instanceType": instance_type,
    }


def test_beta_instance_type_label_is_the_fallback(pm: KubegpuPluginManager) -> None:
    node = Node(pm, make_node(labels={"beta.kubernetes.io/instance-type": "inf2.24xlarge"}))
    assert node.picture().total == 6


@pytest.mark.parametrize(
    ("allocatable", "expected"),
    [
        ({}, None),
        ({"aws.amazon.com/neuron": 3}, (3, 1)),
        ({"aws.amazon.com/neurondevice": 2, CORE: 8}, (2, 4)),
    ],
    ids=["no-neuron-resources", "devices-only", "devices-and-cores"],
)
def test_unknown_instance_type_falls_back_to_allocatable(
    pm: KubegpuPluginManager, allocatable: dict[str, int], expected: tuple[int, int] | None
) -> None:
    node = make_node(labels={TYPE_LABEL: "m5.large"}, allocatable=allocatable)
    state = pm.call("neuron", "kubegpu_scheduler_build_node", node=node)
    if expected is None:
        assert state is None
        return
    devices, cores = expected
    headroom = pm.call("neuron", "kubegpu_scheduler_headroom", state=state)
    assert headroom.free == {NEURON: devices, DEVICE: devices, CORE: devices * cores}
    assert pm.call("neuron", "kubegpu_scheduler_describe", state=state)[0].layout == "ring"


def test_advertised_inventory_wins_and_unhealthy_devices_are_never_allocated(
    pm: KubegpuPluginManager,
) -> None:
    devices = [DeviceInfo(id=str(i), cores=2, healthy=i != 1) for i in range(4)]
    node = Node(pm, inventory_node(devices, {"kind": "ring"}, instanceType="inf2.24xlarge"))
    assert node.picture().total == 4  # the inventory, not the label's 12 devices
    assert node.headroom().free == {NEURON: 2, DEVICE: 2, CORE: 4}
    assert node.fit(pod(3)) == Status.unresolvable("no contiguous set of 3 healthy Neuron devices", plugin="neuron")
    # A running pod that holds the unhealthy device keeps it (restart, inventory change); releasing it does not
    # make the device allocatable.
    assert node.hold("ns/x", DEVICE, ["1"]).ok
    assert node.release("ns/x").ok
    assert node.headroom().free == {NEURON: 2, DEVICE: 2, CORE: 4}
    got = [node.place(pod(1, name=f"one-{i}")).containers["main"][DEVICE] for i in range(3)]
    assert sorted(got) == [["0"], ["2"], ["3"]]
    assert node.fit(pod(1)).code is Code.UNSCHEDULABLE


def test_advertised_torus_inventory_uses_the_torus_rules(pm: KubegpuPluginManager) -> None:
    devices = [DeviceInfo(id=str(i), cores=2, healthy=i not in (0, 9)) for i in range(16)]
    node = Node(pm, inventory_node(devices, {"kind": "torus", "rows": 4, "columns": 4}, instanceType="trn1.32xlarge"))
    assert node.picture().layout == "grid"
    assert_allocation(node.place(pod(4)), {"main": {DEVICE: ids(12, 15)}})  # keeps cores 2-17 in one run
    assert node.fit(pod(8)) == Status.unresolvable(
        "no aligned torus block of 8 healthy Neuron devices", plugin="neuron"
    )


# ------------------------------------------------------------------------------------------------------------
# Torus (trn1.32xlarge, trn1n.32xlarge, trn2.48xlarge)
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("taken", "count", "expected"),
    [
        ([], 4, ids(0, 3)),
        ([ids(0, 3)], 4, ids(4, 7)),
        ([ids(0, 3), ids(4, 7)], 4, ids(8, 11)),
        ([ids(0, 3), ids(4, 7), ids(8, 11)], 4, ids(12, 15)),
        ([ids(8, 11)], 4, ids(12, 15)),  # keeps the 0-7 half free
        ([ids(4, 7)], 4, ids(0, 3)),  # keeps the 8-15 half free
        ([], 8, ids(0, 7)),
        ([ids(0, 3)], 8, ids(8, 15)),
        ([], 16, ids(0, 15)),
        ([], 1, ["0"]),
        ([["0"]], 1, ["1"]),  # packs into the row already broken
        ([ids(0, 3), ["5"]], 1, ["4"]),
    ],
    ids=[
        "4-first-row",
        "4-second-row",
        "4-third-row",
        "4-fourth-row",
        "4-keeps-half",
        "4-keeps-other-half",
        "8-first-half",
        "8-second-half",
        "16-all",
        "1-first",
        "1-packs-row",
        "1-packs-partial-row",
    ],
)
@pytest.mark.parametrize("instance_type", ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge"])
def test_torus_sets(
    node_of: Callable[..., Node], instance_type: str, taken: list[list[str]], count: int, expected: list[str]
) -> None:
    node = node_of(instance_type)
    for i, devices in enumerate(taken):
        assert node.hold(f"ns/taken-{i}", DEVICE, devices).ok
    assert_allocation(node.place(pod(count)), {"main": {DEVICE: expected}})


@pytest.mark.parametrize("count", [2, 3, 5, 6, 7, 9, 12, 15])
@pytest.mark.parametrize("instance_type", ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge"])
@pytest.mark.parametrize("resource", [DEVICE, NEURON])
def test_torus_refuses_other_device_counts_with_the_exact_sentence(
    node_of: Callable[..., Node], instance_type: str, count: int, resource: str
) -> None:
    status = node_of(instance_type).fit(pod(count, resource))
    assert status.code is Code.UNRESOLVABLE
    assert status.reasons == (
        f"Instance type {instance_type} does not support requests for device: {count}. "
        "Please request a different number of devices.",
    )


@pytest.mark.parametrize("resource", [DEVICE, NEURON, CORE])
def test_more_than_the_node_has_is_insufficient(node_of: Callable[..., Node], resource: str) -> None:
    status = node_of("trn1.32xlarge").fit(pod(33 if resource == CORE else 17, resource))
    assert status == Status.unresolvable(f"Insufficient {resource}", plugin="neuron")


def test_torus_blocks_in_use_make_the_pod_wait(node_of: Callable[..., Node]) -> None:
    node = node_of("trn1.32xlarge")
    for row in range(0, 16, 8):
        assert node.hold(f"ns/row-{row}", DEVICE, [str(row)]).ok
    assert node.fit(pod(8)) == Status.unschedulable("no free aligned torus block of 8 Neuron devices", plugin="neuron")
    assert node.fit(pod(4)).ok


# ------------------------------------------------------------------------------------------------------------
# Ring (inf1, inf2)
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (4, ids(3, 6)),  # two windows fit (3-6, 8-11): the lowest ids win the tie
        (2, ids(0, 1)),  # the run that fits exactly
        (1, ["0"]),  # from the short run, keeping both runs of four
        (3, ids(3, 5)),  # from the edge of a run of four, never 4-6
        (5, None),
    ],
    ids=["4-contiguous", "2-best-fit", "1-short-run", "3-edge", "5-nowhere"],
)
def test_ring_windows_under_fragmentation(node_of: Callable[..., Node], count: int, expected: list[str] | None) -> None:
    node = node_of("inf2.48xlarge")
    assert node.hold("ns/two", DEVICE, ["2"]).ok
    assert node.hold("ns/seven", DEVICE, ["7"]).ok
    if expected is None:
        status = node.fit(pod(count))
        assert status == Status.unschedulable(f"no free contiguous set of {count} Neuron devices", plugin="neuron")
    else:
        assert_allocation(node.place(pod(count)), {"main": {DEVICE: expected}})


def test_ring_windows_do_not_wrap_around(node_of: Callable[..., Node]) -> None:
    node = node_of("inf1.6xlarge")
    assert node.hold("ns/middle", DEVICE, ["1", "2"]).ok
    assert node.fit(pod(2)) == Status.unschedulable("no free contiguous set of 2 Neuron devices", plugin="neuron")
    assert node.headroom().free[DEVICE] == 1


# ------------------------------------------------------------------------------------------------------------
# NeuronCores
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance_type", "taken", "count", "expected"),
    [
        ("inf1.6xlarge", [], 9, ids(0, 8)),  # seed 002's log: devices 0, 1, 2
        ("inf1.6xlarge", [(CORE, ["0"])], 2, ids(1, 2)),  # fills the device already in use
        ("inf1.6xlarge", [(DEVICE, ["0"])], 2, ids(4, 5)),
        ("inf1.6xlarge", [(DEVICE, ["0"])], 12, ids(4, 15)),
        (
            "inf1.6xlarge",
            [(CORE, ["5"])],
            2,
            ["6", "7"],
        ),  # next to the held core, keeping devices 0, 2, 3 whole
        ("inf2.48xlarge", [], 24, ids(0, 23)),
        ("trn1.32xlarge", [], 1, ["0"]),
        ("trn1.32xlarge", [(CORE, ["0"])], 1, ["1"]),
        ("trn1.32xlarge", [], 6, ids(1, 6)),  # touches exactly the row 0-3
        ("trn1.32xlarge", [], 8, ids(0, 7)),
        ("trn1.32xlarge", [(DEVICE, ids(0, 3))], 16, ids(16, 31)),
        ("trn1.32xlarge", [], 32, ids(0, 31)),
        ("trn2.48xlarge", [], 4, ids(0, 3)),
    ],
    ids=[
        "seed-9-cores",
        "packs-partial-device",
        "skips-whole-held-device",
        "12-after-whole-device",
        "packs-around-held-core",
        "all-inf2-cores",
        "torus-1",
        "torus-1-packs",
        "torus-6-row",
        "torus-8-row",
        "torus-16-half",
        "torus-all",
        "trn2-one-device",
    ],
)
def test_cores_are_contiguous_and_pack(
    node_of: Callable[..., Node],
    instance_type: str,
    taken: list[tuple[str, list[str]]],
    count: int,
    expected: list[str],
) -> None:
    node = node_of(instance_type)
    for i, (resource, held) in enumerate(taken):
        assert node.hold(f"ns/taken-{i}", resource, held).ok
    assert_allocation(node.place(pod(count, CORE)), {"main": {CORE: expected}})


def test_seed_nine_cores_span_devices_0_1_2(node_of: Callable[..., Node]) -> None:
    node = node_of("inf1.6xlarge")
    allocation = node.place(pod(9, CORE))
    cores = [int(c) for c in allocation.containers["main"][CORE]]
    assert sorted({c // allocation.fields["coresPerDevice"] for c in cores}) == [0, 1, 2]
    assert [cell.used for cell in node.picture().cells] == [1.0, 1.0, 0.25, 0.0]


def test_the_extensions_annotations_name_the_chosen_devices_and_cores(node_of: Callable[..., Node]) -> None:
    """The Neuron scheduler extension writes the ids it chose as the pod annotation `NEURON_DEVS` (whole devices) or
    `NEURON_CORES` (cores), which the stock Neuron device plugin reads at Allocate: kubegpu writes both, so extender
    users who keep that device plugin get the contiguous cores chosen, not the kubelet's pick."""
    node = node_of("inf1.6xlarge")
    assert node.place(pod(9, CORE)).annotations == {"NEURON_CORES": "0,1,2,3,4,5,6,7,8"}
    assert node.place(pod(1)).annotations == {"NEURON_DEVS": "3"}
    mixed = make_pod("mixed", {"a": {DEVICE: 1}, "b": {CORE: 2}}, node_selector={})
    assert node_of("inf2.48xlarge").place(mixed).annotations == {"NEURON_DEVS": "0", "NEURON_CORES": "2,3"}


@pytest.mark.parametrize("count", [3, 4, 5, 9, 13, 17, 29])
def test_torus_refuses_core_counts_that_span_no_valid_device_set(node_of: Callable[..., Node], count: int) -> None:
    status = node_of("trn1.32xlarge").fit(pod(count, CORE))
    assert status == Status.unresolvable(
        f"Instance type trn1.32xlarge does not support requests for core: {count}. "
        "Please request a different number of cores "
        "(1-2, 6-8, 14-16 or 30-32 cores fill a valid set of devices).",
        plugin="neuron",
    )


def test_partly_used_device_is_not_free_whole_and_whole_device_offers_no_cores(
    node_of: Callable[..., Node],
) -> None:
    node = node_of("inf2.48xlarge")
    assert node.hold("ns/core", CORE, ["0"]).ok
    assert node.fit(pod(12)) == Status.unschedulable("Insufficient aws.amazon.com/neurondevice", plugin="neuron")
    assert_allocation(node.place(pod(11, name="eleven")), {"main": {DEVICE: ids(1, 11)}})
    assert node.headroom().free == {NEURON: 0, DEVICE: 0, CORE: 1}
    assert node.hold("ns/other", CORE, ["2"]) == Status.error(
        "core 2 is already held by default/eleven", plugin="neuron"
    )


# ------------------------------------------------------------------------------------------------------------
# Pods, validation, score, headroom, describe
# ------------------------------------------------------------------------------------------------------------


def test_multi_container_pods_get_disjoint_sets_in_order(node_of: Callable[..., Node]) -> None:
    node = node_of("trn1.32xlarge")
    two = make_pod("two", {"a": {DEVICE: 4}, "sidecar": {}, "b": {NEURON: 4}, "c": {CORE: 2}})
    allocation = node.place(two)
    assert_allocation(allocation, {"a": {DEVICE: ids(0, 3)}, "b": {NEURON: ids(4, 7)}, "c": {CORE: ["16", "17"]}})
    assert node.headroom().free[DEVICE] == 4


def test_multi_container_pod_larger_than_the_node_never_fits(node_of: Callable[..., Node]) -> None:
    node = node_of("inf2.48xlarge")
    status = node.fit(make_pod("big", {"a": {DEVICE: 8}, "b": {DEVICE: 8}}))
    assert status == Status.unresolvable("Insufficient aws.amazon.com/neurondevice", plugin="neuron")


@pytest.mark.parametrize(
    ("resources", "reason"),
    [
        (
            {NEURON: 1, DEVICE: 1},
            "container main requests both aws.amazon.com/neuron and aws.amazon.com/neurondevice, "
            "which count the same whole Neuron devices; request only one of them",
        ),
        (
            {DEVICE: 1, CORE: 2},
            "container main requests whole Neuron devices (aws.amazon.com/neurondevice) and NeuronCores "
            "(aws.amazon.com/neuroncore) together; request either whole devices or cores in one container",
        ),
        (
            {NEURON: 2, CORE: 1},
            "container main requests whole Neuron devices (aws.amazon.com/neuron) and NeuronCores "
            "(aws.amazon.com/neuroncore) together; request either whole devices or cores in one container",
        ),
    ],
    ids=["neuron-and-neurondevice", "devices-and-cores", "neuron-and-cores"],
)
def test_validate_refuses_mixed_requests(
    pm: KubegpuPluginManager, node_of: Callable[..., Node], resources: dict[str, int], reason: str
) -> None:
    mixed = make_pod("mixed", {"main": resources})
    expected = Status.unresolvable(reason, plugin="neuron")
    assert pm.call("neuron", "kubegpu_scheduler_validate", pod=mixed) == expected
    assert node_of("trn1.32xlarge").fit(mixed) == expected


def test_validate_accepts_well_formed_requests(pm: KubegpuPluginManager) -> None:
    good = make_pod("good", {"a": {DEVICE: 1}, "b": {CORE: 3}, "c": {"cpu": "1"}})
    assert pm.call("neuron", "kubegpu_scheduler_validate", pod=good) is None


@pytest.mark.parametrize(
    ("instance_type", "taken", "asked", "expected"),
    [
        ("trn1.32xlarge", [], pod(16), 100.0),
        ("trn1.32xlarge", [], pod(1), 6.25),
        ("trn1.32xlarge", [ids(0, 11)], pod(4), 100.0),
        ("trn1.32xlarge", [ids(0, 7)], pod(4), 50.0),
        ("inf2.48xlarge", [["2"], ["7"]], pod(2), 100.0),
        ("inf1.6xlarge", [], pod(9, CORE), 56.25),
    ],
    ids=["all", "one-of-sixteen", "exact-row", "row-of-half", "exact-ring-gap", "cores"],
)
def test_score_rewards_consuming_free_sets_exactly(
    node_of: Callable[..., Node],
    instance_type: str,
    taken: list[list[str]],
    asked: PodRequest,
    expected: float,
) -> None:
    node = node_of(instance_type)
    for i, devices in enumerate(taken):
        assert node.hold(f"ns/taken-{i}", DEVICE, devices).ok
    cast(Any, node.state).mix = SizeMix()  # the topology score alone: forget the sizes the holds taught the node
    assert node.call("score", pod=asked) == pytest.approx(expected)


def test_a_placement_that_turns_away_a_learned_size_scores_less(pm: KubegpuPluginManager) -> None:
    """Half of a free 8-block for a 4-device pod scores 50 by topology; once the node has seen 8-device pods come,
    the placement turns that size away from the node and scores 0 (50 x (1 - 5 x 1))."""
    node = Node(pm, make_node(labels={TYPE_LABEL: "trn1.32xlarge"}))
    assert node.hold("ns/eight", DEVICE, ids(0, 7), placed=pod(8)).ok  # an 8-device pod: the mix is all 8s
    assert node.call("score", pod=pod(4)) == 0.0
    assert node.call("fragmentation", pod=pod(4), free={}) == pytest.approx(1.0 * TURNED_AWAY_WEIGHT * 8)


def test_headroom_and_describe_follow_takes(node_of: Callable[..., Node]) -> None:
    node = node_of("trn1.32xlarge")
    assert node.hold("ns/core", CORE, ["0"]).ok
    assert node.hold("ns/row", DEVICE, ids(8, 11)).ok
    headroom = node.headroom()
    assert headroom.free == {NEURON: 4, DEVICE: 4, CORE: 15}  # cores 1-15 touch exactly devices 0-7
    assert headroom.utilization == pytest.approx(9 / 32)
    picture = node.picture()
    assert (picture.free, picture.largest_fit) == (11, 4)
    assert picture.cells[0].holders == ["ns/core"] and picture.cells[0].used == 0.5
    assert picture.cells[9].holders == ["ns/row"] and picture.cells[9].used == 1.0


# ------------------------------------------------------------------------------------------------------------
# The ledger: take and release
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "devices", "reason"),
    [
        (DEVICE, ["4", "5"], "device 4 is already held by ns/first"),
        (DEVICE, ["0", "1"], "device 1 is already held by ns/cores"),
        (DEVICE, ["16"], "device 16 does not exist on this node"),
        (DEVICE, ["x"], "device id 'x' is not a Neuron device number"),
        (DEVICE, ["9", "9"], "device 9 is listed twice in the allocation"),
        (CORE, ["9"], "core 9 is already held by ns/first"),
        (CORE, ["2"], "core 2 is already held by ns/cores"),
        (CORE, ["32"], "core 32 does not exist on this node"),
        ("nvidia.com/gpu", ["0"], "resource nvidia.com/gpu is not a Neuron resource"),
    ],
    ids=[
        "device-held",
        "device-with-held-cores",
        "unknown-device",
        "garbage-id",
        "duplicate",
        "core-of-held-device",
        "core-held",
        "unknown-core",
        "foreign-resource",
    ],
)
def test_take_refuses_and_changes_nothing(
    node_of: Callable[..., Node], resource: str, devices: list[str], reason: str
) -> None:
    node = node_of("trn1.32xlarge")
    assert node.hold("ns/first", DEVICE, ids(4, 7)).ok
    assert node.hold("ns/cores", CORE, ["2"]).ok
    before = (node.headroom(), node.picture())
    assert node.hold("ns/second", resource, devices) == Status.error(reason, plugin="neuron")
    assert (node.headroom(), node.picture()) == before


def test_take_refuses_a_core_on_a_device_taken_whole_by_the_same_allocation(
    node_of: Callable[..., Node],
) -> None:
    node = node_of("inf2.48xlarge")
    allocation = PluginAllocation(plugin="neuron", containers={"a": {DEVICE: ["0"]}, "b": {CORE: ["1"]}})
    status = node.call("take", pod_key="ns/x", allocation=allocation)
    assert status == Status.error("core 1 is on device 0, which the same allocation takes whole", plugin="neuron")
    assert node.headroom().free[DEVICE] == 12


def test_release_restores_headroom_exactly(node_of: Callable[..., Node]) -> None:
    node = node_of("inf1.24xlarge")
    fresh = (node.headroom(), node.picture())
    node.place(pod(3, name="devices"))
    node.place(pod(5, CORE, name="cores"))
    node.place(pod(1, CORE, name="core"))
    assert node.headroom() != fresh[0]
    for key in ["default/cores", "default/devices", "default/core"]:
        assert node.release(key).ok
    assert (node.headroom(), node.picture()) == fresh


def test_release_leaves_alone_what_the_pod_does_not_hold(node_of: Callable[..., Node]) -> None:
    node = node_of("inf2.48xlarge")
    assert node.hold("ns/a", DEVICE, ["0"]).ok
    stranger = PluginAllocation(plugin="neuron", containers={"main": {DEVICE: ["0"]}})
    assert node.call("release", pod_key="ns/b", allocation=stranger).ok  # idempotent, as Unreserve
    assert node.headroom().free[DEVICE] == 11


# ------------------------------------------------------------------------------------------------------------
# Pure helpers
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mask", "expected"),
    [(0, []), (0b1, [(0, 1)]), (0b0110_1110, [(1, 3), (5, 2)]), ((1 << 64) - 1, [(0, 64)])],
    ids=["empty", "one", "two-runs", "wide"],
)
def test_runs(mask: int, expected: list[tuple[int, int]]) -> None:
    assert topo.runs(mask) == expected
    for start, length in expected:
        assert all(topo.run_around(mask, p) == length for p in range(start, start + length))


def test_torus_valid_sets_are_the_rows_halves_and_whole() -> None:
    torus = topo.make_topology("torus", 16, 4, 4)
    assert topo.valid_sizes(torus) == (1, 4, 8, 16)
    assert [topo.bit_ids(m) for m in topo.valid_sets(torus, 4)] == [
        list(range(0, 4)),
        list(range(4, 8)),
        list(range(8, 12)),
        list(range(12, 16)),
    ]
    assert [topo.bit_ids(m) for m in topo.valid_sets(torus, 8)] == [list(range(0, 8)), list(range(8, 16))]
    assert topo.valid_sets(torus, 7) == ()
    assert topo.make_topology("torus", 12, 4, 4).kind == "ring"


# The documented choice rule by brute force: score every valid free candidate, best key, lowest ids.
def _brute_devices(t: topo.Topology, k: int, free: int, free_cores: int, count: int) -> int | None:
    best: tuple[Any, int] | None = None
    for start in topo.valid_starts(t, count):
        chosen = topo.interval(start, count)
        if free & chosen != chosen:
            continue
        key = (
            topo.device_key(t, free & ~chosen),
            topo.core_key(free_cores & ~topo.interval(start * k, count * k)),
        )
        if best is None or key > best[0]:
            best = (key, chosen)
    return None if best is None else best[1]


def _brute_cores(t: topo.Topology, k: int, free: int, free_cores: int, count: int) -> int | None:
    best: tuple[Any, int] | None = None
    valid = {b for size in topo.valid_sizes(t) for b in topo.valid_sets(t, size)}
    for start in range(t.devices * k - count + 1):
        chosen = topo.interval(start, count)
        touched = topo.devices_of_cores(chosen, k)
        if free_cores & chosen != chosen or touched not in valid:
            continue
        key = (topo.device_key(t, free & ~touched), topo.core_key(free_cores & ~chosen))
        if best is None or key > best[0]:
            best = (key, chosen)
    return None if best is None else best[1]


SHAPES = [
    (topo.make_topology("torus", 16, 4, 4), 2),
    (topo.make_topology("torus", 16, 4, 4), 4),
    (topo.make_topology("ring", 12), 2),
    (topo.make_topology("ring", 6), 4),
    (topo.make_topology("ring", 16), 4),
]


@settings(max_examples=150, deadline=None)
@given(shape=st.sampled_from(SHAPES), data=st.data())
def test_choosers_match_the_documented_rule(shape: tuple[topo.Topology, int], data: st.DataObject) -> None:
    t, k = shape
    free, free_cores = 0, 0
    for device in range(t.devices):
        kind = data.draw(st.sampled_from(["free", "whole", "partial"]))
        if kind == "free":
            free |= 1 << device
            free_cores |= topo.interval(device * k, k)
        elif kind == "partial":
            free_cores |= data.draw(st.integers(0, (1 << k) - 2)) << (device * k)
    count = data.draw(st.integers(1, t.devices))
    if count in topo.valid_sizes(t):
        assert topo.choose_devices(t, k, free, free_cores, count) == _brute_devices(t, k, free, free_cores, count)
    cores = data.draw(st.integers(1, t.devices * k))
    assert topo.choose_cores(t, k, free, free_cores, cores) == _brute_cores(t, k, free, free_cores, cores)
    largest = max((m for m in range(1, t.devices * k + 1) if _brute_cores(t, k, free, free_cores, m)), default=0)
    assert topo.largest_core_request(t, k, free_cores) == largest


# ------------------------------------------------------------------------------------------------------------
# Property: the ledger never hands out a held device, and every allocation is a valid set
# ------------------------------------------------------------------------------------------------------------

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.sampled_from([DEVICE, NEURON, CORE]), st.integers(1, 16)),
        st.tuples(st.just("release"), st.just(""), st.integers(0, 40)),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(instance_type=st.sampled_from(["trn1.32xlarge", "inf2.48xlarge"]), operations=OPERATIONS)
def test_random_workloads_keep_the_ledger_consistent(
    pm: KubegpuPluginManager, instance_type: str, operations: list[tuple[str, str, int]]
) -> None:
    node = Node(pm, make_node(labels={TYPE_LABEL: instance_type}))
    fresh = node.headroom()
    t = node.state.topology  # type: ignore[attr-defined]
    k = node.state.cores_per_device  # type: ignore[attr-defined]
    valid = {b for size in topo.valid_sizes(t) for b in topo.valid_sets(t, size)}
    held_devices: dict[int, str] = {}
    held_cores: dict[int, str] = {}
    for n, (op, resource, amount) in enumerate(operations):
        if op == "release":
            if node.held:
                key = sorted(node.held)[amount % len(node.held)]
                assert node.release(key).ok
                held_devices = {d: h for d, h in held_devices.items() if h != key}
                held_cores = {c: h for c, h in held_cores.items() if h != key}
            continue
        request = pod(amount, resource, name=f"p{n}")
        allocation = node.call("allocate", pod=request)
        if allocation is None:
            assert not node.fit(request).ok
            continue
        got = [int(i) for i in allocation.containers["main"][resource]]
        mask = sum(1 << i for i in got)
        assert len(got) == amount
        if resource == CORE:
            assert mask == topo.interval(min(got), amount)
            assert topo.devices_of_cores(mask, k) in valid
            assert not {c // k for c in got} & held_devices.keys()
            assert not set(got) & held_cores.keys()
        else:
            assert mask in valid
            assert not set(got) & held_devices.keys()
            assert not set(got) & {c // k for c in held_cores}
        assert node.call("take", pod_key=request.key, allocation=allocation).ok
        node.held[request.key] = allocation
        target = held_cores if resource == CORE else held_devices
        target.update(dict.fromkeys(got, request.key))
    for key in list(node.held):
        assert node.release(key).ok
    assert node.headroom() == fresh


NEURON_NODE_KINDS = [("trn1.32xlarge", 16), ("inf2.48xlarge", 12), ("inf2.24xlarge", 6)]  # (type, devices)
NEURON_ASKS = [(DEVICE, 1), (DEVICE, 1), (DEVICE, 2), (DEVICE, 4), (CORE, 1), (CORE, 2), (DEVICE, 8)]


def neuron_placements(arrivals: list[tuple[int, int]], percentage: int) -> list[str | None]:
    """Where an engine of 12 Neuron nodes (three kinds) places the pods `arrivals` names (an ask of NEURON_ASKS; a
    second number, when below 3, deletes an earlier pod first)."""
    from kubegpu.core.manifests import node_info, pod_request
    from kubegpu.core.plugin_manager import make_plugin_manager
    from kubegpu.core.testing import node_manifest
    from kubegpu.scheduler import scores
    from kubegpu.scheduler.engine import Engine

    profile = dataclasses.replace(scores.Profile.default("binpack"), percentage_of_nodes_to_score=percentage)
    engine = Engine(make_plugin_manager("scheduler", plugins=[("neuron", scheduler)], autoload=False), scoring=profile)
    for i in range(12):
        kind, devices = NEURON_NODE_KINDS[i % len(NEURON_NODE_KINDS)]
        labels = {"node.kubernetes.io/instance-type": kind}
        allocatable = {DEVICE: devices, CORE: 2 * devices}
        engine.add_node(
            node_info(node_manifest(f"n{i}", labels=labels, allocatable=allocatable, memory="64Gi", cpu="64"))
        )
    placed: list[str | None] = []
    for n, (ask, leave) in enumerate(arrivals):
        if leave < 3 and placed:
            engine.release(f"bench/p{(n * 7 + leave) % len(placed)}")
        resource, amount = NEURON_ASKS[ask]
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p{n}", "namespace": "bench"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {resource: str(amount)}}}]},
        }
        placed.append(engine.schedule(pod_request(manifest)[0]).node)
    return placed


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    arrivals=st.lists(st.tuples(st.integers(0, len(NEURON_ASKS) - 1), st.integers(0, 9)), min_size=1, max_size=60),
    percentage=st.sampled_from([100, 0]),
)
def test_nodes_alike_in_scoring_content_score_alike(
    arrivals: list[tuple[int, int]], percentage: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The oracle of `NeuronNodeState.scoring_content`: the engine's scores shared by nodes alike in it
    # (`LocalRaws.by_number`) place every pod where scoring each node alone does, deletions and a moving mix included.
    from kubegpu.scheduler.engine.scoring import Scoring

    fast = neuron_placements(arrivals, percentage)
    with monkeypatch.context() as patched:
        patched.setattr(Scoring, "scoring_content", lambda self, record: None)
        slow = neuron_placements(arrivals, percentage)
    assert fast == slow


def test_scoring_content_covers_what_the_scores_read() -> None:
    # Two states alike in `scoring_content` give the same score and fragmentation for every ask; one free device
    # or one mix publication apart, the content differs.
    shape = topo.make_topology("torus", 16, 4, 4)
    mix = SizeMix()
    a = scheduler.NeuronNodeState("a", shape, 2, "trn1.32xlarge", (1 << 16) - 1, (1 << 16) - 1, mix)
    b = scheduler.NeuronNodeState("b", shape, 2, "other", (1 << 16) - 1, (1 << 16) - 1, mix)
    mix.add(2)
    assert a.scoring_content() == b.scoring_content()
    for resource, amount in NEURON_ASKS:
        asked = scheduler.neuron_requests(pod(amount, resource))
        for hook in (scheduler.plugin.kubegpu_scheduler_score, scheduler.plugin.kubegpu_scheduler_fragmentation):
            kwargs: dict[str, Any] = {"free": {}} if hook == scheduler.plugin.kubegpu_scheduler_fragmentation else {}
            assert hook(a, pod(amount, resource), asked, **kwargs) == hook(b, pod(amount, resource), asked, **kwargs)
    b.free_devices &= ~1
    assert a.scoring_content() != b.scoring_content()
    before = a.scoring_content()
    mix.add(8)
    assert a.scoring_content() != before
