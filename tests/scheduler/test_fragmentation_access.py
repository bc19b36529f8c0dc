"""KubegpuFragmentation counts the free GPU capacity a kind of pod cannot reach at all, as the FGD paper's "no
access": all the free GPUs of a node whose GPU model the kind may not use. A pod that could go anywhere then keeps off
what only a narrower pod can use. Small generated clusters of shared GPU nodes (HAMi's
accounting: `nvidia.com/gpu` = GPUs x 10), scored by the shipped profile."""

from __future__ import annotations

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia import sharing
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


def cluster(*nodes: dict[str, object]) -> Engine:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for node in nodes:
        engine.add_node(node_info(node))
    return engine


def test_a_pod_without_a_model_constraint_leaves_the_model_a_constrained_pod_needs() -> None:
    """The cluster has seen pods that run only on V100s. A pod that runs on any GPU takes the T4 (binpack alone
    would take the fuller V100 node), so the next V100-only pod still finds its V100."""
    engine = cluster(shared_node("v100", 2, "Tesla-V100"), shared_node("t4", 2, "Tesla-T4"))
    assert engine.schedule(gpu_pod("train-0", models=("Tesla-V100",))).node == "v100"
    assert engine.schedule(gpu_pod("notebook")).node == "t4"
    assert engine.schedule(gpu_pod("train-1", models=("Tesla-V100",))).node == "v100"


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
