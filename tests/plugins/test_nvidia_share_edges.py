"""GPU shares at their edges, as a HAMi user, a tenant and an operator meet them: a node whose labels say less than
they seem to, a pod whose share containers fit alone but not together, a share asked of a node that offers none.
Each test is a story a user would notice: a pod placed where the node must refuse it, or refused for a reason that
names the wrong thing."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import pytest

from kubegpu.core.manifests import pod_request
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeInfo, PluginAllocation, PodRequest
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.status import Code, Status
from kubegpu.core.testing import make_node, make_pod, pod_manifest
from kubegpu.plugins.nvidia import scheduler as nvidia

GPU = "nvidia.com/gpu"
CORES = "nvidia.com/gpucores"
MEM = "nvidia.com/gpumem"
MEM_PCT = "nvidia.com/gpumem-percentage"


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    return make_plugin_manager("scheduler", nvidia=nvidia)


def gfd_node(
    gpus: int, *, split: int = 10, labels: Mapping[str, str] | None = None, offers: Mapping[str, int] | None = None
) -> NodeInfo:
    """A node as GPU Feature Discovery labels it and a device plugin advertises it: `nvidia.com/gpu` = GPUs x split,
    and the share resources in `offers`."""
    return make_node(
        "gpu-0",
        labels={"nvidia.com/gpu.count": str(gpus), **(labels or {})},
        allocatable={GPU: gpus * split, **(offers or {})},
    )


def pod(name: str, **containers: Mapping[str, int]) -> PodRequest:
    return make_pod(name, {c: dict(r) for c, r in containers.items()})


def build(pm: KubegpuPluginManager, node: NodeInfo) -> nvidia.NvidiaNodeState:
    state = pm.call("nvidia", "kubegpu_scheduler_build_node", node=node)
    assert isinstance(state, nvidia.NvidiaNodeState)
    return state


def fit(pm: KubegpuPluginManager, state: nvidia.NvidiaNodeState, request: PodRequest) -> Status:
    status: Status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=request)
    return status


def place(pm: KubegpuPluginManager, state: nvidia.NvidiaNodeState, request: PodRequest) -> PluginAllocation:
    assert fit(pm, state, request).ok
    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=request)
    assert allocation is not None
    status = pm.call(
        "nvidia", "kubegpu_scheduler_take", state=state, pod_key=f"ns/{request.name}", allocation=allocation
    )
    assert status.ok, status.message
    return allocation


# ----------------------------------------------------------------------------------------------------------
# A node's GPU memory that means nothing
# ----------------------------------------------------------------------------------------------------------


def test_a_gpu_memory_label_of_zero_is_unknown_memory_not_a_gpu_without_memory(pm: KubegpuPluginManager) -> None:
    """GFD's `nvidia.com/gpu.memory: "0"` (a label a broken NVML read or a hand edit left): read as a GPU of 0 MiB,
    every share's memory was 0 MiB of 0, so two shares each asking all of the GPU's memory (no memory request, as
    HAMi reads it) were placed together, each with an allocation of `nvidia.com/gpumem: 0` that the node refuses
    (a share takes at least 1 MiB): the pods never ran. Unknown memory is shared out in percent instead."""
    state = build(pm, gfd_node(1, labels={"nvidia.com/gpu.memory": "0"}))
    first = place(pm, state, pod("a", main={GPU: 1, CORES: 30}))
    assert first.shares["main"] == {GPU: {"0": 1}, CORES: {"0": 30}, MEM_PCT: {"0": 100}}
    second = fit(pm, state, pod("b", main={GPU: 1, CORES: 30}))
    assert second.code is Code.UNSCHEDULABLE
    assert "GPU 0 has 0 % memory free, the pod asks 100 %" in second.message
    asks_mib = fit(pm, state, pod("c", main={GPU: 1, CORES: 10, MEM: 1024}))
    assert asks_mib.code is Code.UNRESOLVABLE and "do not say how much memory their GPUs have" in asks_mib.message


def test_a_share_refused_for_memory_it_never_asked_says_it_took_the_whole_gpus_memory(pm: KubegpuPluginManager) -> None:
    """A pod asking 10 % of a GPU's compute and no memory takes all of the GPU's memory, as with HAMi. Refused beside
    another share, it read `the pod asks 16384 MiB`, a figure nowhere in its spec; the reason now says why. A pod that
    names its memory is told the figure alone."""
    state = build(pm, gfd_node(1, labels={"nvidia.com/gpu.memory": "16384"}, offers={CORES: 100, MEM: 16384}))
    place(pm, state, pod("first", main={GPU: 1, CORES: 30, MEM: 4096}))
    unasked = fit(pm, state, pod("unasked", main={GPU: 1, CORES: 10}))
    assert unasked.code is Code.UNSCHEDULABLE
    assert unasked.message == (
        "GPU 0 has 12288 MiB memory free, the pod asks 16384 MiB (all of it: no nvidia.com/gpumem asked)"
    )
    named = fit(pm, state, pod("named", main={GPU: 1, CORES: 10, MEM: 13000}))
    assert named.message == "GPU 0 has 12288 MiB memory free, the pod asks 13000 MiB"


@pytest.mark.parametrize("unknown", [None, 0], ids=["no-memory", "memory-0"])
def test_a_share_in_mib_never_lands_on_a_gpu_whose_memory_is_unknown(
    pm: KubegpuPluginManager, unknown: int | None
) -> None:
    """An advertised node whose GPU 1's memory NVML could not read (0, or none), beside GPU 0 of 16 GiB: a share
    asking 4096 MiB, finding GPU 0 full, was placed on GPU 1 as `nvidia.com/gpumem-percentage: 100` (what it took of
    a GPU whose MiB the scheduler cannot count): the node then writes no memory limit at all, and the GPU's memory
    was booked whole, for a pod that asked 4 GiB. A share in MiB goes only where the MiB can be counted."""
    gpus = [
        DeviceInfo(id="0", model="Tesla V100-SXM2-16GB", memory=16 << 30),
        DeviceInfo(id="1", model="Tesla V100-SXM2-16GB", memory=unknown),
    ]
    node = dataclasses.replace(
        make_node("gpu-0", allocatable={GPU: 20, CORES: 200, MEM_PCT: 200}),
        inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=gpus)},
    )
    state = build(pm, node)
    place(pm, state, pod("big", main={GPU: 1, CORES: 10, MEM: 16000}))
    refused = fit(pm, state, pod("small", main={GPU: 1, CORES: 10, MEM: 4096}))
    assert refused.code is Code.UNSCHEDULABLE
    assert refused.message == "GPU 0 has 384 MiB memory free, the pod asks 4096 MiB"
    in_percent = place(pm, state, pod("percent", main={GPU: 1, CORES: 10, MEM_PCT: 25}))
    assert in_percent.shares["main"][MEM_PCT] == {"1": 25}


# ----------------------------------------------------------------------------------------------------------
# A share asked of a node that offers none
# ----------------------------------------------------------------------------------------------------------

SHARE = {GPU: 1, CORES: 30, MEM: 4096}


@pytest.mark.parametrize(
    "node",
    [
        gfd_node(2, split=1, labels={"nvidia.com/gpu.memory": "16384"}),
        dataclasses.replace(
            make_node("gpu-0", allocatable={GPU: 2}),
            inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=[
                DeviceInfo(id=str(i), model="Tesla V100-SXM2-16GB", memory=16 << 30) for i in range(2)
            ])},
        ),
    ],
    ids=["gfd-and-nvidia-device-plugin", "kubegpu-advertiser-without-shares"],
)  # fmt: skip
def test_a_share_is_refused_by_a_node_that_offers_whole_gpus_only(pm: KubegpuPluginManager, node: NodeInfo) -> None:
    """A node of whole GPUs (NVIDIA's device plugin: one `nvidia.com/gpu` per GPU; kubegpu's advertiser where the
    node enforces no shares, which offers none): a share was placed there, one per GPU, and the node's CRI shim then
    refused the container ("this node enforces no GPU shares"), so the pod never ran and was never placed elsewhere.
    Such a node now refuses a share for good, saying so; whole GPUs it still gives."""
    state = build(pm, node)
    refused = fit(pm, state, pod("share", main=SHARE))
    assert refused.code is Code.UNRESOLVABLE
    assert "node(s) offer whole GPUs only" in refused.message and "container main asks a share" in refused.message
    assert pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod("share", main=SHARE)) is None
    headroom = pm.call("nvidia", "kubegpu_scheduler_headroom", state=state)
    assert (headroom.free[GPU], headroom.free[CORES], headroom.free[MEM_PCT]) == (2, 0, 0)  # `kubegpu top` says so
    assert place(pm, state, pod("whole", main={GPU: 2})).containers["main"][GPU] == ["0", "1"]


@pytest.mark.parametrize(
    "node",
    [
        gfd_node(2, split=10, labels={"nvidia.com/gpu.memory": "16384"}),
        gfd_node(2, split=1, labels={"nvidia.com/gpu.memory": "16384"}, offers={CORES: 200, MEM_PCT: 200}),
    ],
    ids=["hami-device-plugin-split-10", "kubegpu-advertiser-split-1"],
)
def test_a_node_that_offers_shares_takes_them_whatever_its_split(pm: KubegpuPluginManager, node: NodeInfo) -> None:
    """HAMi's device plugin lists only `nvidia.com/gpu`, as GPUs x its split count; kubegpu's advertiser on a node
    enforcing shares lists the share resources too, with a split count of 1 where the operator chose one share per
    GPU. Both take shares."""
    state = build(pm, node)
    assert place(pm, state, pod("share", main=SHARE)).shares["main"][CORES] == {"0": 30}


# ----------------------------------------------------------------------------------------------------------
# Share containers that fit alone but not together
# ----------------------------------------------------------------------------------------------------------


def test_share_containers_that_never_fit_together_are_refused_for_what_they_ask_together(
    pm: KubegpuPluginManager,
) -> None:
    """An app and its sidecar each asking 60 % of one GPU, on a node of one GPU: each fits alone, so the refusal
    fell through to "Insufficient nvidia.com/gpu" (the node has ten share slots free) and counted as a node that
    might fit later. The refusal now names the pod's own first share as what takes the room, and the node never
    fits the pod."""
    state = build(pm, gfd_node(1, labels={"nvidia.com/gpu.memory": "16384"}))
    status = fit(pm, state, pod("pair", app={GPU: 1, CORES: 60, MEM: 4096}, side={GPU: 1, CORES: 60, MEM: 4096}))
    assert status.code is Code.UNRESOLVABLE
    assert status.message == "GPU 0 has 40% compute free beside container app of the pod, container side asks 60%"


def test_share_containers_that_do_not_fit_together_now_say_what_is_short_beside_each_other(
    pm: KubegpuPluginManager,
) -> None:
    """Two GPUs, one half used: the pod's first share takes the free GPU (the fullest that fits), and the second
    finds 50 % and 40 % of compute. The refusal says so rather than "Insufficient nvidia.com/gpu", and names the
    container, since each alone would fit."""
    state = build(pm, gfd_node(2, labels={"nvidia.com/gpu.memory": "16384"}))
    place(pm, state, pod("half", main={GPU: 1, CORES: 50, MEM: 4096}))
    status = fit(pm, state, pod("pair", app={GPU: 1, CORES: 60, MEM: 4096}, side={GPU: 1, CORES: 60, MEM: 4096}))
    assert status.code is Code.UNSCHEDULABLE
    assert status.message == "GPU 0 has 50% compute free, container side asks 60%"
    # the first share takes the free GPU's memory (GPU 0 cannot hold its 14000 MiB): the second finds GPU 0's 12288
    memory = fit(pm, state, pod("pair", app={GPU: 1, CORES: 10, MEM: 14000}, side={GPU: 1, CORES: 10, MEM: 13000}))
    assert memory.message == "GPU 0 has 12288 MiB memory free, container side asks 13000 MiB"
    alone = fit(pm, state, pod("big", main={GPU: 1, CORES: 60, MEM: 4096}))
    assert alone.ok
    # GPU 0 held whole by another pod, GPU 1 free: the pod's own whole-GPU container takes GPU 1, leaving its share
    # nothing; not "every GPU is held whole by another pod"
    state = build(pm, gfd_node(2, labels={"nvidia.com/gpu.memory": "16384"}))
    place(pm, state, pod("other", main={GPU: 1}))
    own = fit(pm, state, pod("mixed", whole={GPU: 1}, share={GPU: 1, CORES: 10, MEM: 1024}))
    assert own.message == "the pod's own whole-GPU containers leave no GPU for a share; the pod asks a share of 1"


# ----------------------------------------------------------------------------------------------------------
# MIG-enabled GPUs beside shared ones, read from labels
# ----------------------------------------------------------------------------------------------------------


def test_mig_enabled_gpus_beside_shared_ones_are_neither_shared_nor_given_whole(pm: KubegpuPluginManager) -> None:
    """Four A100s, two shared ten ways and two MIG-enabled (two 3g.40gb each), as kubegpu's advertiser labels the
    node (`nvidia.com/gpu.count` counts every GPU, MIG-enabled ones too) and lists its resources, read from the labels
    (the scheduler's fallback where the node's inventory annotation is missing or unreadable). The count was capped by
    `nvidia.com/gpu` (20 share slots, not GPUs): four GPUs split 5 ways were booked, so whole-GPU pods and shares were
    placed on the two MIG-enabled GPUs, and the MIG devices were booked under GPUs "20" and "21", which the node
    does not have."""
    labels = {
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-3g.40gb.count": "4",
    }
    offers = {CORES: 200, MEM_PCT: 200, MEM: 2 * 81920, "nvidia.com/mig-3g.40gb": 4}
    state = build(pm, gfd_node(4, split=5, labels=labels, offers=offers))  # 20 slots: 2 GPUs x 10
    assert (state.ids, state.split) == (("0", "1"), 10)
    assert state.mig is not None and state.mig.ids == ("2", "3")
    for name in ("a", "b"):
        place(pm, state, pod(name, main={GPU: 1}))
    third = fit(pm, state, pod("c", main={GPU: 1}))
    assert not third.ok and third.message == "Insufficient nvidia.com/gpu"
    assert sorted(
        place(pm, state, pod(f"m{i}", main={"nvidia.com/mig-3g.40gb": 1})).containers["main"]["nvidia.com/mig-3g.40gb"][
            0
        ]
        for i in range(4)
    ) == ["2@0", "2@4", "3@0", "3@4"]


@pytest.mark.parametrize("memory", ["16_384", "+16384", "1_6384", "16384.0", "0x4000"])
def test_a_gpu_memory_label_that_is_no_number_is_unknown_memory(pm: KubegpuPluginManager, memory: str) -> None:
    """GFD writes `nvidia.com/gpu.memory` in ASCII digits; a label hand-edited to `16_384` or `1_6384` was read as
    Python reads an int (16384 MiB), so a mistyped label quietly set the size of every share in MiB. A label that
    is no count of MiB is unknown memory, as documented: shares are taken in percent."""
    state = build(pm, gfd_node(1, labels={"nvidia.com/gpu.memory": memory}))
    assert state.memory_known == (False,)
    assert place(pm, state, pod("a", main={GPU: 1, CORES: 30})).shares["main"][MEM_PCT] == {"0": 100}


# ----------------------------------------------------------------------------------------------------------
# MIG counts no GPUs could hold
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "devices"),
    [
        ({"nvidia.com/mig-1g.10gb.count": "449"}, 0),  # one more than 64 GPUs hold
        ({"nvidia.com/mig-1g.10gb.count": "999999"}, 0),
        ({"nvidia.com/mig-1g.10gb.count": "57", "nvidia.com/gpu.count": "8"}, 0),
        ({"nvidia.com/mig-1g.10gb.count": "56"}, 56),  # eight GPUs of seven, the count label missing
        ({"nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mig-1g.10gb.me.count": "1"}, 8),
    ],
    ids=["449-devices", "999999-devices", "57-on-8-gpus", "56-devices", "media-beside-seven"],
)
def test_mig_counts_no_layout_holds_are_refused_in_bounded_time(
    pm: KubegpuPluginManager, labels: dict[str, str], devices: int
) -> None:
    """GFD's MIG count labels (or a device plugin's allocatable) laid out from counts alone: for counts that fit no
    layout, each try to place a further 1g instance on a full GPU searched every order of the seven already there
    (5,040 leaves), for every GPU and every GPU count up to 64: a node labelled with 449 1g.10gb devices cost the
    scheduler 19 s at each build of its state, 999999 cost 44 s, while every other node waited. Identical
    instances are now placed in one order only, so that a layout is found, or found impossible, at once."""
    node = make_node("mig-0", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", **labels})
    started = time.perf_counter()
    state = pm.call("nvidia", "kubegpu_scheduler_build_node", node=node)
    took = time.perf_counter() - started
    assert took < 2.0, f"{took:.1f} s to lay out {labels}"
    found = 0 if state is None or state.mig is None else len(state.mig.devices)
    assert found == devices


@pytest.mark.parametrize(
    ("init", "reason"),
    [
        ({GPU: "1", MEM_PCT: "150"}, f"init container check: {MEM_PCT} is 150; give a percent"),
        ({GPU: "1", MEM_PCT: "50", MEM: "10"}, f"init container check requests both {MEM} and {MEM_PCT}"),
        ({CORES: "30"}, f"init container check requests {CORES} without {GPU}"),
        ({GPU: "1", CORES: "30"}, None),
        ({GPU: "2", CORES: "30"}, "init container check asks a share of 2 GPU(s), and the pod holds 1 GPU(s) whole:"),
    ],
    ids=["memory-over-100", "both-memories", "compute-without-gpu", "a-share-of-the-apps-gpu", "more-gpus-than-whole"],
)
def test_an_init_containers_share_of_its_apps_whole_gpu_is_read_as_an_app_containers(
    pm: KubegpuPluginManager, init: dict[str, str], reason: str | None
) -> None:
    """An init container asking a share of the GPU its app takes whole holds nothing (`gpucores` is declared a
    qualifier of `nvidia.com/gpu`): it is lent its share by the allocation, so its ask is read where no holder reads
    it, and one that can never be given is refused naming the init container, as an app container's would be; so
    is one asking a share of more GPUs than its pod holds whole (its pod would hold a share of the other apart from
    the GPU the kubelet hands the app, and the init container be given none)."""
    document = pod_manifest("p", {"main": {GPU: "1"}})
    document["spec"]["initContainers"] = [{"name": "check", "resources": {"limits": init}}]
    status = pm.call("nvidia", "kubegpu_scheduler_validate", pod=pod_request(document, pm.qualifiers)[0])
    assert (None if status is None else status.message[: len(reason or "")]) == reason
