"""The nvidia scheduler plugin: GFD labels and advertised inventories, cube-mesh and NVSwitch sets, model and
memory selection, and a ledger that never hands out a held GPU."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.models import (
    DeviceInfo,
    DeviceInventory,
    NodeDevices,
    NodeInfo,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.plugin_manager import make_plugin_manager as build_plugin_manager
from kubegpu.core.status import Code, Status
from kubegpu.core.testing import assert_allocation, make_node, make_pod
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia.topology import (
    CUBE_MESH,
    FLAT,
    GROUPS,
    NVSWITCH,
    TopologyError,
    build_tree,
    choose,
    normalize_model,
    tree_from_inventory,
)

GPU = "nvidia.com/gpu"
V100 = "Tesla-V100-SXM2-16GB"
A100 = "NVIDIA-A100-SXM4-40GB"
GIB = 1024**3


def gfd_node(
    instance: str | None = "p3.16xlarge",
    *,
    count: int = 8,
    product: str = V100,
    memory_mib: int | None = 16160,
    name: str = "gpu-0",
) -> NodeInfo:
    """A node as GPU Feature Discovery and the device plugin label it."""
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count)}
    if memory_mib is not None:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    if instance:
        labels["node.kubernetes.io/instance-type"] = instance
    return make_node(name, labels=labels, allocatable={GPU: count})


def advertised_node(
    devices: list[DeviceInfo],
    topology: Mapping[str, Any] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
) -> NodeInfo:
    """A node whose advertiser published an nvidia inventory in `kubegpu.io/devices`."""
    inventory = DeviceInventory(plugin="nvidia", devices=devices, topology=dict(topology or {}))
    annotation = encode_devices(NodeDevices(inventories={"nvidia": inventory}))
    return make_node(
        "gpu-adv",
        labels=dict(labels or {}),
        annotations={DEVICES_KEY: annotation},
        allocatable={GPU: len(devices)},
    )


def gpus(n: int, model: str = A100, memory: int = 40 * GIB, unhealthy: tuple[int, ...] = ()) -> list[DeviceInfo]:
    return [DeviceInfo(id=str(i), model=model, memory=memory, healthy=i not in unhealthy) for i in range(n)]


def gpu_pod(*counts: int, annotations: Mapping[str, str] | None = None, name: str = "job") -> PodRequest:
    containers = {f"c{i}": {GPU: n} for i, n in enumerate(counts)}
    return make_pod(name, containers, annotations=dict(annotations or {}))


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    return make_plugin_manager("scheduler", nvidia=nvidia)


def build(pm: KubegpuPluginManager, node: NodeInfo) -> nvidia.NvidiaNodeState:
    state = pm.call("nvidia", "kubegpu_scheduler_build_node", node=node)
    assert isinstance(state, nvidia.NvidiaNodeState)
    return state


def hold(pm: KubegpuPluginManager, state: nvidia.NvidiaNodeState, ids: list[int], key: str = "ns/held") -> None:
    allocation = PluginAllocation(plugin="nvidia", containers={"main": {GPU: [str(i) for i in ids]}})
    assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=key, allocation=allocation).ok


def ids_of(allocation: PluginAllocation | None) -> list[list[int]]:
    assert allocation is not None
    return [sorted(int(i) for i in res[GPU]) for res in allocation.containers.values()]


def snapshot(state: nvidia.NvidiaNodeState) -> tuple[int, list[str | None]]:
    return state.free, list(state.holders)


# ----------------------------------------------------------------------------------------------------------
# Registration and node inventory
# ----------------------------------------------------------------------------------------------------------


def test_plugin_owns_nvidia_gpus(pm: KubegpuPluginManager) -> None:
    assert pm.owner_of(GPU) == "nvidia"
    assert pm.owner_of("nvidia.com/mig-1g.5gb") == "nvidia"  # the profiles of the placement tables
    assert pm.owner_of("nvidia.com/mig-1g.18gb") == "nvidia"  # an H200's
    assert pm.owner_of("nvidia.com/mig-1g.23gb") is None  # a B200's: no table, left to kube-scheduler's counting


@pytest.mark.parametrize(
    ("labels", "allocatable", "expected"),
    [
        (
            {"nvidia.com/gpu.product": V100, "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "16160"},
            {GPU: 8},
            (8, V100, 16160 * 1024 * 1024),
        ),
        ({"nvidia.com/gpu.product": " Tesla-T4 "}, {GPU: 2}, (2, "Tesla-T4", None)),
        ({"nvidia.com/gpu.count": "8"}, {GPU: 6}, (6, None, None)),
        ({"nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "lots"}, {}, (4, None, None)),
        ({"nvidia.com/gpu.count": "x"}, {GPU: 1}, (1, None, None)),
        ({}, {"cpu": 4000}, None),
        ({"nvidia.com/gpu.count": "0"}, {}, None),
        (
            {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.product": "Tesla-T4-SHARED"},
            {GPU: 8},
            (2, "Tesla-T4-SHARED", None),
        ),
    ],
    ids=[
        "all-gfd-labels",
        "count-from-allocatable",
        "allocatable-caps-label-count",
        "malformed-memory-ignored",
        "malformed-count-falls-back",
        "cpu-node",
        "zero-gpus",
        "time-sliced-gpus-counted-once",
    ],
)
def test_gfd_labels(
    labels: dict[str, str], allocatable: dict[str, int], expected: tuple[int, str | None, int | None] | None
) -> None:
    found = nvidia.gpus_from_labels(labels, allocatable)
    assert (None if found is None else (found.count, found.model, found.memory)) == expected


def test_node_without_gpus_has_no_state(pm: KubegpuPluginManager) -> None:
    assert pm.call("nvidia", "kubegpu_scheduler_build_node", node=make_node("cpu")) is None
    assert pm.call("nvidia", "kubegpu_scheduler_build_node", node=advertised_node([])) is None


@pytest.mark.parametrize(
    ("instance", "count", "kind"),
    [
        ("p3.16xlarge", 8, CUBE_MESH),
        ("p3dn.24xlarge", 8, CUBE_MESH),
        ("p3.8xlarge", 4, CUBE_MESH),
        ("p4d.24xlarge", 8, NVSWITCH),
        ("p5.48xlarge", 8, NVSWITCH),
        ("g9.unknown", 8, FLAT),
        (None, 8, FLAT),
        ("p3.16xlarge", 6, FLAT),
    ],
    ids=[
        "p3.16xlarge",
        "p3dn",
        "p3.8xlarge",
        "p4d",
        "p5",
        "unknown-type",
        "no-type",
        "count-mismatch-is-flat",
    ],
)
def test_catalog_topology(pm: KubegpuPluginManager, instance: str | None, count: int, kind: str) -> None:
    assert build(pm, gfd_node(instance, count=count)).tree.kind == kind


def test_catalog_supplies_model_when_gfd_is_absent(pm: KubegpuPluginManager) -> None:
    node = make_node("p4d", labels={"node.kubernetes.io/instance-type": "p4d.24xlarge"}, allocatable={GPU: 8})
    state = build(pm, node)
    pod = gpu_pod(8, annotations={"nvidia-gpu-scheduler/gpu.model": "nvidia-a100-sxm4-40gb"})
    assert pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=pod).ok


def test_advertised_inventory_wins_and_unhealthy_gpu_is_skipped(pm: KubegpuPluginManager) -> None:
    labels = {
        "nvidia.com/gpu.product": V100,
        "nvidia.com/gpu.count": "8",
        "node.kubernetes.io/instance-type": "x",
    }
    state = build(pm, advertised_node(gpus(4, unhealthy=(0,)), {"kind": "nvswitch"}, labels=labels))
    assert state.ids == ("0", "1", "2", "3")
    headroom = pm.call("nvidia", "kubegpu_scheduler_headroom", state=state)
    assert headroom.free[GPU] == 3

    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=gpu_pod(3))
    assert_allocation(allocation, {"c0": {GPU: ["1", "2", "3"]}})
    assert allocation.fields == {"model": A100}
    four = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=gpu_pod(4))
    assert four == Status.unresolvable("Insufficient nvidia.com/gpu", plugin="nvidia")
    v100 = pm.call(
        "nvidia",
        "kubegpu_scheduler_fit",
        state=state,
        pod=gpu_pod(1, annotations={"nvidia-gpu-scheduler/gpu.model": V100}),
    )
    assert v100.code is Code.UNRESOLVABLE


@pytest.mark.parametrize(
    ("topology", "labels", "kind", "request_", "expected"),
    [
        ({"groups": [["0", "2"], ["1", "3"]]}, {}, GROUPS, 2, [0, 2]),
        ({"groups": [[0, 3], [1, 2]]}, {}, GROUPS, 2, [0, 3]),
        ({"kind": "cube-mesh"}, {}, CUBE_MESH, 2, [0, 1]),
        ({"kind": "nvswitch"}, {}, NVSWITCH, 2, [0, 1]),
        ({}, {"node.kubernetes.io/instance-type": "p3.8xlarge"}, CUBE_MESH, 2, [0, 1]),
        ({"groups": [["0", "9"]]}, {}, FLAT, 2, [0, 1]),
        ({"kind": "torus"}, {}, FLAT, 2, [0, 1]),
    ],
    ids=[
        "groups-of-string-ids",
        "groups-of-int-ids",
        "cube-mesh-kind",
        "nvswitch-kind",
        "no-topology-uses-catalog",
        "unknown-gpu-is-flat",
        "unknown-kind-is-flat",
    ],
)
def test_inventory_topology(
    pm: KubegpuPluginManager,
    topology: dict[str, Any],
    labels: dict[str, str],
    kind: str,
    request_: int,
    expected: list[int],
) -> None:
    state = build(pm, advertised_node(gpus(4), topology, labels=labels))
    assert state.tree.kind == kind
    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=gpu_pod(request_))
    assert ids_of(allocation) == [expected]


# ----------------------------------------------------------------------------------------------------------
# Topology: cube-mesh, NVSwitch, flat
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("held", "request_", "expected", "score"),
    [
        ([], 4, [0, 1, 2, 3], 100.0),
        ([0, 1, 2, 3], 4, [4, 5, 6, 7], 100.0),
        ([1], 4, [4, 5, 6, 7], 100.0),
        ([], 2, [0, 1], 100.0),
        ([1], 2, [2, 3], 100.0),
        ([4], 2, [6, 7], 100.0),
        ([0], 1, [1], 100.0),
        ([1, 3], 2, [4, 5], 100.0),
        ([1, 2, 5, 6], 2, [0, 3], 50.0),
        ([0, 1, 2, 4, 5, 6], 2, [3, 7], 25.0),
        ([], 3, [0, 1, 2], 100.0),
        ([0, 4], 4, [1, 2, 3, 5], 50.0),
        ([1], 5, [0, 4, 5, 6, 7], 100.0),
        ([], 8, list(range(8)), 100.0),
    ],
    ids=[
        "4-takes-first-quad",
        "4-takes-second-quad",
        "4-avoids-fragmented-quad",
        "2-takes-a-pair",
        "2-fills-the-broken-quad",
        "2-keeps-the-whole-quad-free",
        "1-completes-a-broken-pair",
        "2-pair-in-free-quad",
        "2-no-pair-free-stays-in-a-quad",
        "2-across-quads",
        "3-inside-a-quad",
        "4-split-over-quads",
        "5-whole-quad-plus-one",
        "8-all",
    ],
)
def test_cube_mesh_sets(
    pm: KubegpuPluginManager, held: list[int], request_: int, expected: list[int], score: float
) -> None:
    state = build(pm, gfd_node("p3.16xlarge"))
    if held:
        hold(pm, state, held)
    pod = gpu_pod(request_)
    assert pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=pod).ok
    assert ids_of(pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)) == [expected]
    assert pm.call("nvidia", "kubegpu_scheduler_score", state=state, pod=pod) == score


@pytest.mark.parametrize(
    ("instance", "held", "request_", "expected"),
    [
        ("p4d.24xlarge", [1, 3, 5], 4, [0, 2, 4, 6]),
        ("p5.48xlarge", [0, 7], 6, [1, 2, 3, 4, 5, 6]),
        ("g9.unknown", [2], 3, [0, 1, 3]),
    ],
    ids=["nvswitch-any-set", "nvswitch-remaining-six", "flat-lowest-ids"],
)
def test_nvswitch_and_flat_take_any_set_at_full_score(
    pm: KubegpuPluginManager, instance: str, held: list[int], request_: int, expected: list[int]
) -> None:
    state = build(pm, gfd_node(instance))
    hold(pm, state, held)
    pod = gpu_pod(request_)
    assert ids_of(pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)) == [expected]
    assert pm.call("nvidia", "kubegpu_scheduler_score", state=state, pod=pod) == 100.0


def test_allocate_does_not_change_the_state(pm: KubegpuPluginManager) -> None:
    state = build(pm, gfd_node())
    before = snapshot(state)
    pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=gpu_pod(4))
    assert snapshot(state) == before


@pytest.mark.parametrize(
    ("counts", "expected", "score"),
    [
        ((2, 2), [[0, 1], [2, 3]], 100.0),
        ((4, 4), [[0, 1, 2, 3], [4, 5, 6, 7]], 100.0),
        ((1, 4, 2), [[0], [4, 5, 6, 7], [2, 3]], 100.0),
        ((4, 2, 2), [[0, 1, 2, 3], [4, 5], [6, 7]], 100.0),
    ],
    ids=["two-pairs", "two-quads", "one-quad-pair", "quad-and-pairs"],
)
def test_multi_container_pods_get_disjoint_sets(
    pm: KubegpuPluginManager, counts: tuple[int, ...], expected: list[list[int]], score: float
) -> None:
    state = build(pm, gfd_node())
    pod = gpu_pod(*counts)
    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)
    assert ids_of(allocation) == expected
    assert pm.call("nvidia", "kubegpu_scheduler_score", state=state, pod=pod) == score
    assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key="ns/job", allocation=allocation).ok


def test_container_without_gpus_is_omitted(pm: KubegpuPluginManager) -> None:
    state = build(pm, gfd_node())
    pod = make_pod("job", {"sidecar": {"cpu": "1"}, "train": {GPU: 2}})
    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)
    assert_allocation(allocation, {"train": {GPU: ["0", "1"]}})


@pytest.mark.parametrize(
    ("held", "counts", "code"),
    [
        ([], (9,), Code.UNRESOLVABLE),
        ([], (5, 4), Code.UNRESOLVABLE),
        ([0], (8,), Code.UNSCHEDULABLE),
        ([0, 1, 2, 3, 4], (2, 2), Code.UNSCHEDULABLE),
    ],
    ids=["more-than-the-node-has", "containers-together-too-many", "one-gpu-in-use", "containers-blocked"],
)
def test_insufficient_gpus(pm: KubegpuPluginManager, held: list[int], counts: tuple[int, ...], code: Code) -> None:
    state = build(pm, gfd_node())
    if held:
        hold(pm, state, held)
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=gpu_pod(*counts))
    assert status == Status(code, ("Insufficient nvidia.com/gpu",), "nvidia")
    assert pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=gpu_pod(*counts)) is None


# ----------------------------------------------------------------------------------------------------------
# Model and memory
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [V100, "  tesla-v100-sxm2-16gb ", "TESLA V100-SXM2-16GB", "tesla_v100_sxm2_16gb"],
    ids=["exact", "trimmed-lowercase", "nvml-spelling-with-space", "underscores"],
)
def test_model_annotation_matches_loosely(pm: KubegpuPluginManager, model: str) -> None:
    state = build(pm, gfd_node())
    pod = gpu_pod(2, annotations={"nvidia-gpu-scheduler/gpu.model": model})
    assert pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=pod).ok
    assert_allocation(pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod), {"c0": {GPU: ["0", "1"]}})


def test_missing_model_is_refused_with_one_reason_naming_it(pm: KubegpuPluginManager) -> None:
    pod = gpu_pod(1, annotations={"nvidia-gpu-scheduler/gpu.model": " A100-SXM4-40GB "})
    statuses = {
        pm.call("nvidia", "kubegpu_scheduler_fit", state=build(pm, node), pod=pod)
        for node in (gfd_node(name="a"), gfd_node("p3.8xlarge", count=4, name="b"))
    }
    assert statuses == {Status.unresolvable('node(s) have no GPU of model "A100-SXM4-40GB"', plugin="nvidia")}


def test_model_selects_gpus_on_a_mixed_node(pm: KubegpuPluginManager) -> None:
    devices = [*gpus(2, model=V100, memory=16 * GIB), *gpus(4, model=A100)[2:]]
    state = build(pm, advertised_node(devices))
    pod = gpu_pod(2, annotations={"nvidia-gpu-scheduler/gpu.model": "nvidia-a100-sxm4-40gb"})
    assert_allocation(pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod), {"c0": {GPU: ["2", "3"]}})
    three = gpu_pod(3, annotations={"nvidia-gpu-scheduler/gpu.model": A100})
    assert pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=three).code is Code.UNRESOLVABLE


@pytest.mark.parametrize(
    ("memory", "node", "expected"),
    [
        ("15Gi", gfd_node(), Status.success()),
        (
            "16Gi",
            gfd_node(),
            Status.unresolvable("node(s) have no GPU with at least 16Gi of memory", plugin="nvidia"),
        ),
        ("16Gi", gfd_node(memory_mib=None), Status.success()),
        (
            "32Gi",
            gfd_node("g9.unknown", memory_mib=None),
            Status.unresolvable("node(s) have no GPU with at least 32Gi of memory", plugin="nvidia"),
        ),
        ("17179869184", gfd_node("p3dn.24xlarge", memory_mib=32510), Status.success()),
    ],
    ids=[
        "enough",
        "gfd-memory-below-nominal",
        "catalog-memory",
        "unknown-memory-never-qualifies",
        "plain-bytes",
    ],
)
def test_minimum_memory(pm: KubegpuPluginManager, memory: str, node: NodeInfo, expected: Status) -> None:
    pod = gpu_pod(2, annotations={"kubegpu.io/gpu-memory": memory})
    assert pm.call("nvidia", "kubegpu_scheduler_fit", state=build(pm, node), pod=pod) == expected


def test_memory_picks_the_large_gpus(pm: KubegpuPluginManager) -> None:
    devices = [DeviceInfo(id=str(i), model=A100, memory=(80 if i >= 4 else 40) * GIB) for i in range(8)]
    state = build(pm, advertised_node(devices, {"kind": "nvswitch"}))
    pod = gpu_pod(2, annotations={"kubegpu.io/gpu-memory": "64Gi", "nvidia-gpu-scheduler/gpu.model": A100})
    assert_allocation(pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod), {"c0": {GPU: ["4", "5"]}})
    too_many = gpu_pod(5, annotations={"kubegpu.io/gpu-memory": "64Gi"})
    assert pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=too_many).code is Code.UNRESOLVABLE


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("lots", "'lots' is not a Kubernetes quantity"), ("-1Gi", "is negative")],
    ids=["not-a-quantity", "negative"],
)
def test_malformed_memory_annotation_is_refused(pm: KubegpuPluginManager, value: str, fragment: str) -> None:
    pod = gpu_pod(1, annotations={"kubegpu.io/gpu-memory": value})
    status = pm.call("nvidia", "kubegpu_scheduler_validate", pod=pod)
    assert status.code is Code.UNRESOLVABLE
    assert status.message.startswith("annotation kubegpu.io/gpu-memory: ") and fragment in status.message
    fit = pm.call("nvidia", "kubegpu_scheduler_fit", state=build(pm, gfd_node()), pod=pod)
    assert fit == status


def test_well_formed_pod_passes_validation(pm: KubegpuPluginManager) -> None:
    pod = gpu_pod(1, annotations={"kubegpu.io/gpu-memory": "16Gi", "nvidia-gpu-scheduler/gpu.model": V100})
    assert pm.call("nvidia", "kubegpu_scheduler_validate", pod=pod) is None


# ----------------------------------------------------------------------------------------------------------
# The ledger: take, release, headroom, describe
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("containers", "shares", "message"),
    [
        ({"main": {GPU: ["2"]}}, {}, "device 2 is already held by ns/first"),
        ({"main": {GPU: ["5", "8"]}}, {}, "device 8 does not exist on this node"),
        ({"main": {GPU: ["5"]}, "side": {GPU: ["5"]}}, {}, "device 5 appears twice in the allocation"),
        ({"main": {"aws.amazon.com/neuron": ["5"]}}, {}, "resource aws.amazon.com/neuron is not scheduled"),
        ({"main": {GPU: ["5"]}}, {"main": {GPU: {"5": 1}}}, "must name each of its GPUs once"),
    ],
    ids=["double-allocation", "unknown-id", "same-id-twice", "foreign-resource", "shares"],
)
def test_take_refuses_without_changing_state(
    pm: KubegpuPluginManager,
    containers: dict[str, dict[str, list[str]]],
    shares: dict[str, dict[str, dict[str, int]]],
    message: str,
) -> None:
    state = build(pm, advertised_node(gpus(8, unhealthy=(7,)), {"kind": "cube-mesh"}))
    hold(pm, state, [2, 3], key="ns/first")
    before = snapshot(state)
    allocation = PluginAllocation(plugin="nvidia", containers=containers, shares=shares)
    status = pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key="ns/second", allocation=allocation)
    assert status.code is Code.ERROR and message in status.message
    assert snapshot(state) == before


def test_a_pod_keeps_a_gpu_that_turned_unhealthy_but_it_is_never_handed_out_again(pm: KubegpuPluginManager) -> None:
    state = build(pm, advertised_node(gpus(8, unhealthy=(7,)), {"kind": "cube-mesh"}))
    running = PluginAllocation(plugin="nvidia", containers={"main": {GPU: ["6", "7"]}})
    assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key="ns/running", allocation=running).ok
    assert pm.call("nvidia", "kubegpu_scheduler_release", state=state, pod_key="ns/running", allocation=running).ok
    assert pm.call("nvidia", "kubegpu_scheduler_headroom", state=state).free[GPU] == 7
    everything = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=gpu_pod(7))
    assert "7" not in everything.containers["c0"][GPU]


def test_release_returns_exactly_what_was_taken(pm: KubegpuPluginManager) -> None:
    state = build(pm, gfd_node())
    empty = snapshot(state)
    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=gpu_pod(2, 1))
    assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key="ns/a", allocation=allocation).ok
    hold(pm, state, [4], key="ns/b")
    taken = snapshot(state)

    other = pm.call("nvidia", "kubegpu_scheduler_release", state=state, pod_key="ns/b", allocation=allocation)
    assert other.ok, "release is idempotent (Unreserve): what ns/b does not hold is left alone"
    assert snapshot(state) == taken

    assert pm.call("nvidia", "kubegpu_scheduler_release", state=state, pod_key="ns/a", allocation=allocation).ok
    assert state.holders == [None, None, None, None, "ns/b", None, None, None]
    again = pm.call("nvidia", "kubegpu_scheduler_release", state=state, pod_key="ns/a", allocation=allocation)
    assert again.ok and state.holders == [None, None, None, None, "ns/b", None, None, None]
    only_b = PluginAllocation(plugin="nvidia", containers={"main": {GPU: ["4"]}})
    assert pm.call("nvidia", "kubegpu_scheduler_release", state=state, pod_key="ns/b", allocation=only_b).ok
    assert snapshot(state) == empty


def test_headroom_and_describe(pm: KubegpuPluginManager) -> None:
    state = build(pm, gfd_node())
    hold(pm, state, [0, 1, 2], key="ns/a")
    headroom = pm.call("nvidia", "kubegpu_scheduler_headroom", state=state)
    assert headroom.free[GPU] == 5 and headroom.utilization == pytest.approx(3 / 8)

    (occupancy,) = pm.call("nvidia", "kubegpu_scheduler_describe", state=state)
    assert (occupancy.family, occupancy.layout, occupancy.columns) == ("nvidia", "grid", 4)
    assert (occupancy.total, occupancy.free, occupancy.largest_fit) == (8, 5, 5)
    assert [c.holders for c in occupancy.cells[:4]] == [["ns/a"], ["ns/a"], ["ns/a"], []]

    flat = build(pm, advertised_node(gpus(2, unhealthy=(1,))))
    (cells,) = pm.call("nvidia", "kubegpu_scheduler_describe", state=flat)
    assert (cells.layout, cells.free, [c.healthy for c in cells.cells]) == ("cells", 1, [True, False])


# ----------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("groups", "gpus_", "message"),
    [
        ([[0, 1], [1, 2]], 4, "GPU 1 appears in two groups"),
        ([[0, 4]], 4, "GPU 4 is not on this node"),
        ([[0], []], 4, "a group is empty"),
        ([["a"]], 4, "'a' is neither a GPU nor a group"),
    ],
    ids=["gpu-twice", "out-of-range", "empty-group", "not-a-gpu"],
)
def test_build_tree_refuses_malformed_groups(groups: list[Any], gpus_: int, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        build_tree(GROUPS, gpus_, groups)


def test_tree_ideal_sizes_and_nesting() -> None:
    tree = build_tree(CUBE_MESH, 8, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    assert tree.ideal[1:] == (2, 2, 4, 4, 8, 8, 8, 8)
    assert [bin(g.mask) for g in tree.groups[:4]] == ["0b11", "0b1100", "0b110000", "0b11000000"]
    # a group equal to its parent adds nothing
    assert build_tree(GROUPS, 4, [[[0, 1], [2, 3]]]).groups == build_tree(GROUPS, 4, [[0, 1], [2, 3]]).groups
    assert tree_from_inventory({}, ["0", "1"]) is None


def test_choose_returns_none_when_too_few_gpus_are_free() -> None:
    tree = build_tree(CUBE_MESH, 8, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    assert choose(tree, 0b00010111, 5) is None
    assert choose(tree, 0b00010111, 4) == (0b00010111, 8)


@pytest.mark.parametrize(
    ("a", "b"),
    [(" Tesla-V100-SXM2-16GB ", "tesla v100-sxm2-16gb"), ("NVIDIA  A100__SXM4", "nvidia-a100-sxm4")],
    ids=["gfd-vs-nvml", "runs-of-separators"],
)
def test_normalize_model(a: str, b: str) -> None:
    assert normalize_model(a) == normalize_model(b)


# ----------------------------------------------------------------------------------------------------------
# Invariant: a held GPU is never handed out again
# ----------------------------------------------------------------------------------------------------------

_PM = build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
_NODES = {
    "cube-mesh": gfd_node("p3.16xlarge"),
    "nvswitch-unhealthy": advertised_node(gpus(8, unhealthy=(2, 5)), {"kind": "nvswitch"}),
    "groups": advertised_node(gpus(6), {"groups": [[["0", "1"], ["2"]], ["3", "4", "5"]]}),
}
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.lists(st.integers(1, 5), min_size=1, max_size=3)),
        st.tuples(st.just("delete"), st.integers(0, 20)),
        st.tuples(st.just("replay"), st.lists(st.integers(0, 9), min_size=1, max_size=4)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(node=st.sampled_from(sorted(_NODES)), ops=_OPS)
def test_random_workloads_never_hand_out_a_held_gpu(node: str, ops: list[tuple[str, Any]]) -> None:
    pm = _PM
    state = build(pm, _NODES[node])
    live: dict[str, set[str]] = {}
    allocations: dict[str, PluginAllocation] = {}
    for step, (op, arg) in enumerate(ops):
        key = f"ns/p{step}"
        if op == "schedule":
            pod = gpu_pod(*arg, name=f"p{step}")
            fits = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=pod).ok
            allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)
            assert fits == (allocation is not None)
            if allocation is None:
                continue
            chosen = allocation.device_ids()
            assert sum(len(r[GPU]) for r in allocation.containers.values()) == len(chosen) == sum(arg)
            assert not chosen & set().union(*live.values())
            assert all(state.healthy >> int(i) & 1 for i in chosen)
            assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=key, allocation=allocation).ok
            live[key], allocations[key] = chosen, allocation
        elif op == "delete" and live:
            victim = sorted(live)[arg % len(live)]
            released = pm.call(
                "nvidia",
                "kubegpu_scheduler_release",
                state=state,
                pod_key=victim,
                allocation=allocations[victim],
            )
            assert released.ok
            del live[victim], allocations[victim]
        elif op == "replay":
            # A decoded annotation naming arbitrary GPUs: taken only when all exist and nobody holds them (a running
            # pod keeps a GPU that turned unhealthy; allocate never offers one).
            ids = [str(i) for i in arg]
            garbage = PluginAllocation(plugin="nvidia", containers={"main": {GPU: ids}})
            held = set().union(*live.values())
            valid = len(set(ids)) == len(ids) and all(i in state.index for i in ids) and not set(ids) & held
            before = snapshot(state)
            status = pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=key, allocation=garbage)
            assert status.ok == valid
            if valid:
                live[key], allocations[key] = set(ids), garbage
            else:
                assert snapshot(state) == before
        holders = {state.ids[bit]: h for bit, h in enumerate(state.holders) if h is not None}
        assert holders == {i: k for k, ids_ in live.items() for i in ids_}
        headroom = pm.call("nvidia", "kubegpu_scheduler_headroom", state=state)
        healthy_held = sum(1 for i in holders if state.healthy >> state.index[i] & 1)
        assert headroom.free[GPU] == state.healthy.bit_count() - healthy_held
