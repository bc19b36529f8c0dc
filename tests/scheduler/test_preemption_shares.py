"""Preemption where GPUs are shared (HAMi-style `nvidia.com/gpucores` with `nvidia.com/gpumem` or
`nvidia.com/gpumem-percentage`) or split by MIG: a platform team's important inference pod takes GPU capacity held
by batch shares of lower priority, and no more than it needs.

The engine's per-node search (`Engine.select_victims`) runs the nvidia plugin's own fit on the node with pods taken
out and put back, so the victims it keeps are those whose return would leave no GPU with room: all on the GPU the
pod then gets, the lowest priority first, as kube-scheduler's DefaultPreemption chooses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.cli import main
from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.plugins.nvidia import mig
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

GPU = "nvidia.com/gpu"
CORES = "nvidia.com/gpucores"
MEM = "nvidia.com/gpumem"
MEM_PCT = "nvidia.com/gpumem-percentage"


def shared_node(name: str = "g", gpus: int = 2, *, gpu_only: bool = False) -> dict[str, Any]:
    """A node of `gpus` 16 GiB GPUs as HAMi's device plugin and GPU Feature Discovery advertise it (split 10);
    `gpu_only`: listing `nvidia.com/gpu` alone, as HAMi's device plugin leaves it."""
    labels = {"nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": "16384", "kubernetes.io/hostname": name}
    allocatable = {GPU: 10 * gpus}
    if not gpu_only:
        allocatable.update({CORES: 100 * gpus, MEM_PCT: 100 * gpus, MEM: 16384 * gpus})
    return node_manifest(name, labels=labels, allocatable=allocatable)


def share_doc(name: str, priority: int, limits: dict[str, int], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "resources": {"limits": {r: str(v) for r, v in limits.items()}}}
    metadata = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    return {"kind": "Pod", "metadata": metadata, "spec": {"priority": priority, "containers": [container], **spec}}


def share(name: str, priority: int, percent: int | None = None, **limits: int) -> PodRequest:
    asked = {GPU: 1, **({CORES: percent, MEM_PCT: percent} if percent is not None else {}), **limits}
    return pod_request(share_doc(name, priority, asked))[0]


def engine(*nodes: dict[str, Any]) -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for node in nodes:
        e.add_node(node_info(node))
    return e


def gpu_of(e: Engine, key: str) -> list[str]:
    placed = e.placement(key)
    assert placed is not None and placed.allocation is not None
    return placed.allocation.containers["main"][GPU]


def fill(e: Engine, priorities: dict[str, int], percent: int = 30) -> dict[str, list[str]]:
    """Place a share of `percent` per pod, in order; which GPU each got."""
    for name, priority in priorities.items():
        assert e.schedule(share(name, priority, percent)).scheduled, name
    return {name: gpu_of(e, f"default/{name}") for name in priorities}


def evict_and_place(e: Engine, pod: PodRequest, victims: tuple[str, ...]) -> list[str]:
    for key in victims:
        assert e.release(key) is not None
    decision = e.schedule(pod)
    assert decision.allocation is not None, decision.reason
    return decision.allocation.containers["main"][GPU]


@pytest.mark.parametrize("gpu_only", [False, True], ids=["share-resources-listed", "gpu-only-listed"])
def test_a_half_gpu_share_evicts_the_fewest_lowest_priority_shares_all_on_the_gpu_it_gets(gpu_only: bool) -> None:
    """Also on a node listing `nvidia.com/gpu` alone (HAMi's device plugin), where kubegpu places shares from its
    per-GPU books: preemption's first check read the unlisted `nvidia.com/gpucores` as none free, so no share ever
    preempted there (`no node would fit the pod even without the pods of lower priority`)."""
    e = engine(shared_node(gpu_only=gpu_only))
    gpus = fill(e, {"b5": 5, "b1": 1, "b3": 3, "b2": 2, "b4": 4, "b6": 6})
    assert {name for name, g in gpus.items() if g == ["1"]} == {"b3", "b2", "b6"}  # GPU 0: b5, b1, b4
    infer = share("infer", 100, 50)
    preemption = e.preempt(infer)
    # two 30 % shares of one GPU free 60 %; GPU 1's highest victim (3) is below GPU 0's (4), and b6 is reprieved
    assert preemption.victims == ("default/b3", "default/b2")
    assert len(e.pods) == 6  # a what-if
    assert evict_and_place(e, infer, preemption.victims) == ["1"]


def test_a_whole_gpu_pod_evicts_every_sharer_of_one_gpu_and_no_other() -> None:
    e = engine(shared_node())
    fill(e, {"b5": 5, "b1": 1, "b3": 3, "b2": 2, "b4": 4, "b6": 6})
    whole = share("whole", 100)
    preemption = e.preempt(whole)
    assert sorted(preemption.victims) == ["default/b1", "default/b4", "default/b5"]  # GPU 0: b6 (6) is on GPU 1
    assert evict_and_place(e, whole, preemption.victims) == ["0"]


@pytest.mark.parametrize("whole_first", [True, False], ids=["share-behind-whole", "whole-behind-shares"])
def test_a_whole_gpu_pod_and_shares_give_way_to_each_other_by_priority(whole_first: bool) -> None:
    """A share whose only room is a GPU held whole by a pod of lower priority evicts that pod, not the higher
    shares of the other GPU; a whole-GPU pod evicts the GPU held whole of lower priority, or else the shares."""
    e = engine(shared_node())
    assert e.schedule(share("held", 1)).scheduled  # GPU 0, whole
    fill(e, {"s1": 5, "s2": 5, "s3": 5})  # GPU 1, 90 %
    preemptor = share("infer", 100, 50) if whole_first else share("whole", 100)
    preemption = e.preempt(preemptor)
    assert preemption.victims == ("default/held",)
    assert evict_and_place(e, preemptor, preemption.victims) == ["0"]


@pytest.mark.parametrize(
    ("held", "asked", "refusal"),
    [
        ({MEM: 6000}, {MEM: 8000}, "GPU 0 has 4384 MiB memory free, the pod asks 8000 MiB"),
        ({MEM_PCT: 40}, {MEM_PCT: 50}, "Insufficient nvidia.com/gpumem-percentage"),
    ],
    ids=["gpumem", "gpumem-percentage"],
)
def test_memory_the_tightest_dimension_evicts_one_share_for_its_memory(
    held: dict[str, int], asked: dict[str, int], refusal: str
) -> None:
    """Compute is plentiful (10 % each); each GPU's memory holds two shares and not the pod: one share goes."""
    e = engine(shared_node())
    for name, priority in {"m5": 5, "m1": 1, "m3": 3, "m2": 2}.items():
        assert e.schedule(share(name, priority, **{CORES: 10, **held})).scheduled
    infer = share("infer", 100, **{CORES: 10, **asked})
    refused = e.schedule(infer)
    assert not refused.scheduled and refusal in (refused.reason or "")
    preemption = e.preempt(infer)
    assert preemption.victims == ("default/m1",)
    freed = gpu_of(e, "default/m1")
    assert evict_and_place(e, infer, preemption.victims) == freed


def mig_node(layout: str, counts: dict[str, int]) -> dict[str, Any]:
    device = DeviceInfo(
        id="0", model="NVIDIA A100-SXM4-80GB", memory=81920 << 20, attributes={mig.LAYOUT_ATTRIBUTE: layout}
    )
    inventory = DeviceInventory(plugin="nvidia", devices=[device])
    annotation = encode_devices(NodeDevices(inventories={"nvidia": inventory}))
    allocatable = {"cpu": 64, "pods": 110, **{f"{mig.MIG_PREFIX}{p}": n for p, n in counts.items()}}
    return node_manifest("a100", annotations={DEVICES_KEY: annotation}, allocatable=allocatable)


def mig_pod(name: str, profile: str, priority: int) -> PodRequest:
    return pod_request(share_doc(name, priority, {f"{mig.MIG_PREFIX}{profile}": 1}))[0]


def test_a_mig_pod_evicts_only_the_holder_of_its_profile_never_the_small_slices_beside_it() -> None:
    """MIG layouts are static (the operator's `nvidia.com/mig.config`): a 3g.40gb pod gets the 3g.40gb instance,
    so of the A100's pods of lower priority only its holder goes, however low the 1g.10gb pods' priorities are."""
    e = engine(mig_node("3g.40gb@0,1g.10gb@4,1g.10gb@5,1g.10gb@6", {"3g.40gb": 1, "1g.10gb": 3}))
    assert e.schedule(mig_pod("batch", "3g.40gb", 50)).scheduled
    for i in range(3):
        assert e.schedule(mig_pod(f"small-{i}", "1g.10gb", i)).scheduled
    infer = mig_pod("infer", "3g.40gb", 100)
    assert e.preempt(infer).victims == ("default/batch",)


def test_a_mig_layout_without_the_profile_evicts_nobody() -> None:
    """Seven 1g.10gb slices held by pods of lower priority: evicting them frees no 3g.40gb instance (the layout
    stays), so nobody is evicted for a pod that could not start there."""
    layout = ",".join(f"1g.10gb@{i}" for i in range(7))
    e = engine(mig_node(layout, {"1g.10gb": 7}))
    for i in range(7):
        assert e.schedule(mig_pod(f"small-{i}", "1g.10gb", i)).scheduled
    preemption = e.preempt(mig_pod("infer", "3g.40gb", 100))
    assert preemption.node is None and preemption.victims == ()


def test_equal_priorities_a_budget_and_preemption_policy_never() -> None:
    e = engine(shared_node())
    fill(e, {f"peer-{i}": 100 for i in range(6)})
    assert e.preempt(share("peer", 100, 50)).node is None
    never = pod_request(share_doc("never", 1000, {GPU: 1, CORES: 50, MEM_PCT: 50}, preemptionPolicy="Never"))[0]
    assert e.preempt(never).reason == "the pod's preemptionPolicy is Never"


def test_the_node_is_held_for_the_preemptor_until_it_gives_up() -> None:
    """While its victims leave, the share the preemptor needs is not taken by a pod of lower or equal priority (the
    room beyond it is: the 70 % its victims free leave 20 % beside its 50 %); once the preemptor gives up
    (`unnominate`: deleted, or preempting nowhere), nothing stays held."""
    e = engine(shared_node(gpus=1))
    fill(e, {"b0": 0, "b1": 1, "b2": 2})
    infer = share("infer", 100, 50)
    preemption = e.preempt(infer)
    assert preemption.victims == ("default/b1", "default/b0")
    e.nominate(infer, preemption.node)
    assert e.awaits_victims(infer.key, set(preemption.victims))
    for key in preemption.victims:
        e.release(key)
    for name, priority in (("sneak", 50), ("peer", 100)):
        refused = e.schedule(share(name, priority, 30))
        assert not refused.scheduled and "nominated for a pending pod" in (refused.reason or ""), name
    assert e.schedule(share("beside", 50, 20)).scheduled  # 50 % stay the preemptor's
    e.unnominate(infer.key)
    assert e.schedule(share("sneak", 50, 30)).scheduled


def test_simulate_shows_a_preempted_shares_amounts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The preempted line showed the GPU ids under the share resources (`gpucores=1, gpumem=1` for 30 % and
    4915 MiB of GPU 1), which read as a share of 1 % and 1 MiB."""
    running = [share_doc(f"b{p}", p, {GPU: 1, CORES: 30, MEM_PCT: 30}, nodeName="g") for p in (5, 1, 3, 2, 4, 6)]
    documents = [shared_node(), *running, share_doc("infer", 100, {GPU: 1, CORES: 50, MEM_PCT: 50})]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    assert main(["simulate", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " preempted " in line]
    assert len(lines) == 2, lines
    for line in lines:
        assert re.search(r" main: gpu=(\d), gpucores=30 on \1, gpumem=4915 on \1$", line), line
