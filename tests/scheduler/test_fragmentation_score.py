"""KubegpuFragmentation: the engine asks the device plugins how much of a node's free devices a pod would strand,
for every pod (a cpu-only one included), and keeps pods off the capacity they would strand. The mix of pods the
nvidia plugin measures against is learned per engine."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.intel_gas import scheduler as intel
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine


def gpu_node(name: str, gpus: int, cpu: int, memory_gi: int) -> dict[str, object]:
    allocatable = {"cpu": str(cpu), "memory": f"{memory_gi}Gi", "pods": "110"}
    labels = {}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
        labels["nvidia.com/gpu.count"] = str(gpus)
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def pod(name: str, cpu: int, memory_gi: int, gpus: int = 0, node: str | None = None) -> dict[str, object]:
    requests = {"cpu": str(cpu), "memory": f"{memory_gi}Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, object] = {
        "containers": [{"name": "main", "resources": {"requests": requests, "limits": requests}}]
    }
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "team"}, "spec": spec}


def engine(profile: scores.Profile | None = None) -> Engine:
    built = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), scoring=profile)
    built.add_node(node_info(gpu_node("gpu-a", 4, 32, 128)))
    built.add_node(node_info(gpu_node("cpu-b", 0, 64, 256)))
    return built


def test_a_cpu_only_pod_keeps_off_the_cpu_that_free_gpus_need() -> None:
    """Binpack alone puts the cpu-only pod on the fuller GPU node, leaving its three free GPUs 4 cores: no GPU pod
    the cluster runs (8 cores each) could use them again. The fragmentation score sends it to the cpu node."""
    scheduler = engine()
    assert scheduler.schedule(pod_request(pod("trainer", 8, 32, gpus=1, node="gpu-a"))[0]).scheduled
    decision = scheduler.schedule(pod_request(pod("batch", 20, 80))[0])
    assert decision.node == "cpu-b"
    assert scheduler.schedule(pod_request(pod("trainer-2", 8, 32, gpus=1))[0]).node == "gpu-a"


def test_the_profile_weighs_the_fragmentation_score() -> None:
    """Weighed 0 by the profile, the score is off and binpack decides alone."""
    default = scores.Profile.default("binpack")
    scheduler = engine(scores.Profile({**default.weights, scores.FRAGMENTATION: 0}))
    assert scheduler.schedule(pod_request(pod("trainer", 8, 32, gpus=1, node="gpu-a"))[0]).scheduled
    assert scheduler.schedule(pod_request(pod("batch", 20, 80))[0]).node == "gpu-a"


def test_each_engine_learns_its_own_mix_of_pods() -> None:
    """Two engines in one process: the pods one places are not in the other's mix."""
    first, second = engine(), engine()
    assert first.schedule(pod_request(pod("trainer", 8, 32, gpus=1, node="gpu-a"))[0]).scheduled
    first_state = first.nodes["gpu-a"].states["nvidia"]
    second_state = second.nodes["gpu-a"].states["nvidia"]
    assert isinstance(first_state, nvidia.NvidiaNodeState) and isinstance(second_state, nvidia.NvidiaNodeState)
    assert first_state.workload.mix() == [(1, 1000, 8000, 1.0)]
    assert second_state.workload.mix() == []
    # the engine's other nodes share the first engine's mix, and a rebuilt node keeps it
    first.add_node(node_info(gpu_node("gpu-c", 2, 16, 64)))
    assert first.nodes["gpu-c"].states["nvidia"].workload is first_state.workload  # type: ignore[attr-defined]
    assert second.schedule(pod_request(pod("batch", 20, 80))[0]).node == "gpu-a"  # nothing learned: binpack


@pytest.mark.parametrize("percentage", [0, 50, 100])
def test_fragmentation_ranks_as_many_nodes_as_the_profile_asks_kube_scheduler_to_score(percentage: int) -> None:
    """The fragmentation score may prefer a node late in the policy's capacity order. With `percentageOfNodesToScore`
    set, a cycle scores as many feasible nodes as kube-scheduler would (all of a cluster under 100 nodes): the
    cpu-only pod finds the cpu node behind twelve GPU nodes whose free GPUs its cores would strand. Unset, the
    policy's first few are ranked (the engine's speed on large clusters), and the pod stays on a GPU node."""
    profile = dataclasses.replace(scores.Profile.default(), percentage_of_nodes_to_score=percentage)
    pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    scheduler = Engine(pm, scoring=profile)
    for i in range(12):
        scheduler.add_node(node_info(gpu_node(f"gpu-{i:02}", 4, 32, 128)))
        assert scheduler.schedule(pod_request(pod(f"trainer-{i}", 8, 32, gpus=1, node=f"gpu-{i:02}"))[0]).scheduled
    scheduler.add_node(node_info(gpu_node("cpu-z", 0, 64, 256)))
    chosen = scheduler.schedule(pod_request(pod("batch", 20, 80))[0]).node
    assert (chosen == "cpu-z") is (percentage > 0)


@pytest.mark.parametrize("split", [1, 10], ids=["whole-gpus", "shared-gpus"])
def test_with_the_profile_unset_a_pod_that_may_reach_shared_gpus_has_kube_schedulers_count_of_nodes_ranked(
    split: int,
) -> None:
    """With `percentageOfNodesToScore` unset, the policy's first few feasible nodes are ranked, except for a pod that
    may reach a node whose GPUs are shared (HAMi's accounting: `nvidia.com/gpu` = GPUs x the split count): there the
    fragmentation score decides most, and kube-scheduler's count is ranked. The cpu-only pod finds the cpu node
    behind twelve GPU nodes whose free GPUs its cores would strand only where the GPUs are shared."""
    pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    scheduler = Engine(pm, scoring=scores.Profile.default())
    for i in range(12):
        document = gpu_node(f"gpu-{i:02}", 4, 32, 128)
        document["status"]["allocatable"]["nvidia.com/gpu"] = str(4 * split)  # type: ignore[index]
        scheduler.add_node(node_info(document))
        assert scheduler.schedule(pod_request(pod(f"trainer-{i}", 8, 32, gpus=1, node=f"gpu-{i:02}"))[0]).scheduled
    scheduler.add_node(node_info(gpu_node("cpu-z", 0, 64, 256)))
    chosen = scheduler.schedule(pod_request(pod("batch", 20, 80))[0]).node
    assert (chosen == "cpu-z") is (split > 1)


def test_a_node_is_scored_again_when_the_learned_mix_moves_on() -> None:
    """The fragmentation answers of nodes nothing changed on are remembered only while the mix of pods they were
    measured against holds (`kubegpu_scheduler_fragmentation_epoch`): once the cluster mostly runs 24-core GPU pods,
    a 10-core cpu-only pod no longer goes where it would leave 22 cores beside four free GPUs."""
    scheduler = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    scheduler.add_node(node_info(gpu_node("gpu-a", 4, 32, 128)))
    scheduler.add_node(node_info(gpu_node("gpu-b", 4, 16, 128)))
    scheduler.add_node(node_info(gpu_node("gpu-c", 80, 10 * 8 + 70 * 24, 1024)))
    for i in range(10):
        assert scheduler.schedule(pod_request(pod(f"small-{i}", 8, 8, gpus=1, node="gpu-c"))[0]).scheduled
    batch = pod_request(pod("batch", 10, 8))[0]
    assert scheduler.decide(batch).node != "gpu-b"  # 8-core GPU pods still fit beside it on gpu-a
    epochs = scheduler.fragmentation_epochs()
    for i in range(70):  # the mix moves on every 64 pods
        assert scheduler.schedule(pod_request(pod(f"big-{i}", 24, 8, gpus=1, node="gpu-c"))[0]).scheduled
    assert scheduler.fragmentation_epochs() != epochs
    assert scheduler.decide(batch).node == "gpu-b"  # on gpu-a it would strand four GPUs for the 24-core pods


def test_the_nvidia_epoch_moves_with_its_learned_mix() -> None:
    """The nvidia plugin's epoch is its engine's mix version: the first pod moves it at once."""
    pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    shared: dict[str, object] = {}
    assert pm.call("nvidia", "kubegpu_scheduler_fragmentation_epoch", shared=shared) is None
    state = pm.call("nvidia", "kubegpu_scheduler_build_node", node=node_info(gpu_node("g", 2, 8, 8)), shared=shared)
    before = pm.call("nvidia", "kubegpu_scheduler_fragmentation_epoch", shared=shared)
    state.workload.add((1, 1000, 4000))
    assert pm.call("nvidia", "kubegpu_scheduler_fragmentation_epoch", shared=shared) != before


def share_node(name: str = "gpu-s") -> dict[str, object]:
    allocatable = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "20"}
    allocatable |= {"nvidia.com/gpucores": "200", "nvidia.com/gpumem-percentage": "200"}
    labels = {"nvidia.com/gpu.count": "2"}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def share(name: str, percent: int) -> dict[str, object]:
    limits = {"cpu": "1", "nvidia.com/gpu": "1", "nvidia.com/gpucores": str(percent)}
    limits["nvidia.com/gpumem-percentage"] = str(percent)
    spec = {"containers": [{"name": "main", "resources": {"limits": limits, "requests": limits}}]}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "team"}, "spec": spec}


HALVES = ((1, 500, 1000, 1.0),)  # the cluster runs half-GPU pods


@pytest.mark.parametrize(("policy", "gpu"), [("bestfit", "0"), ("fgd", "1"), (None, "1")])
def test_the_profile_chooses_how_shares_are_packed(policy: str | None, gpu: str) -> None:
    """KubegpuDevices' `sharePolicy`, per profile: with half a GPU 0 taken and half-GPU pods to come, bestfit puts a
    30 % share beside it (GPU 0 the fullest), fgd (the default) on GPU 1, which keeps a half free on both."""
    profile = dataclasses.replace(scores.Profile.default(), share_policy=policy, fragmentation_mix=HALVES)
    scheduler = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), scoring=profile)
    scheduler.add_node(node_info(share_node()))
    first = scheduler.schedule(pod_request(share("first", 50))[0])
    assert first.allocation is not None and first.allocation.containers["main"]["nvidia.com/gpu"] == ["0"]
    decision = scheduler.schedule(pod_request(share("second", 30))[0])
    assert decision.allocation is not None and decision.allocation.containers["main"]["nvidia.com/gpu"] == [gpu]


def test_a_configured_mix_is_measured_against_before_any_pod_and_never_moves() -> None:
    """KubegpuFragmentation's `mix` from the profile: the cpu-only pod keeps off the GPU node's cpu from the first
    pod on (nothing learned yet), and the pods placed do not change what is expected."""
    profile = dataclasses.replace(scores.Profile.default(), fragmentation_mix=((1, 1000, 8000, 1.0),))
    scheduler = engine(profile)
    epochs = scheduler.fragmentation_epochs()
    assert scheduler.schedule(pod_request(pod("batch", 26, 80))[0]).node == "cpu-b"
    assert scheduler.schedule(pod_request(pod("trainer", 30, 32, gpus=3, node="gpu-a"))[0]).scheduled
    assert scheduler.fragmentation_epochs() == epochs


def test_only_pods_that_may_reach_a_fragmenting_node_score_more_nodes_for_it() -> None:
    """KubegpuFragmentation can reorder a pod's nodes only among nodes whose plugins measure fragmentation: an Intel
    GPU pod on a cluster whose Intel nodes have no NVIDIA GPUs is still scored on the policy's first few, a cpu-only
    or NVIDIA pod on kube-scheduler's count."""
    pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia), ("intel-gas", intel)], autoload=False)
    scheduler = Engine(pm, scoring=dataclasses.replace(scores.Profile.default(), percentage_of_nodes_to_score=100))
    scheduler.add_node(node_info(gpu_node("gpu-a", 4, 32, 128)))
    intel_node = gpu_node("intel-b", 0, 64, 256)
    intel_node["metadata"]["labels"]["gpu.intel.com/cards"] = "card0.card1"  # type: ignore[index]
    intel_node["status"]["allocatable"] |= {"gpu.intel.com/i915": "8", "gpu.intel.com/memory.max": "16G"}  # type: ignore[index]
    scheduler.add_node(node_info(intel_node))
    assert scheduler.device_state("intel-b", "intel-gas") is not None
    intel_pod = pod("i", 1, 1)
    intel_pod["spec"]["containers"][0]["resources"]["requests"]["gpu.intel.com/i915"] = "1"  # type: ignore[index]
    asked = {
        "cpu-only": pod_request(pod("c", 1, 1))[0],
        "nvidia": pod_request(pod("g", 1, 1, gpus=1))[0],
        "intel": pod_request(intel_pod)[0],
    }
    matters = {name: scheduler.fragmentation_matters(p, scheduler.plan(p)) for name, p in asked.items()}
    assert matters == {"cpu-only": True, "nvidia": True, "intel": False}
    scheduler.remove_node("gpu-a")
    assert not scheduler.fragmentation_matters(asked["cpu-only"], scheduler.plan(asked["cpu-only"]))


def neuron_node(name: str, gpus: int = 0) -> dict[str, object]:
    """A trn1 node (16 Neuron devices), with `gpus` NVIDIA GPUs too."""
    document = gpu_node(name, gpus, 96, 768)
    document["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "trn1.32xlarge"  # type: ignore[index]
    document["status"]["allocatable"]["aws.amazon.com/neurondevice"] = "16"  # type: ignore[index]
    return document


def neuron_pod(name: str) -> dict[str, object]:
    document = pod(name, 1, 1)
    document["spec"]["containers"][0]["resources"]["limits"] = {"aws.amazon.com/neurondevice": "1"}  # type: ignore[index]
    return document


def epochs_asked(scheduler: Engine) -> list[str]:
    """The plugins whose `kubegpu_scheduler_fragmentation_epoch` the engine asks from now on, in order."""
    asked: list[str] = []
    call = scheduler.plugins.call

    def spy(plugin: str, hook: str, **kwargs: object) -> object:
        if hook == "kubegpu_scheduler_fragmentation_epoch":
            asked.append(plugin)
        return call(plugin, hook, **kwargs)

    scheduler.plugins.call = spy  # type: ignore[method-assign]
    return asked


def test_a_cycle_asks_the_epochs_of_the_plugins_beside_the_nodes_the_pod_may_reach() -> None:
    """A Neuron pod is ranked only on nodes holding a Neuron state: its cycle asks the Neuron mix's epoch, not the
    NVIDIA one of GPU nodes it cannot reach, until a node holds both; a cpu-only pod may go anywhere and asks both."""
    pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia), ("neuron", neuron)], autoload=False)
    scheduler = Engine(pm)
    scheduler.add_node(node_info(gpu_node("gpu-a", 4, 32, 128)))
    scheduler.add_node(node_info(neuron_node("trn-b")))
    scheduler.add_node(node_info(neuron_node("trn-d")))  # two nodes to rank
    asked = epochs_asked(scheduler)
    assert scheduler.schedule(pod_request(neuron_pod("n-1"))[0]).node in ("trn-b", "trn-d")
    assert asked == ["neuron"]
    asked.clear()
    assert scheduler.schedule(pod_request(pod("c-1", 1, 1))[0]).scheduled
    assert sorted(asked) == ["neuron", "nvidia"]
    scheduler.add_node(node_info(neuron_node("both-c", gpus=4)))
    asked.clear()
    assert scheduler.schedule(pod_request(neuron_pod("n-2"))[0]).scheduled
    assert sorted(asked) == ["neuron", "nvidia"]
    scheduler.remove_node("both-c")
    asked.clear()
    assert scheduler.schedule(pod_request(neuron_pod("n-3"))[0]).scheduled
    assert asked == ["neuron"]


KINDS = {"gpu": lambda name: gpu_node(name, 4, 32, 128), "cpu": lambda name: gpu_node(name, 0, 32, 128)}
KINDS |= {"trn": neuron_node, "both": lambda name: neuron_node(name, gpus=4)}


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from([*sorted(KINDS), "remove"]), st.integers(0, 4)), max_size=25))
def test_the_epochs_a_cycle_asks_are_those_of_the_plugins_beside_its_first_one(steps: list[tuple[str, int]]) -> None:
    """The oracle of `_fragmenting_beside`, kept as nodes come, change and go: for each kind of pod, the epochs asked
    are those of the fragmenting plugins with a state on some node holding the pod's first device plugin's state
    (every node for a cpu-only pod), counted afresh from the nodes."""
    pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia), ("neuron", neuron)], autoload=False)
    scheduler = Engine(pm)
    for kind, i in steps:
        if kind == "remove":
            if f"n-{i}" in scheduler.nodes:
                scheduler.remove_node(f"n-{i}")
        else:
            scheduler.add_node(node_info(KINDS[kind](f"n-{i}")))
    for request in (pod_request(pod("c", 1, 1))[0], pod_request(pod("g", 1, 1, gpus=1))[0],
                    pod_request(neuron_pod("t"))[0]):  # fmt: skip
        plan = scheduler.plan(request)
        first = plan.devices[0][0] if plan.devices else None
        reached = [r.states for r in scheduler.nodes.values() if first is None or first in r.states]
        expected = tuple(
            pm.call(p, "kubegpu_scheduler_fragmentation_epoch", shared=scheduler._shared[p])
            if any(p in states for states in reached) else None
            for p in scheduler._fragmenters
        )  # fmt: skip
        assert scheduler.fragmentation_epochs(plan) == expected


@settings(max_examples=25, deadline=None)
@given(
    arrivals=st.lists(st.tuples(st.sampled_from(["cpu", "gpu", "gpu2", "trn", "trn4"]), st.booleans()), max_size=40),
    percentage=st.sampled_from([0, 100]),
)
def test_scores_remembered_under_the_reachable_epochs_place_as_a_fresh_engine(
    arrivals: list[tuple[str, bool]], percentage: int
) -> None:
    """The oracle of the memos keyed by the epochs a pod may reach (`LocalRaws`, its `by_number`): on GPU, Neuron
    and mixed nodes, with both learned mixes moving, every pod goes where an engine that forgot its memos before
    each cycle sends it (`forget_memos`); a departure every other pod."""

    def placements(forget: bool) -> list[str | None]:
        pm = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia), ("neuron", neuron)], autoload=False)
        profile = dataclasses.replace(scores.Profile.default(), percentage_of_nodes_to_score=percentage)
        scheduler = Engine(pm, scoring=profile)
        for i, kind in enumerate(["gpu", "gpu", "trn", "trn", "both", "cpu"]):
            scheduler.add_node(node_info(KINDS[kind](f"n-{i}")))
        placed: list[str | None] = []
        for i, (kind, leaves) in enumerate(arrivals):
            if kind.startswith("trn"):
                document = neuron_pod(f"p-{i}")
                document["spec"]["containers"][0]["resources"]["limits"] = {  # type: ignore[index]
                    "aws.amazon.com/neurondevice": "4" if kind == "trn4" else "1"
                }
            else:
                document = pod(f"p-{i}", 2, 2, gpus={"cpu": 0, "gpu": 1, "gpu2": 2}[kind])
            if forget:
                scheduler.forget_memos()
            decision = scheduler.schedule(pod_request(document)[0])
            placed.append(decision.node)
            if leaves and decision.scheduled and i % 2:
                scheduler.release(f"team/p-{i}")
        return placed

    assert placements(forget=False) == placements(forget=True)
