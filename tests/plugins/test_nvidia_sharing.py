"""GPU sharing in the nvidia plugin: HAMi-style requests (`nvidia.com/gpu` with `nvidia.com/gpucores` and
`nvidia.com/gpumem` / `nvidia.com/gpumem-percentage`), per-GPU books that never go over 100 %, whole GPUs that
never share, refusals that say what is short, and the fragmentation policy's measure."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeInfo, PluginAllocation, PodRequest
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.plugin_manager import make_plugin_manager as build_plugin_manager
from kubegpu.core.status import Code
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia.sharing import (
    ANY_CPU,
    FragmentationTable,
    Kind,
    Workload,
    fragmentation_delta,
    node_fragmentation,
)
from kubegpu.scheduler.engine import Engine

GPU = "nvidia.com/gpu"
CORES = "nvidia.com/gpucores"
MEM = "nvidia.com/gpumem"
MEM_PCT = "nvidia.com/gpumem-percentage"


def hami_node(gpus: int = 2, *, split: int = 10, memory_mib: int | None = 16384, name: str = "gpu-0") -> NodeInfo:
    """A node as HAMi's device plugin and GPU Feature Discovery advertise it."""
    labels = {"nvidia.com/gpu.count": str(gpus)}
    if memory_mib is not None:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    allocatable: dict[str, int] = {GPU: gpus * split, CORES: 100 * gpus, MEM_PCT: 100 * gpus}
    if memory_mib is not None:
        allocatable[MEM] = memory_mib * gpus
    return make_node(name, labels=labels, allocatable=allocatable)


def share_pod(name: str = "job", **containers: Mapping[str, int]) -> PodRequest:
    return make_pod(name, {c: dict(r) for c, r in containers.items()})


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    return make_plugin_manager("scheduler", nvidia=nvidia)


def build(pm: KubegpuPluginManager, node: NodeInfo) -> nvidia.NvidiaNodeState:
    state = pm.call("nvidia", "kubegpu_scheduler_build_node", node=node)
    assert isinstance(state, nvidia.NvidiaNodeState)
    return state


def place(pm: KubegpuPluginManager, state: nvidia.NvidiaNodeState, pod: PodRequest) -> PluginAllocation:
    assert pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=pod).ok
    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)
    assert allocation is not None
    taken = pm.call(
        "nvidia", "kubegpu_scheduler_take", state=state, pod_key=f"ns/{pod.name}", allocation=allocation, pod=pod
    )
    assert taken.ok
    return allocation


# ----------------------------------------------------------------------------------------------------------
# What nodes advertise and pods ask
# ----------------------------------------------------------------------------------------------------------


def test_plugin_owns_the_share_resources(pm: KubegpuPluginManager) -> None:
    assert {pm.owner_of(r) for r in (GPU, CORES, MEM, MEM_PCT)} == {"nvidia"}


@pytest.mark.parametrize(
    ("labels", "allocatable", "gpus", "split"),
    [
        ({"nvidia.com/gpu.count": "8"}, {GPU: 80, CORES: 800}, 8, 10),
        ({}, {GPU: 40, CORES: 400}, 4, 10),
        ({}, {GPU: 20, MEM_PCT: 200}, 2, 10),
        ({"nvidia.com/gpu.count": "8"}, {GPU: 8}, 8, 1),
        ({}, {GPU: 3}, 3, 1),
    ],
    ids=["gfd-count-and-split", "count-from-gpucores", "count-from-gpumem-percentage", "whole-gpus", "no-labels"],
)
def test_physical_gpus_and_split_count(
    pm: KubegpuPluginManager, labels: dict[str, str], allocatable: dict[str, int], gpus: int, split: int
) -> None:
    state = build(pm, make_node("n", labels=labels, allocatable=allocatable))
    assert (len(state.ids), state.split) == (gpus, split)


@pytest.mark.parametrize(
    ("resources", "fragment"),
    [
        ({GPU: 1, CORES: 150}, "nvidia.com/gpucores is 150; give a percent of each GPU's compute, 1-100"),
        ({GPU: 1, MEM_PCT: 101}, "nvidia.com/gpumem-percentage is 101"),
        ({GPU: 1, MEM: 1000, MEM_PCT: 10}, "requests both nvidia.com/gpumem and nvidia.com/gpumem-percentage"),
        ({CORES: 30}, "requests nvidia.com/gpucores without nvidia.com/gpu"),
        # HAMi's task priority: 0 (high) passed every fit check unlisted, and ran at HAMi-core's low priority
        ({GPU: 1, MEM: 3000, "nvidia.com/priority": 0}, "requests nvidia.com/priority (HAMi's task priority)"),
        ({GPU: 1, CORES: 30, "nvidia.com/priority": 1}, "remove nvidia.com/priority from the container"),
        ({GPU: 1, "nvidia.com/priority": 0}, "requests nvidia.com/priority"),
    ],
    ids=[
        "cores-over-100",
        "memory-percent-over-100",
        "both-memories",
        "share-without-gpu",
        "hami-priority-high",
        "hami-priority-low",
        "hami-priority-whole-gpu",
    ],
)
def test_malformed_share_is_refused_naming_the_field(
    pm: KubegpuPluginManager, resources: dict[str, int], fragment: str
) -> None:
    status = pm.call("nvidia", "kubegpu_scheduler_validate", pod=share_pod(main=resources))
    assert status is not None and status.code is Code.UNRESOLVABLE
    assert fragment in status.message and "container main" in status.message


# ----------------------------------------------------------------------------------------------------------
# Books, allocations and refusals
# ----------------------------------------------------------------------------------------------------------


def test_two_half_gpu_pods_share_one_gpu_and_the_allocation_names_each_share(pm: KubegpuPluginManager) -> None:
    state = build(pm, hami_node(2))
    first = place(pm, state, share_pod("a", main={GPU: 1, CORES: 50, MEM_PCT: 50}))
    second = place(pm, state, share_pod("b", main={GPU: 1, CORES: 50, MEM: 8192}))
    assert first.shares == {"main": {GPU: {"0": 1}, CORES: {"0": 50}, MEM: {"0": 8192}}}
    assert second.shares == {"main": {GPU: {"0": 1}, CORES: {"0": 50}, MEM: {"0": 8192}}}
    assert first.containers["main"][GPU] == ["0"]
    assert state.cores_used == [100, 0] and state.memory_used == [16384, 0]
    # a whole-GPU pod gets the untouched GPU, never the shared one
    assert place(pm, state, share_pod("c", main={GPU: 1})).containers["main"][GPU] == ["1"]


def test_refusal_says_what_is_short(pm: KubegpuPluginManager) -> None:
    state = build(pm, hami_node(1))
    place(pm, state, share_pod("a", main={GPU: 1, CORES: 60, MEM_PCT: 10}))
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=share_pod(main={GPU: 1, CORES: 50}))
    assert status.code is Code.UNSCHEDULABLE
    assert "GPU 0 has 40% compute free, the pod asks 50%" in status.message
    status = pm.call(
        "nvidia", "kubegpu_scheduler_fit", state=state, pod=share_pod(main={GPU: 1, CORES: 10, MEM: 16000})
    )
    assert "GPU 0 has 14746 MiB memory free, the pod asks 16000 MiB" in status.message


def test_absent_memory_takes_the_whole_memory_as_in_hami(pm: KubegpuPluginManager) -> None:
    state = build(pm, hami_node(1))
    place(pm, state, share_pod("a", main={GPU: 1, CORES: 20}))
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=share_pod(main={GPU: 1, CORES: 20}))
    assert not status.ok and "memory free" in status.message


def test_a_share_never_lands_on_a_gpu_held_whole(pm: KubegpuPluginManager) -> None:
    state = build(pm, hami_node(1))
    place(pm, state, share_pod("whole", main={GPU: 1}))
    status = pm.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=share_pod(main={GPU: 1, CORES: 10}))
    assert status.code is Code.UNSCHEDULABLE and "held whole" in status.message
    forged = PluginAllocation(
        plugin="nvidia",
        containers={"main": {GPU: ["0"], CORES: ["0"], MEM_PCT: ["0"]}},
        shares={"main": {GPU: {"0": 1}, CORES: {"0": 10}, MEM_PCT: {"0": 10}}},
    )
    status = pm.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key="ns/forged", allocation=forged)
    assert status.code is Code.ERROR and "held whole" in status.message


def test_bestfit_packs_onto_the_fullest_gpu_that_fits(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(nvidia.POLICY_ENV, "bestfit")
    state = build(pm, hami_node(3))
    place(pm, state, share_pod("a", main={GPU: 1, CORES: 30, MEM_PCT: 30}))  # GPU 0
    place(pm, state, share_pod("b", main={GPU: 3, CORES: 10, MEM_PCT: 10}))  # every GPU
    # GPU 0 is the fullest (40 %), and 50 % more fit there
    allocation = place(pm, state, share_pod("c", main={GPU: 1, CORES: 50, MEM_PCT: 50}))
    assert allocation.containers["main"][GPU] == ["0"]


@pytest.mark.parametrize(
    ("free", "cpu", "mix", "expected"),
    [
        ([1000, 300], 8000, [(1, 500, 4000, 1.0)], 300),
        ([1000, 300], 8000, [(1, 200, 4000, 1.0)], 0),
        ([1000, 300], 8000, [(1, 1000, 4000, 1.0)], 300),
        ([1000, 300], 8000, [(2, 1000, 4000, 1.0)], 1300),
        ([1000, 300], 8000, [(1, 500, 4000, 0.5), (2, 1000, 4000, 0.5)], 800),
        ([1000, 300], 2000, [(1, 200, 4000, 1.0)], 1300),
        ([1000, 300], 6000, [(1, 200, 4000, 0.5), (1, 200, 8000, 0.5)], 650),
        ([1000, 300], 8000, [], 0),
        ([1000, 300], 8000, [(0, 0, 4000, 1.0)], 1300),
        ([1000, 300], 8000, [(0, 0, 4000, 0.5), (1, 200, 4000, 0.5)], 650),
    ],
    ids=[
        "share-too-small", "share-fits", "whole-loses-partial", "too-few-whole", "weighted", "cpu-gone-strands-all",
        "cpu-for-half-the-mix", "no-pods-seen", "cpu-only-uses-no-gpu", "cpu-only-beside-shares",
    ],
)  # fmt: skip
def test_fragmentation_is_the_capacity_each_kind_cannot_use(
    free: list[int], cpu: int, mix: list[tuple[int, int, int, float]], expected: float
) -> None:
    assert node_fragmentation(free, FragmentationTable.of(mix), cpu) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 1000), min_size=1, max_size=8),
    cpu=st.integers(0, 20000),
    mix=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from([100, 250, 500, 750, 1000]), st.integers(0, 16000)),
        min_size=1,
        max_size=12,
    ),
)
def test_fragmentation_table_agrees_with_the_definition(free: list[int], cpu: int, mix: list[Kind]) -> None:
    """The table's one-pass sum equals the paper's definition computed kind by kind."""
    workload = Workload()
    for kind in mix:
        workload.add(kind)
    expected = 0.0
    total = sum(free)
    for n, milli, need, p in workload.mix():
        if need > cpu or n == 0:  # a cpu-only pod can use none of the free GPUs (the FGD paper's count)
            lost = total
        elif n == 1 and milli < 1000:
            lost = sum(f for f in free if f < milli)
        else:
            whole = sum(1 for f in free if f >= 1000)
            lost = total if whole < n else sum(f for f in free if f < 1000)
        expected += p * lost
    assert node_fragmentation(free, workload.table(), cpu) == pytest.approx(expected)


def test_fgd_keeps_whole_gpus_for_whole_pods() -> None:
    """With whole-GPU pods in the mix, a share goes where it breaks no untouched GPU, on a node of its own kind."""
    pm = build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    state = build(pm, hami_node(2))
    place(pm, state, share_pod("a", main={GPU: 1, CORES: 50, MEM_PCT: 50}))
    state.workload.add((1, 1000, 0))
    allocation = place(pm, state, share_pod("b", main={GPU: 1, CORES: 20, MEM_PCT: 20}))
    assert allocation.containers["main"][GPU] == ["0"]


# ----------------------------------------------------------------------------------------------------------
# Invariants under random workloads
# ----------------------------------------------------------------------------------------------------------

_PM = build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
_REQUESTS = st.one_of(
    st.fixed_dictionaries({GPU: st.integers(1, 3)}),
    st.fixed_dictionaries({GPU: st.integers(1, 2), CORES: st.integers(1, 100), MEM_PCT: st.integers(1, 100)}),
    st.fixed_dictionaries({GPU: st.just(1), CORES: st.integers(1, 100), MEM: st.integers(1, 20000)}),
    st.fixed_dictionaries({GPU: st.just(1), CORES: st.integers(1, 100)}),
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.lists(_REQUESTS, min_size=1, max_size=2)),
        st.tuples(st.just("delete"), st.integers(0, 30)),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(policy=st.sampled_from(["fgd", "bestfit"]), split=st.sampled_from([1, 3, 10]), ops=_OPS)
def test_random_workloads_never_exceed_a_gpu_nor_share_a_whole_one(
    policy: str, split: int, ops: list[tuple[str, Any]]
) -> None:
    os.environ[nvidia.POLICY_ENV] = policy
    try:
        state = build(_PM, hami_node(4, split=split))
    finally:
        del os.environ[nvidia.POLICY_ENV]
    live: dict[str, PluginAllocation] = {}
    for step, (op, arg) in enumerate(ops):
        if op == "schedule":
            pod = share_pod(f"p{step}", **{f"c{i}": r for i, r in enumerate(arg)})
            fits = _PM.call("nvidia", "kubegpu_scheduler_fit", state=state, pod=pod)
            allocation = _PM.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=pod)
            assert fits.ok == (allocation is not None), fits.message
            if allocation is None:
                assert fits.message
                continue
            key = f"ns/p{step}"
            assert _PM.call("nvidia", "kubegpu_scheduler_take", state=state, pod_key=key, allocation=allocation).ok
            live[key] = allocation
        elif op == "delete" and live:
            victim = sorted(live)[arg % len(live)]
            assert _PM.call(
                "nvidia", "kubegpu_scheduler_release", state=state, pod_key=victim, allocation=live.pop(victim)
            ).ok
        cores = [0] * 4
        memory = [0] * 4
        tasks = [0] * 4
        whole: dict[str, str] = {}
        for key, allocation in live.items():
            for container, resources in allocation.containers.items():
                shares = allocation.shares.get(container)
                for device in resources[GPU]:
                    if shares is None:
                        assert device not in whole, "a GPU held whole twice"
                        whole[device] = key
                    else:
                        cores[int(device)] += shares[CORES][device]
                        memory[int(device)] += shares[MEM][device] if MEM in shares else 0
                        tasks[int(device)] += 1
        for gpu in range(4):
            assert cores[gpu] <= 100 and memory[gpu] <= 16384 and tasks[gpu] <= split
            assert not (str(gpu) in whole and tasks[gpu]), "a share on a GPU held whole"
        assert state.cores_used == cores and state.memory_used == memory and state.tasks == tasks


# ----------------------------------------------------------------------------------------------------------
# Through the engine
# ----------------------------------------------------------------------------------------------------------


def test_engine_places_shares_and_deleting_a_pod_frees_its_share() -> None:
    engine = Engine(build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"}
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "10", CORES: "100", MEM_PCT: "100"}
    engine.add_node(
        node_info({"kind": "Node", "metadata": {"name": "n", "labels": labels}, "status": {"allocatable": allocatable}})
    )

    def pod(name: str, cores: int) -> PodRequest:
        limits = {GPU: "1", CORES: str(cores), MEM_PCT: str(cores)}
        container = {"name": "main", "resources": {"limits": limits}}
        return pod_request(
            {"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": {"containers": [container]}}
        )[0]

    assert engine.schedule(pod("a", 60)).scheduled
    refused = engine.schedule(pod("b", 50))
    # the engine's capacity index already knows no GPU has 50 % free: kube-scheduler's wording
    assert not refused.scheduled and "1 Insufficient nvidia.com/gpucores" in refused.reason
    assert engine.release("ns/a") is not None
    assert engine.schedule(pod("b", 50)).scheduled


@pytest.mark.parametrize("priority", ["0", "1"])
def test_a_share_bound_without_an_allocation_is_counted_whatever_task_priority_it_names(priority: str) -> None:
    """A pod bound without kubegpu's allocation (by HAMi before the switch, or by `spec.nodeName`) holds its share on
    the node: the kubelet admits it, dropping `nvidia.com/priority`, which its node does not list. kubegpu counts it
    as the kubelet does; it refuses only to place such a pod. Before, the refusal of `nvidia.com/priority` (whatever
    its value) left the pod uncounted, and its GPU's share went to the next pod."""
    engine = Engine(build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"}
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "10", CORES: "100", MEM_PCT: "100"}
    engine.add_node(
        node_info({"kind": "Node", "metadata": {"name": "n", "labels": labels}, "status": {"allocatable": allocatable}})
    )

    def pod(name: str, **extra: str) -> PodRequest:
        limits = {GPU: "1", CORES: "60", MEM_PCT: "60", **extra}
        spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
        return pod_request({"kind": "Pod", "metadata": {"name": name, "namespace": "ns", "uid": name}, "spec": spec})[0]

    running = pod("running", **{"nvidia.com/priority": priority})
    assert not engine.schedule(running).scheduled  # not placed by kubegpu...
    held = engine.admit_by_count(running, "n")  # ...but counted where it runs
    assert held.scheduled, held.reason
    assert engine.placement("ns/running") is not None and engine.placement("ns/running").request is running
    refused = engine.schedule(pod("next"))
    assert not refused.scheduled and "Insufficient nvidia.com/gpucores" in refused.reason
    assert engine.release("ns/running") is not None
    assert engine.schedule(pod("next")).scheduled


def test_a_share_that_fits_nowhere_is_refused_with_each_nodes_per_gpu_reason_counted() -> None:
    """Nodes whose totals would hold the pod but no single GPU can: each says which GPU comes closest and what it
    lacks, and the summary counts the nodes under their reasons as kube-scheduler counts them."""
    engine = Engine(build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "16384"}
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "20", CORES: "200", MEM_PCT: "200"}
    for name in ("a", "b", "c"):
        engine.add_node(
            node_info(
                {
                    "kind": "Node",
                    "metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name}},
                    "status": {"allocatable": allocatable},
                }
            )
        )

    def pod(name: str, cores: int, node: str | None = None) -> PodRequest:
        limits = {GPU: "1", CORES: str(cores), MEM_PCT: "10"}
        spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        return pod_request({"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": spec})[0]

    for node, used in (("a", 60), ("b", 60), ("c", 70)):
        for gpu in range(2):
            assert engine.schedule(pod(f"{node}-{gpu}", used, node)).scheduled
    refused = engine.schedule(pod("wants-half", 50))
    assert not refused.scheduled
    assert refused.reason == (
        "0/3 nodes are available: 1 GPU 0 has 30% compute free, the pod asks 50%, "
        "2 GPU 0 has 40% compute free, the pod asks 50%."
    )


def test_fragmentation_hook_counts_gpus_a_pod_strands(pm: KubegpuPluginManager) -> None:
    """A cpu-only pod that leaves the node too little cpu for any GPU pod of the mix strands every free GPU; a share
    that fills what a partly used GPU had left strands nothing."""
    state = build(pm, hami_node(2))
    place(pm, state, share_pod("a", main={GPU: 1, CORES: 70, MEM_PCT: 70}))
    state.workload.clear()
    state.workload.add((1, 300, 4000))  # the mix: shares of 30 % with 4 cores
    cpu_only = make_pod("batch", {"main": {"cpu": 6}})  # cores

    def strands(pod: PodRequest, cpu: int) -> float:
        grown = pm.call(
            "nvidia", "kubegpu_scheduler_fragmentation", state=state, pod=pod, prepared=None, free={"cpu": cpu}
        )
        return float(grown)

    assert strands(cpu_only, 8000) == pytest.approx(1.3)  # 2 cores left: the 30 % of GPU 0 and GPU 1 go unused
    assert strands(cpu_only, 16000) == pytest.approx(0.0)
    fills = share_pod("b", main={GPU: 1, CORES: 30, MEM_PCT: 30})
    grown = pm.call(
        "nvidia", "kubegpu_scheduler_fragmentation", state=state, pod=fills, prepared=nvidia.read_ask(fills),
        free={"cpu": 16000},
    )  # fmt: skip
    assert grown == pytest.approx(0.0)  # it fills GPU 0's 30 %, and GPU 1 stays whole
    allocation = pm.call("nvidia", "kubegpu_scheduler_allocate", state=state, pod=fills)
    assert allocation.containers["main"][GPU] == ["0"]


def test_the_mix_stays_bounded_whatever_shapes_pods_come_in() -> None:
    """Pods of ever new shapes (a tenant varying its cpu request) never grow the mix past its bound; the rarest
    kind makes room, and the probabilities still sum to 1."""
    workload = Workload(most=8)
    for _ in range(5):
        workload.add((1, 1000, 8000))
    for cpu in range(1, 1000):
        workload.add((1, 500, cpu))
    mix = workload.mix()
    assert len(mix) == 8
    assert (1, 1000, 8000) in {(n, milli, cpu) for n, milli, cpu, _ in mix}
    assert sum(p for *_, p in mix) == pytest.approx(1.0)
    assert len(workload.table().cpus) <= 8


def test_a_node_advertising_only_nvidia_gpu_takes_shares_from_its_gfd_books() -> None:
    """HAMi's device plugin lists `nvidia.com/gpu` (GPUs x the split) but not `gpucores`/`gpumem` in the node's
    capacity; the kubelet drops requests for extended resources its node does not list before its own fit check
    (1.20's `removeMissingExtendedResources`), so such a node runs shares: the per-GPU books come from GFD's labels."""
    engine = Engine(build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "16384"}
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "20"}
    engine.add_node(
        node_info({"kind": "Node", "metadata": {"name": "n", "labels": labels}, "status": {"allocatable": allocatable}})
    )

    def pod(name: str, cores: int, mib: int) -> PodRequest:
        limits = {GPU: "1", CORES: str(cores), MEM: str(mib)}
        container = {"name": "main", "resources": {"limits": limits}}
        return pod_request(
            {"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": {"containers": [container]}}
        )[0]

    placed = [engine.schedule(pod(f"p{i}", 60, 8192)) for i in range(2)]
    assert all(p.scheduled for p in placed), [p.reason for p in placed]
    shares = [p.allocation.shares["main"] for p in placed if p.allocation is not None]
    assert sorted(gpu for s in shares for gpu in s[CORES]) == ["0", "1"]
    assert all(s[CORES] == {g: 60} and s[MEM] == {g: 8192} for s in shares for g in s[CORES])
    refused = engine.schedule(pod("third", 50, 1024))
    assert not refused.scheduled
    assert "has 40% compute free, the pod asks 50%" in refused.reason


def test_a_gpu_gone_unhealthy_leaves_the_others_their_full_split() -> None:
    """An advertised node of 4 GPUs split 10 ways whose GPU 3 went unhealthy offers 30 share slots (kubegpu's
    advertiser and HAMi's device plugin alike count the healthy GPUs' slots): the split read as 30 // 4 = 7 left the
    three healthy GPUs 7 shares each, 21 pods where the kubelet admits 30."""
    engine = Engine(build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    gpus = [DeviceInfo(id=str(i), model="Tesla V100-SXM2-16GB", memory=16 << 30, healthy=i != 3) for i in range(4)]
    node = make_node("n", allocatable={GPU: 30, CORES: 300, MEM_PCT: 300, "pods": 110}, cpu="64")
    engine.add_node(dataclasses.replace(node, inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=gpus)}))
    placed = 0
    while engine.schedule(share_pod(f"p{placed}", main={GPU: 1, CORES: 5, MEM_PCT: 5})).scheduled:
        placed += 1
    assert placed == 30
    # A node that offers no shares stays whole, whatever its device plugin counts that kubegpu finds unhealthy.
    whole = make_node("w", allocatable={GPU: 8})
    gpus = [DeviceInfo(id=str(i), healthy=i < 4) for i in range(8)]
    state = engine.plugins.call(
        "nvidia",
        "kubegpu_scheduler_build_node",
        node=dataclasses.replace(whole, inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=gpus)}),
        shared={},
    )
    assert state.split == 1


def test_the_mix_counts_a_share_by_the_tighter_of_compute_and_memory() -> None:
    """A share of 10 % compute without a memory request takes all of its GPU's memory (HAMi's rule): the mix the
    fgd policy measures against counts it as the whole GPU it holds, not as a tenth of one; a share of 20 % compute
    and 60 % memory as 60 %."""
    pm = build_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    state = build(pm, hami_node(2))
    place(pm, state, share_pod("a", main={GPU: 1, CORES: 10}))
    place(pm, state, share_pod("b", main={GPU: 1, CORES: 20, MEM_PCT: 60}))
    assert sorted((n, milli) for n, milli, _, _ in state.workload.mix()) == [(1, 600), (1, 1000)]


@settings(max_examples=300, deadline=None)
@given(
    free=st.lists(st.integers(0, 1000), min_size=1, max_size=8),
    cpu=st.integers(0, 20000),
    taken=st.integers(0, 1000),
    mix=st.lists(
        st.tuples(st.integers(1, 8), st.integers(1, 1000), st.sampled_from([0, 4000, 8000, 12000])),
        min_size=1,
        max_size=40,
    ),
    data=st.data(),
)
def test_nodes_that_strand_alike_measure_equal_to_the_last_bit(
    free: list[int], cpu: int, taken: int, mix: list[Kind], data: st.DataObject
) -> None:
    """The engine ranks nodes by whole points of 100 x sigmoid(-growth), so a growth of exactly 0 (50 points) must
    not come out as a hair above or below it by the order a float sum took: two nodes whose GPUs are free alike in
    another order measure the same, and taking the same share of the same GPU from either grows it the same."""
    workload = Workload()
    for kind in mix:
        workload.add(kind)
    table = workload.table()
    order = data.draw(st.permutations(range(len(free))))
    other = [free[i] for i in order]
    assert node_fragmentation(free, table, cpu) == node_fragmentation(other, table, cpu)
    amount = min(taken, free[order[0]])
    grown = fragmentation_delta(free, {order[0]: amount}, table, cpu, 1000)
    assert grown == fragmentation_delta(other, {0: amount}, table, cpu, 1000)
    assert fragmentation_delta(free, {}, table, ANY_CPU, 1000) == 0.0


def test_the_mix_stays_bounded_whatever_gpu_models_pods_name() -> None:
    """A tenant's pods naming ever new GPU models in their node affinity (`In` values the nodes may never carry)
    are each a new kind; the mix keeps its bound, the rarest kind makes room, and a node's table holds only kinds
    kept."""
    workload = Workload(most=8)
    for _ in range(5):
        workload.add((1, 1000, 8000))
    for i in range(2000):
        workload.add((1, 500, 4000, frozenset({"tesla-t4", f"made-up-{i}"})))
    assert len(workload.kinds()) == 8
    assert (1, 1000, 8000, None) in {kind[:4] for kind in workload.kinds()}
    assert len(workload.table(frozenset({"tesla-t4"})).kinds) <= 8
