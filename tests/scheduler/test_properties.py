"""Property tests: random clusters and workloads with deletions, through the engine with the real plugins.

Whatever the sequence, (1) no device (or more than a card's share) is held by two live pods, (2) every allocation is
a valid topology set, and (3) a pod is refused only when no node could take it at that moment.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.intel_gas import scheduler as intel
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

NODE_KINDS = {
    "trn1": dict(labels={"node.kubernetes.io/instance-type": "trn1.32xlarge"}),
    "inf2": dict(labels={"node.kubernetes.io/instance-type": "inf2.24xlarge"}),
    "intel2": dict(
        labels={"gpu.intel.com/cards": "card0.card1"},
        allocatable={"gpu.intel.com/i915": "4", "gpu.intel.com/memory.max": "16G"},
    ),
    "p3": dict(
        labels={
            "node.kubernetes.io/instance-type": "p3.16xlarge",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
            "nvidia.com/gpu.memory": "16160",
        },
        allocatable={"nvidia.com/gpu": "8"},
    ),
}
SHAPES = [
    {"aws.amazon.com/neurondevice": 1},
    {"aws.amazon.com/neurondevice": 4},
    {"aws.amazon.com/neurondevice": 8},
    {"aws.amazon.com/neurondevice": 3},
    {"aws.amazon.com/neuron": 2},
    {"aws.amazon.com/neuroncore": 1},
    {"aws.amazon.com/neuroncore": 3},
    {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": "5G"},
    {"gpu.intel.com/i915": 2, "gpu.intel.com/memory.max": "6G"},
    {"nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 2},
    {"nvidia.com/gpu": 4},
]
TORUS_SETS = {1: 16, 4: 4, 8: 2, 16: 1}

operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, len(SHAPES) - 1), min_size=1, max_size=2)),
        st.tuples(st.just("delete"), st.integers(0, 1000)),
    ),
    min_size=1,
    max_size=40,
)


def check_invariants(engine: Engine) -> None:
    whole: dict[str, Counter[str]] = defaultdict(Counter)
    cores: dict[str, Counter[int]] = defaultdict(Counter)
    core_devices: dict[str, set[int]] = defaultdict(set)
    gpus: dict[str, Counter[str]] = defaultdict(Counter)
    card_use: dict[tuple[str, str, str], int] = Counter()
    for record in engine.pods.values():
        allocation = record.allocation
        if allocation is None:
            continue
        node = record.node
        kind = node.split("-")[0]
        per_device = int(allocation.plugins.get("neuron", {}).get("coresPerDevice", 1) or 1)
        for container, resources in allocation.containers.items():
            for resource, ids in resources.items():
                if resource in ("aws.amazon.com/neuron", "aws.amazon.com/neurondevice"):
                    numbers = sorted(int(i) for i in ids)
                    whole[node].update(ids)
                    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), f"not contiguous {ids}"
                    if kind == "trn1":
                        assert len(numbers) in TORUS_SETS and numbers[0] % len(numbers) == 0, f"bad torus set {ids}"
                elif resource == "aws.amazon.com/neuroncore":
                    numbers = sorted(int(i) for i in ids)
                    cores[node].update(numbers)
                    core_devices[node].update(n // per_device for n in numbers)
                    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), f"cores not contiguous {ids}"
                elif resource == "nvidia.com/gpu":
                    gpus[node].update(ids)
                elif resource.startswith("gpu.intel.com/"):
                    shares = allocation.shares[container][resource]
                    assert sorted(shares) == sorted(ids)
                    for card, amount in shares.items():
                        card_use[(node, card, resource)] += amount
    for node, counter in [*whole.items(), *gpus.items()]:
        assert all(n == 1 for n in counter.values()), f"{node}: a device held twice: {counter}"
    for node, counter in cores.items():
        assert all(n == 1 for n in counter.values()), f"{node}: a core held twice"
        assert not core_devices[node] & {int(d) for d in whole[node]}, f"{node}: cores on a device held whole"
    for (node, card, resource), used in card_use.items():
        allocatable = engine.nodes[node].info.allocatable[resource]
        assert used <= allocatable // 2, f"{node} {card} {resource}: {used} > per-card share"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(sorted(NODE_KINDS)), min_size=1, max_size=5),
    ops=operations,
    policy=st.sampled_from(["binpack", "spread"]),
)
def test_random_workloads_keep_the_ledger_sound(kinds: list[str], ops: list[tuple[str, object]], policy: str) -> None:
    pm = make_plugin_manager(
        "scheduler", plugins=[("neuron", neuron), ("intel-gas", intel), ("nvidia", nvidia)], autoload=False
    )
    engine = Engine(pm, policy=policy)  # type: ignore[arg-type]
    for i, kind in enumerate(kinds):
        engine.add_node(make_node(f"{kind}-{i}", **NODE_KINDS[kind]))  # type: ignore[arg-type]
    live: list[str] = []
    for serial, (op, arg) in enumerate(ops):
        if op == "delete":
            if live:
                key = live.pop(int(arg) % len(live))  # type: ignore[call-overload]
                assert engine.release(key) is not None
        else:
            containers = {f"c{j}": SHAPES[s] for j, s in enumerate(arg)}  # type: ignore[arg-type]
            pod: PodRequest = make_pod(f"p{serial}", containers)
            decision = engine.schedule(pod)
            if decision.scheduled:
                live.append(pod.key)
            else:
                feasible = [n for n in engine.nodes if engine.filter_node(n, pod).ok]
                assert not feasible, f"{pod.key} refused ({decision.reason}) but {feasible} could take it"
        check_invariants(engine)
    for key in list(live):
        engine.release(key)
    assert engine.pods == {}
    assert all(not r.pods and r.used["pods"] == 0 for r in engine.nodes.values())
