"""Benchmark: placement quality of kubegpu against naive first-fit, on Neuron rings and tori.

Both place the same pods in arrival order on the same nodes (trn1.32xlarge 4x4 tori and inf2.48xlarge / inf2.24xlarge
rings); no pod leaves. First-fit takes the first node, in node order, with a valid free device set of the requested
size, and the lowest such set; kubegpu is the real engine with the neuron plugin (binpack policy). For each workload
it prints pods placed and stranded devices (free devices outside the largest request their node could still take)
for both, side by side:

* `issue-example`: one trn1 and one inf2, pods of 4, 8, 1, 3, 2 and 4 devices;
* `random-N`: sizes drawn uniformly from every size some node takes;
* `fragmenting-N`: torus-and-ring sizes (4, 8) and ring-only sizes (2, 3, 5, 6) interleaved on rings listed before
  tori, the mix where a greedy choice of node spends ring capacity on sizes a torus would take.

    .venv/bin/python benchmarks/placement_bench.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.neuron import topology as topo
from kubegpu.scheduler.engine import Engine

RESOURCE = neuron.NEURON
SHAPES = {"trn1.32xlarge": 16, "inf2.48xlarge": 12, "inf2.24xlarge": 6}


@dataclass(frozen=True)
class Result:
    placed: int
    stranded: int


def node_document(name: str, kind: str) -> dict[str, object]:
    devices = SHAPES[kind]
    allocatable = {
        "cpu": "192",
        "memory": "1Ti",
        "pods": "250",
        neuron.NEURON: str(devices),
        neuron.NEURONDEVICE: str(devices),
    }
    labels = {"node.kubernetes.io/instance-type": kind}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def pod_document(name: str, size: int) -> dict[str, object]:
    container = {"name": "main", "resources": {"limits": {RESOURCE: str(size)}}}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "bench"}, "spec": {"containers": [container]}}


def topology_of(kind: str) -> topo.Topology:
    shape = topo.CATALOG[kind]
    return topo.make_topology(shape.kind, shape.devices, shape.rows, shape.columns)


def first_fit(nodes: list[tuple[str, str]], sizes: list[int]) -> Result:
    free = {name: (1 << SHAPES[kind]) - 1 for name, kind in nodes}
    shapes = {name: topology_of(kind) for name, kind in nodes}
    placed = 0
    for size in sizes:
        for name, _ in nodes:
            block = next((b for b in topo.valid_sets(shapes[name], size) if free[name] & b == b), None)
            if block is not None:
                free[name] &= ~block
                placed += 1
                break
    stranded = sum(free[n].bit_count() - topo.largest_device_set(shapes[n], free[n]) for n, _ in nodes)
    return Result(placed, stranded)


def kubegpu(nodes: list[tuple[str, str]], sizes: list[int]) -> Result:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False))
    for name, kind in nodes:
        engine.add_node(node_info(node_document(name, kind)))
    placed = sum(engine.schedule(pod_request(pod_document(f"p{i}", s))[0]).scheduled for i, s in enumerate(sizes))
    stranded = sum(o.free - o.largest_fit for name in engine.node_names() for o in engine.describe(name))
    return Result(placed, stranded)


def workloads(seeds: int) -> list[tuple[str, list[tuple[str, str]], list[int]]]:
    found = [("issue-example", [("trn1-0", "trn1.32xlarge"), ("inf2-0", "inf2.48xlarge")], [4, 8, 1, 3, 2, 4])]
    for seed in range(seeds):
        rng = random.Random(seed)
        kinds = [rng.choice(list(SHAPES)) for _ in range(rng.randint(2, 6))]
        nodes = [(f"{kind.split('.')[0]}-{i}", kind) for i, kind in enumerate(kinds)]
        capacity = sum(SHAPES[k] for k in kinds)
        sizes: list[int] = []
        while sum(sizes) < capacity * 1.3:
            sizes.append(rng.choice([1, 2, 3, 4, 5, 6, 8, 12, 16]))
        found.append((f"random-{seed}", nodes, sizes))
    for seed in range(seeds):
        rng = random.Random(1000 + seed)
        count = rng.randint(1, 3)
        nodes = [(f"inf2-{i}", "inf2.48xlarge") for i in range(count)]  # rings listed first: first-fit fills them
        nodes += [(f"trn1-{i}", "trn1.32xlarge") for i in range(count)]
        capacity = 28 * count
        sizes = []
        while sum(sizes) < capacity:
            sizes.append(rng.choice([4, 8]) if rng.random() < 0.55 else rng.choice([2, 3, 5, 6]))
        found.append((f"fragmenting-{seed}", nodes, sizes))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    print(
        f"{'workload':16} {'pods':>5} {'first-fit placed':>17} {'kubegpu placed':>15} "
        f"{'ff stranded':>12} {'kg stranded':>12}"
    )
    totals = [0, 0, 0, 0, 0]
    for name, nodes, sizes in workloads(args.seeds):
        ff, kg = first_fit(nodes, sizes), kubegpu(nodes, sizes)
        mark = "" if kg.placed >= ff.placed else "  <-- fewer than first-fit"
        print(f"{name:16} {len(sizes):5} {ff.placed:17} {kg.placed:15} {ff.stranded:12} {kg.stranded:12}{mark}")
        for i, value in enumerate((len(sizes), ff.placed, kg.placed, ff.stranded, kg.stranded)):
            totals[i] += value
    print(f"{'total':16} {totals[0]:5} {totals[1]:17} {totals[2]:15} {totals[3]:12} {totals[4]:12}")
    print(f"kubegpu / first-fit pods placed: {totals[2] / totals[1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
