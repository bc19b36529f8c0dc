"""MIG in the nvidia plugin: `nvidia.com/mig-<profile>` devices of A100 and H100 GPUs under GPU Feature Discovery's
mixed strategy, laid out by the placement rules of NVIDIA's MIG user guide, never mixed with whole or shared GPUs,
and refused with what each GPU has free."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices, NodeInfo, PluginAllocation, PodRequest
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.plugin_manager import make_plugin_manager as build_plugin_manager
from kubegpu.core.status import Code
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.nvidia import mig
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

GPU = "nvidia.com/gpu"
A100_80 = "NVIDIA A100-SXM4-80GB"
MIB = 1024 * 1024
TABLE_80 = mig.CATALOG["80GB"]
TABLE_40 = mig.CATALOG["A100-40GB"]


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    return make_plugin_manager("scheduler", nvidia=nvidia)


def inventory_node(*layouts: str | None, model: str = A100_80, memory_mib: int = 81920) -> NodeInfo:
    """A node as `kubegpu advertise` describes it: GPU i whole when its layout is None, else MIG-enabled with it."""
    devices = [
        DeviceInfo(
            id=str(i),
            model=model,
            memory=memory_mib * MIB,
            attributes={} if layout is None else {mig.LAYOUT_ATTRIBUTE: layout},
        )
        for i, layout in enumerate(layouts)
    ]
    inventory = DeviceInventory(plugin="nvidia", devices=devices)
    annotation = encode_devices(NodeDevices(inventories={"nvidia": inventory}))
    return make_node("gpu-0", annotations={DEVICES_KEY: annotation})


def build(pm: KubegpuPluginManager, node: NodeInfo) -> nvidia.NvidiaNodeState:
    state = pm.call("nvidia", "kubegpu_scheduler_build_node", node=node, shared=None)
    assert isinstance(state, nvidia.NvidiaNodeState)
    return state


def mig_pod(name: str = "job", **containers: Mapping[str, int]) -> PodRequest:
    return make_pod(name, {c: dict(r) for c, r in containers.items()})


def place(pm: KubegpuPluginManager, state: nvidia.NvidiaNodeState, pod: PodRequest) -> PluginAllocation:
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=pod)
    assert status.ok, status.message
    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)
    assert allocation is not None
    taken = pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=f"ns/{pod.name}", allocation=allocation)
    assert taken.ok, taken.message
    return allocation


# ----------------------------------------------------------------------------------------------------------
# The placement rules (NVIDIA MIG user guide, "Supported MIG Profiles")
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "layout", "error"),
    [
        (TABLE_80, "3g.40gb@4,2g.20gb@0,1g.10gb@2,1g.10gb@3", None),
        (TABLE_80, "7g.80gb@0", None),
        (TABLE_80, "4g.40gb@0,3g.40gb@4", None),
        (TABLE_80, "1g.20gb@6,1g.10gb@0,1g.10gb@1,2g.20gb@2,1g.10gb@4,1g.10gb@5", None),
        (TABLE_40, "3g.20gb@0,3g.20gb@4", None),
        (TABLE_80, "3g.40gb@2", "3g.40gb cannot start at slice 2 (it starts at 0, 4)"),
        (TABLE_80, "4g.40gb@4", "4g.40gb cannot start at slice 4 (it starts at 0)"),
        (TABLE_80, "2g.20gb@6", "2g.20gb cannot start at slice 6 (it starts at 0, 2, 4)"),
        (TABLE_80, "1g.10gb@7", "1g.10gb cannot start at slice 7"),
        (TABLE_80, "4g.40gb@0,2g.20gb@2", "2g.20gb@2 overlaps another instance"),
        (TABLE_80, "1g.10gb+me@0,1g.10gb+me@1", "more than one +me instance"),
        (TABLE_80, "3g.20gb@0", "3g.20gb is not a MIG profile of this GPU"),
    ],
    ids=[
        "balanced",
        "whole",
        "4g-and-3g",
        "mixed-smallest",
        "a100-40gb-halves",
        "3g-at-2",
        "4g-at-4",
        "2g-at-6",
        "1g-at-7",
        "overlap",
        "two-media",
        "40gb-name-on-80gb",
    ],
)
def test_layouts_follow_the_placement_table(table: Mapping[str, mig.Profile], layout: str, error: str | None) -> None:
    if error is None:
        mig.check_layout(table, mig.parse_layout(layout))
    else:
        with pytest.raises(mig.LayoutError, match=error.replace("+", r"\+").replace("(", r"\(").replace(")", r"\)")):
            mig.check_layout(table, mig.parse_layout(layout))


# NVIDIA's MIG user guide, "Supported MIG Profiles", transcribed independently of `mig.CATALOG`: per GPU, each
# profile's placements as `nvidia-smi mig -lgipp` prints them ({start slices}:slices taken).
GUIDE = {
    "A100-40GB": {
        "1g.5gb": "{0,1,2,3,4,5,6}:1",
        "1g.5gb+me": "{0,1,2,3,4,5,6}:1",
        "1g.10gb": "{0,2,4,6}:2",
        "2g.10gb": "{0,2,4}:2",
        "3g.20gb": "{0,4}:4",
        "4g.20gb": "{0}:4",
        "7g.40gb": "{0}:8",
    },
    "80GB": {
        "1g.10gb": "{0,1,2,3,4,5,6}:1",
        "1g.10gb+me": "{0,1,2,3,4,5,6}:1",
        "1g.20gb": "{0,2,4,6}:2",
        "2g.20gb": "{0,2,4}:2",
        "3g.40gb": "{0,4}:4",
        "4g.40gb": "{0}:4",
        "7g.80gb": "{0}:8",
    },
    "A30-24GB": {
        "1g.6gb": "{0,1,2,3}:1",
        "1g.6gb+me": "{0,1,2,3}:1",
        "2g.12gb": "{0,2}:2",
        "2g.12gb+me": "{0,2}:2",
        "4g.24gb": "{0}:4",
    },
    "H100-94GB": {
        "1g.12gb": "{0,1,2,3,4,5,6}:1",
        "1g.12gb+me": "{0,1,2,3,4,5,6}:1",
        "1g.24gb": "{0,2,4,6}:2",
        "2g.24gb": "{0,2,4}:2",
        "3g.47gb": "{0,4}:4",
        "4g.47gb": "{0}:4",
        "7g.94gb": "{0}:8",
    },
    "H100-96GB": {
        "1g.12gb": "{0,1,2,3,4,5,6}:1",
        "1g.12gb+me": "{0,1,2,3,4,5,6}:1",
        "1g.24gb": "{0,2,4,6}:2",
        "2g.24gb": "{0,2,4}:2",
        "3g.48gb": "{0,4}:4",
        "4g.48gb": "{0}:4",
        "7g.96gb": "{0}:8",
    },
    "H200-141GB": {
        "1g.18gb": "{0,1,2,3,4,5,6}:1",
        "1g.18gb+me": "{0,1,2,3,4,5,6}:1",
        "1g.35gb": "{0,2,4,6}:2",
        "2g.35gb": "{0,2,4}:2",
        "3g.71gb": "{0,4}:4",
        "4g.71gb": "{0}:4",
        "7g.141gb": "{0}:8",
    },
}


@pytest.mark.parametrize("gpu", sorted(GUIDE))
def test_every_profiles_placements_follow_the_mig_user_guides_table(gpu: str) -> None:
    table = mig.CATALOG.get(gpu)
    assert table is not None, f"no placement table for the {gpu}"
    placements = {name: "{" + ",".join(map(str, p.starts)) + "}:" + str(p.size) for name, p in table.items()}
    assert placements == GUIDE[gpu]
    assert {name for name, p in table.items() if p.media} == {name for name in GUIDE[gpu] if name.endswith("+me")}
    # the largest profile takes the whole GPU, and no placement runs past its slices
    assert mig.pack(table, [max(table, key=lambda n: table[n].size)]) is not None
    assert mig.free_slots(table, ()) == (4 if gpu == "A30-24GB" else 8)


@pytest.mark.parametrize(
    ("gpu", "layout", "error"),
    [
        ("A30-24GB", "2g.12gb@0,1g.6gb@2,1g.6gb+me@3", None),
        ("A30-24GB", "4g.24gb@0", None),
        ("A30-24GB", "2g.12gb@1", "2g.12gb cannot start at slice 1 (it starts at 0, 2)"),
        ("A30-24GB", "1g.6gb@4", "1g.6gb cannot start at slice 4 (it starts at 0, 1, 2, 3)"),
        ("A30-24GB", "2g.12gb+me@0,1g.6gb+me@2", "more than one +me instance"),
        ("H200-141GB", "3g.71gb@4,2g.35gb@0,1g.18gb@2,1g.18gb@3", None),
        ("H200-141GB", "4g.71gb@4", "4g.71gb cannot start at slice 4 (it starts at 0)"),
        ("H100-94GB", "7g.94gb@0", None),
        ("H100-94GB", "3g.48gb@0", "3g.48gb is not a MIG profile of this GPU"),
        ("H100-96GB", "3g.48gb@0,1g.24gb@4,1g.12gb@6", None),
    ],
    ids=["a30-mixed", "a30-whole", "a30-2g-at-1", "a30-no-slice-4", "a30-two-media", "h200-balanced",
         "h200-4g-at-4", "h100-nvl-whole", "96gb-name-on-94gb", "gh200-mixed"],
)  # fmt: skip
def test_layouts_of_the_newer_gpus_follow_their_tables(gpu: str, layout: str, error: str | None) -> None:
    if error is None:
        mig.check_layout(mig.CATALOG[gpu], mig.parse_layout(layout))
    else:
        with pytest.raises(mig.LayoutError, match=re.escape(error)):
            mig.check_layout(mig.CATALOG[gpu], mig.parse_layout(layout))


def test_an_a30_refusal_names_only_its_four_slices(pm: KubegpuPluginManager) -> None:
    # An A30 laid out 1g.6gb at 0 and 1 and 2g.12gb at 2, the 1g.6gb at 0 and the 2g.12gb held: slice 1 is free.
    state = build(pm, inventory_node("1g.6gb@0,1g.6gb@1,2g.12gb@2", model="NVIDIA A30", memory_mib=24576))
    held = {"nvidia.com/mig-1g.6gb": "0@0", "nvidia.com/mig-2g.12gb": "0@2"}
    for resource, device in held.items():
        taken = PluginAllocation(plugin="nvidia", containers={"main": {resource: [device]}})
        assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=f"ns/{device}", allocation=taken).ok
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=mig_pod(main={"nvidia.com/mig-2g.12gb": 1}))
    assert status.code is Code.UNSCHEDULABLE
    assert status.message == "GPU 0 has 1 free slices (1) but no start position for 2g.12gb"
    assert place(pm, state, mig_pod("small", main={"nvidia.com/mig-1g.6gb": 1})).containers == {
        "main": {"nvidia.com/mig-1g.6gb": ["0@1"]}
    }


@pytest.mark.parametrize(
    ("model", "memory", "profiles", "family"),
    [
        ("NVIDIA-A100-SXM4-40GB", 40960, (), "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, (), "80GB"),
        ("NVIDIA-A100-PCIE-80GB", None, (), "80GB"),
        ("NVIDIA-H100-80GB-HBM3", 81559, (), "80GB"),
        (None, None, ("1g.5gb", "3g.20gb"), "A100-40GB"),
        (None, None, ("1g.10gb", "3g.40gb"), "80GB"),
        ("NVIDIA-H200", 143771, (), "H200-141GB"),
        ("NVIDIA-H200-NVL", 143771, (), "H200-141GB"),
        ("NVIDIA-A30", 24576, (), "A30-24GB"),
        ("NVIDIA-H100-NVL", 95830, (), "H100-94GB"),
        ("NVIDIA-GH200-480GB", 97871, (), "H100-96GB"),
        ("NVIDIA-GH200-144G-HBM3e", 146000, (), None),
        (None, None, ("1g.6gb", "2g.12gb+me"), "A30-24GB"),
        (None, None, ("3g.71gb",), "H200-141GB"),
        (None, None, ("1g.12gb", "3g.48gb"), "H100-96GB"),
        ("NVIDIA-B200", 183359, (), None),
    ],
    ids=[
        "a100-40",
        "a100-80",
        "a100-pcie-80",
        "h100-80",
        "by-40gb-names",
        "by-80gb-names",
        "h200",
        "h200-nvl",
        "a30",
        "h100-nvl-94",
        "gh200-96",
        "gh200-144-not-listed",
        "by-a30-names",
        "by-h200-names",
        "by-96gb-names",
        "b200-unknown",
    ],
)
def test_the_placement_table_is_chosen_by_model_memory_or_profile_names(
    model: str | None, memory: int | None, profiles: tuple[str, ...], family: str | None
) -> None:
    assert mig.family_of(model, memory, profiles) == family


def test_pack_finds_a_legal_layout_where_lowest_starts_would_not() -> None:
    # two 1g.10gb, a 2g.20gb and a 3g.40gb fill all eight slots only with the 3g.40gb at 4: no 1g starts at 7
    layout = mig.pack(TABLE_80, ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])
    assert layout == (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4))
    assert mig.pack(TABLE_80, ["4g.40gb", "4g.40gb"]) is None  # 4g.40gb starts at 0 only


def test_gfd_counts_are_laid_out_over_the_mig_gpus_uniformly() -> None:
    layouts = mig.layout_from_counts(TABLE_80, 2, {"1g.10gb": 4, "2g.20gb": 2, "3g.40gb": 2})  # all-balanced x2
    assert layouts[0] == layouts[1] == (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4))
    with pytest.raises(mig.LayoutError, match="cannot hold"):
        mig.layout_from_counts(TABLE_80, 1, {"4g.40gb": 2})


# ----------------------------------------------------------------------------------------------------------
# Through the plugin
# ----------------------------------------------------------------------------------------------------------


def test_a_mig_pod_gets_a_device_of_its_profile_named_by_gpu_and_start_slice(pm: KubegpuPluginManager) -> None:
    state = build(pm, inventory_node(None, "3g.40gb@0,2g.20gb@4,1g.10gb@6", "4g.40gb@0,3g.40gb@4"))
    allocation = place(pm, state, mig_pod(main={"nvidia.com/mig-3g.40gb": 1}))
    # GPU 1 has fewer free slices (7) than GPU 2 (8): its 3g.40gb goes first, GPU 2 stays whole for a 4g.40gb pod
    assert allocation.containers == {"main": {"nvidia.com/mig-3g.40gb": ["1@0"]}}
    second = place(pm, state, mig_pod("second", main={"nvidia.com/mig-3g.40gb": 1}))
    assert second.containers == {"main": {"nvidia.com/mig-3g.40gb": ["2@4"]}}
    headroom = pm.call("nvidia", "kubegpu_scheduler_headroom", state=state)
    assert headroom.free["nvidia.com/mig-3g.40gb"] == 0 and headroom.free["nvidia.com/mig-4g.40gb"] == 1
    # the MIG-enabled GPUs are never whole GPUs: only GPU 0 is
    assert headroom.free[GPU] == 1
    assert place(pm, state, mig_pod("whole", main={GPU: 1})).containers == {"main": {GPU: ["0"]}}
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=mig_pod("two", main={GPU: 2}))
    assert status.code is Code.UNRESOLVABLE


def test_only_fragmented_slices_free_is_refused_saying_so(pm: KubegpuPluginManager) -> None:
    state = build(pm, inventory_node(",".join(f"1g.10gb@{i}" for i in range(7))))
    for i in (0, 1, 2, 4):  # GPU 0 keeps slices 3, 5, 6 (and 7, which no 1g.10gb takes)
        pod = mig_pod(f"small-{i}", main={"nvidia.com/mig-1g.10gb": 1})
        taken = PluginAllocation(plugin="nvidia", containers={"main": {"nvidia.com/mig-1g.10gb": [f"0@{i}"]}})
        assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=f"ns/{pod.name}", allocation=taken).ok
    wide = mig_pod("wide", main={"nvidia.com/mig-3g.40gb": 1})
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=wide)
    assert status.code is Code.UNRESOLVABLE and status.message == "Insufficient nvidia.com/mig-3g.40gb"

    state = build(pm, inventory_node("1g.10gb@0,1g.10gb@1,1g.10gb@2,1g.10gb@3,3g.40gb@4"))
    for i in (1, 2):
        taken = PluginAllocation(plugin="nvidia", containers={"main": {"nvidia.com/mig-1g.10gb": [f"0@{i}"]}})
        assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=f"ns/p{i}", allocation=taken).ok
    taken = PluginAllocation(plugin="nvidia", containers={"main": {"nvidia.com/mig-3g.40gb": ["0@4"]}})
    assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key="ns/big", allocation=taken).ok
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=mig_pod(main={"nvidia.com/mig-3g.40gb": 1}))
    assert status.code is Code.UNSCHEDULABLE
    assert status.message == "GPU 0 has 2 free slices (0,3) but no start position for 3g.40gb"


def test_free_slices_cut_into_other_profiles_are_named_with_the_layout_as_the_cause(pm: KubegpuPluginManager) -> None:
    state = build(pm, inventory_node("4g.40gb@0,1g.10gb@4,1g.10gb@5,1g.10gb@6", "3g.40gb@0,3g.40gb@4"))
    for key, resource, devices in (
        ("ns/big", "nvidia.com/mig-4g.40gb", ["0@0"]),
        ("ns/halves", "nvidia.com/mig-3g.40gb", ["1@0", "1@4"]),
    ):
        taken = PluginAllocation(plugin="nvidia", containers={"main": {resource: devices}})
        assert pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=key, allocation=taken).ok
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=mig_pod(main={"nvidia.com/mig-3g.40gb": 1}))
    assert status.code is Code.UNSCHEDULABLE
    assert status.message == (
        "GPU 0 has free slices 4,5,6,7, room for 3g.40gb, but its MIG layout cuts them into other profiles "
        "(the node's nvidia.com/mig.config decides the layout)"
    )


def test_whole_shared_and_mig_never_mix(pm: KubegpuPluginManager) -> None:
    pod = mig_pod(main={GPU: 1, "nvidia.com/mig-1g.10gb": 1})
    status = pm.call("nvidia", "kubegpu_scheduler_validate", pod=pod)
    assert status is not None and status.code is Code.UNRESOLVABLE
    assert "a container gets MIG devices or GPUs, not both" in status.message
    state = build(pm, inventory_node(None, "7g.80gb@0"))
    for forged, reason in (
        ({"main": {GPU: ["1"]}}, "device 1 does not exist on this node"),  # the MIG GPU, asked whole
        ({"main": {"nvidia.com/mig-1g.10gb": ["1@0"]}}, "MIG device 1@0 is a 7g.80gb, not 1g.10gb"),
        ({"main": {"nvidia.com/mig-7g.80gb": ["0@0"]}}, "MIG device '0@0' does not exist on this node"),
        ({"a": {"nvidia.com/mig-7g.80gb": ["1@0"]}, "b": {"nvidia.com/mig-7g.80gb": ["1@0"]}}, "appears twice"),
    ):
        allocation = PluginAllocation(plugin="nvidia", containers=forged)
        status = pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key="ns/forged", allocation=allocation)
        assert status.code is Code.ERROR and reason in status.message
    place(pm, state, mig_pod("a", main={"nvidia.com/mig-7g.80gb": 1}))
    allocation = PluginAllocation(plugin="nvidia", containers={"main": {"nvidia.com/mig-7g.80gb": ["1@0"]}})
    status = pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key="ns/b", allocation=allocation)
    assert status.code is Code.ERROR and "already held by ns/a" in status.message
    assert pm.call("nvidia", "kubegpu_scheduler_release", state=state, pod_key="ns/a", allocation=allocation).ok
    assert pm.call("nvidia", "kubegpu_scheduler_release", state=state, pod_key="ns/a", allocation=allocation).ok
    assert pm.call("nvidia", "kubegpu_scheduler_headroom", state=state).free["nvidia.com/mig-7g.80gb"] == 1


def test_a_layout_breaking_the_rules_gives_that_gpu_no_mig_devices(
    pm: KubegpuPluginManager, caplog: pytest.LogCaptureFixture
) -> None:
    state = build(pm, inventory_node("3g.40gb@2,1g.10gb@0", "7g.80gb@0"))
    assert state.mig is not None and sorted(state.mig.devices) == ["1@0"]
    assert "GPU 0 has no usable MIG devices: 3g.40gb cannot start at slice 2" in caplog.text


def test_the_engine_places_mig_pods_on_a_gfd_mixed_strategy_node_and_refuses_the_one_too_many() -> None:
    engine = Engine(build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig-1g.10gb.count": "4",
        "nvidia.com/mig-2g.20gb.count": "2",
        "nvidia.com/mig-3g.40gb.count": "2",
    }
    allocatable = {
        "cpu": "64",
        "memory": "256Gi",
        "pods": "110",
        "nvidia.com/mig-1g.10gb": "4",
        "nvidia.com/mig-2g.20gb": "2",
        "nvidia.com/mig-3g.40gb": "2",
    }
    engine.add_node(
        node_info(
            {"kind": "Node", "metadata": {"name": "a100", "labels": labels}, "status": {"allocatable": allocatable}}
        )
    )

    def pod(name: str, profile: str) -> PodRequest:
        container = {"name": "main", "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}
        manifest: dict[str, Any] = {"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}}
        return pod_request({**manifest, "spec": {"containers": [container]}})[0]

    placed = [engine.schedule(pod(f"p{i}", "3g.40gb")) for i in range(2)]
    assert all(p.scheduled for p in placed)
    devices = sorted(
        d for p in placed if p.allocation for d in p.allocation.containers["main"]["nvidia.com/mig-3g.40gb"]
    )
    assert devices == ["0@4", "1@4"]  # each MIG GPU's 3g.40gb at slice 4, as the balanced layout has it
    refused = engine.schedule(pod("third", "3g.40gb"))
    assert not refused.scheduled
    assert refused.reason == "0/1 nodes are available: 1 Insufficient nvidia.com/mig-3g.40gb."
    assert engine.schedule(pod("small", "1g.10gb")).scheduled


@pytest.mark.parametrize("listed", [True, False], ids=["allocatable", "labels-only"])
def test_a_node_whose_every_gpu_is_mig_enabled_shows_no_whole_gpu_free(listed: bool) -> None:
    """GFD's mixed strategy on a node whose two A100s are both MIG-enabled: `nvidia.com/gpu.count` is 2, and the
    device plugin lists no `nvidia.com/gpu` (or, in a simulator file, the node gives labels alone). Its pictures
    showed two whole GPUs free beside the MIG devices (`kubegpu top`, `--html`, the simulator's maps), counted in the
    family's free and stranded devices, though no whole-GPU pod can ever run there. Only the MIG devices are shown,
    and a whole-GPU pod is refused as before."""
    engine = Engine(build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig-3g.40gb.count": "4",
    }
    status = {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/mig-3g.40gb": "4"}}
    engine.add_node(
        node_info(
            {"kind": "Node", "metadata": {"name": "a100", "labels": labels}, **({"status": status} if listed else {})}
        )
    )
    pictures = {picture.family: picture for picture in engine.describe("a100")}
    assert set(pictures) == {"nvidia-mig"}, pictures
    assert (pictures["nvidia-mig"].total, pictures["nvidia-mig"].free) == (4, 4)
    whole = pod_request(
        {"kind": "Pod", "metadata": {"name": "whole", "namespace": "ns"},
         "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    )[0]  # fmt: skip
    assert not engine.schedule(whole).scheduled


@pytest.mark.parametrize(
    ("mig_replicas", "mig_allocatable"),
    [(None, 14), ("2", 28)],
    ids=["whole-gpus-time-sliced", "mig-devices-time-sliced-too"],
)
def test_a_gfd_mixed_strategy_node_that_shares_its_gpus_counts_each_gpu_once(
    pm: KubegpuPluginManager, mig_replicas: str | None, mig_allocatable: int
) -> None:
    """Four GPUs, two whole and two MIG-enabled (seven 1g.10gb each), under the device plugin's time-slicing: the
    kubelet offers each whole GPU (and, when so configured, each MIG device) as replicas, so allocatable is GPUs x
    replicas. The node still has two whole GPUs, shared four ways, and two MIG GPUs named after them."""
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig-1g.10gb.count": "14",
    }
    if mig_replicas is not None:
        labels["nvidia.com/mig-1g.10gb.replicas"] = mig_replicas
    node = make_node("shared", labels=labels, allocatable={GPU: 8, "nvidia.com/mig-1g.10gb": mig_allocatable})
    state = build(pm, node)
    assert (state.ids, state.split) == (("0", "1"), 4)
    assert state.mig is not None and state.mig.ids == ("2", "3")
    assert sorted(state.mig.devices) == [f"{gpu}@{start}" for gpu in "23" for start in range(7)]


@pytest.mark.parametrize(
    ("family", "instances"),
    [
        (
            "A100-40GB",
            {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
        ),
        ("80GB", {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}),
        (
            "H100-94GB",
            {"1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "2g.24gb": 3, "3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1},
        ),
        (
            "H100-96GB",
            {"1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "2g.24gb": 3, "3g.48gb": 2, "4g.48gb": 1, "7g.96gb": 1},
        ),
        (
            "H200-141GB",
            {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
        ),
        ("A30-24GB", {"1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1}),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_each_placement_table_fits_as_many_instances_as_nvidias_mig_user_guide_lists(
    family: str, instances: dict[str, int]
) -> None:
    """The guide's "Number of Instances Available" per profile: as many as the table's starts fit on one GPU
    (a `+me` profile: one per GPU, whatever its starts)."""
    table = mig.CATALOG[family]
    assert set(table) == set(instances)
    for name, count in instances.items():
        layout = [(name, start) for start in table[name].starts]
        fitting = 1 if table[name].media else max(n for n in range(1, len(layout) + 1) if _legal(table, layout[:n]))
        assert fitting == count, name


def _legal(table: Mapping[str, mig.Profile], layout: list[tuple[str, int]]) -> bool:
    try:
        mig.check_layout(table, layout)
    except mig.LayoutError:
        return False
    return True


# ----------------------------------------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------------------------------------

PROFILES_80 = sorted(TABLE_80)


@st.composite
def gpu_layouts(draw: st.DrawFn) -> list[str]:
    layouts = []
    for _ in range(draw(st.integers(1, 3))):
        names = draw(st.lists(st.sampled_from(PROFILES_80), max_size=7))
        layout = mig.pack(TABLE_80, names)
        layouts.append(mig.format_layout(layout or ()))
    return layouts


@settings(max_examples=60, deadline=None)
@given(
    layouts=gpu_layouts(),
    steps=st.lists(st.tuples(st.booleans(), st.sampled_from(PROFILES_80), st.integers(1, 2)), max_size=25),
)
def test_no_slice_is_held_twice_and_every_placement_is_legal(
    layouts: list[str], steps: list[tuple[bool, str, int]]
) -> None:
    manager = build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    state = manager.call("nvidia", "kubegpu_scheduler_build_node", node=inventory_node(*layouts), shared=None)
    assert state is not None and state.mig is not None
    books = state.mig
    live: dict[str, PluginAllocation] = {}
    for n, (add, profile, count) in enumerate(steps):
        if add or not live:
            pod = mig_pod(f"p{n}", main={mig.resource_of(profile): count})
            if not manager.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=pod).ok:
                assert len([i for i in books.free() if i.profile == profile]) < count
                continue
            allocation = manager.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)
            assert manager.call(
                "nvidia", "kubegpu_scheduler_take", state=state, pod_key=pod.name, allocation=allocation
            ).ok
            live[pod.name] = allocation
        else:
            key = sorted(live)[count % len(live)]
            assert manager.call(
                "nvidia", "kubegpu_scheduler_release", state=state, pod_key=key, allocation=live.pop(key)
            ).ok
        held = [d for a in live.values() for ids in a.containers["main"].values() for d in ids]
        assert len(held) == len(set(held)) == len(books.holders)  # no device, hence no slice, held twice
        for allocation in live.values():
            for resource, ids in allocation.containers["main"].items():
                for device in ids:
                    instance = books.devices[device]
                    assert resource == mig.resource_of(instance.profile)
                    assert instance.start in TABLE_80[instance.profile].starts
        for gpu, layout in enumerate(books.layouts):  # the slices the devices take never overlap
            mig.check_layout(TABLE_80, layout)
            assert all(books.devices[f"{gpu}@{start}"].profile == name for name, start in layout)
