"""KubegpuFragmentation's `modelAccess`: the mix learned keeps the GPU models each kind of pod may use, and counts the
free GPU capacity a kind cannot reach at all, as the FGD paper's "no access": all the free GPUs of a node whose GPU
model the kind may not use. A pod that could go anywhere then keeps off what only a narrower pod can use. Off by
default (docs/benchmarks.md: it cost about a point of capacity on the generated traces whose GPU pods name models).
Small generated clusters of shared GPU nodes (HAMi's accounting: `nvidia.com/gpu` = GPUs x 10), scored by the shipped
profile with `modelAccess` on, and by the default profile where a test says so."""

from __future__ import annotations

import dataclasses

import pytest

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia import sharing
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine

PRODUCT = "nvidia.com/gpu.product"


def shared_node(name: str, gpus: int, model: str, cpu: int = 32, memory_gi: int = 128) -> dict[str, object]:
    allocatable = {"cpu": str(cpu), "memory": f"{memory_gi}Gi", "pods": "110", "nvidia.com/gpu": str(gpus * 10)}
    labels = {"nvidia.com/gpu.count": str(gpus), PRODUCT: model}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def gpu_pod(
    name: str, gpus: int = 1, cpu: int = 4, memory_gi: int = 8, models: tuple[str, ...] = (), node: str | None = None
) -> PodRequest:
    requests = {"cpu": str(cpu), "memory": f"{memory_gi}Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, object] = {"containers": [{"name": "main", "resources": {"requests": requests}}]}
    if node:
        spec["nodeName"] = node
    if models:
        term = {"matchExpressions": [{"key": PRODUCT, "operator": "In", "values": list(models)}]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return pod_request({"kind": "Pod", "metadata": {"name": name, "namespace": "team"}, "spec": spec})[0]


def cluster(*nodes: dict[str, object], model_access: bool = True) -> Engine:
    profile = dataclasses.replace(scores.Profile.default(), fragmentation_model_access=model_access)
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), scoring=profile)
    for node in nodes:
        engine.add_node(node_info(node))
    return engine


def share_pod(name: str, percent: int, node: str | None = None) -> PodRequest:
    """A share of one GPU of any model: `percent` of its compute and of its memory."""
    asked = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": str(percent), "nvidia.com/gpumem-percentage": str(percent)}
    spec: dict[str, object] = {
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "4", "memory": "8Gi", **asked}}}]
    }
    if node:
        spec["nodeName"] = node
    return pod_request({"kind": "Pod", "metadata": {"name": name, "namespace": "team"}, "spec": spec})[0]


@pytest.mark.parametrize(("model_access", "expected"), [(False, "v100"), (True, "t4")], ids=["default", "modelAccess"])
def test_a_share_free_to_go_anywhere_packs_by_default_and_keeps_off_the_model_others_need_with_model_access(
    model_access: bool, expected: str
) -> None:
    """The cluster has seen a pod that runs only on V100s (one whole GPU), and a V100 is half used by a share. A 30 %
    share that runs on any GPU:
    - by default the mix learned keeps no model, and the share packs onto the half-used V100, which strands the
      least (the V100-only kind cannot use a partly used GPU either way);
    - with `modelAccess` the T4 node's free GPUs count as lost to the V100-only kind, so taking them strands
      nothing more, and the share keeps off the V100 that the V100-only kind may still want."""
    engine = cluster(shared_node("v100", 2, "Tesla-V100"), shared_node("t4", 2, "Tesla-T4"), model_access=model_access)
    assert engine.schedule(gpu_pod("train-0", models=("Tesla-V100",))).node == "v100"
    state = engine.nodes["v100"].states["nvidia"]
    assert isinstance(state, nvidia.NvidiaNodeState)
    learned = [kind[3] for kind in state.workload.kinds()]
    assert learned == ([frozenset({"tesla-v100"})] if model_access else [None])
    assert engine.schedule(share_pod("half", 50, node="v100")).node == "v100"
    assert engine.schedule(share_pod("notebook", 30)).node == expected


def test_the_mix_keeps_the_models_each_kind_may_use() -> None:
    """The kinds the measure weighs carry the GPU models the pod's node affinity allows; a node of another model
    counts all its free GPUs as lost to them."""
    engine = cluster(shared_node("v100", 2, "Tesla-V100"))
    assert engine.schedule(gpu_pod("train", models=("Tesla-V100", "Tesla-V100S"), memory_gi=16)).scheduled
    state = engine.nodes["v100"].states["nvidia"]
    assert isinstance(state, nvidia.NvidiaNodeState)
    assert state.workload.kinds() == [(1, 1000, 4000, frozenset({"tesla-v100", "tesla-v100s"}), 1.0)]
    free = [1000, 1000]
    assert sharing.node_fragmentation(free, state.workload.table(frozenset({"tesla-t4"}))) == 2000  # no access
    assert sharing.node_fragmentation(free, state.fragmentation_table()) == 0


def test_a_kind_keeps_a_bounded_set_of_gpu_models_whatever_a_pod_names() -> None:
    """A tenant's pod naming 50,000 made-up GPU models beside the real one (valid label values, an `In` list about
    as long as the API server takes) is placed and deleted, again and again: each is a kind of the mix, kept after the
    pod went, so the mix must not keep what the pod wrote. Before, each such kind kept its 50,000 names (about 6 MiB;
    at the mix's bound of 1,024 kinds, some 6 GiB). A kind keeps at most `MAX_KIND_MODELS` names; a pod allowing
    more is weighed as one that may use any GPU model (the measure only weighs scores)."""
    engine = cluster(shared_node("v100", 2, "Tesla-V100"))
    fakes = tuple(f"made-up-model-number-{i:07d}" for i in range(50_000))
    for j in range(3):
        pod = gpu_pod(f"p{j}", models=("Tesla-V100", *fakes[j:]))
        assert engine.schedule(pod).node == "v100"
        engine.release(pod.key)
    assert engine.schedule(gpu_pod("few", models=("Tesla-V100", "Tesla-T4"))).node == "v100"
    workload = engine._shared["nvidia"][nvidia.WORKLOAD_KEY]
    kept = [kind[3] for kind in workload.counts]
    names = sum(len(models) for models in kept if models is not None)
    assert names <= 3 * sharing.MAX_KIND_MODELS, f"the mix keeps {names} GPU model names of 4 pods' kinds"
    assert frozenset({"tesla-v100", "tesla-t4"}) in kept  # a pod naming a few models keeps them all
