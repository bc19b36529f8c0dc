"""Benchmark: pods with one DRA claim each on 500 nodes in `kubegpu simulate`, beside the same pods asking for the
same devices as an extended resource, side by side in one run.

The cluster: `--nodes` trn1.32xlarge nodes (16 Neuron devices on a 4x4 torus), published twice: as the Neuron
plugin's extended resource (`aws.amazon.com/neurondevice`) and as one ResourceSlice per node of the
`neuron.kubegpu.io` driver. The workload: `--pods` pods, each with one claim made from a ResourceClaimTemplate asking
for one device of a DeviceClass with a CEL selector (and a request selector on the model), so DynamicResources'
PreFilter, Filter (the allocator with its CEL selectors and the torus rule) and Reserve all run; and as many pods
asking for `aws.amazon.com/neurondevice: 1`. Both go through the simulator's own engine loop (`_process`: the queue
order, the cycle, the Reserve), documents decoded beforehand as the simulator does before it starts its clock.

It prints pods/s of each, the DRA pods' p50/p99 cycle, their ratio, and the goal: at least 800 pods/s with one claim
each on 500 nodes (kube-scheduler's own DRA benchmarks floor at 40-70 pods/s there).

    .venv/bin/python benchmarks/dra_bench.py [--nodes 500] [--pods 4000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.simulate import OBJECT_KINDS, Cluster, PodEvent, _process
from kubegpu.scheduler.testing import claim_pod, claim_spec, device_class, exactly, neuron_slice, template

GOAL_PODS_PER_SECOND = 800


def node(name: str) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": "trn1.32xlarge"}},
        "status": {
            "allocatable": {"cpu": "128", "memory": "512Gi", "pods": "250", "aws.amazon.com/neurondevice": "16"}
        },
    }


def documents(nodes: int, pods: int, dra: bool) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = [node(f"trn-{i:04d}") for i in range(nodes)]
    if dra:
        found.append(device_class("neuron", 'device.driver == "neuron.kubegpu.io"'))
        model = 'device.attributes["neuron.kubegpu.io"].model == "trainium"'
        found.append(template("one-device", claim_spec(exactly("device", "neuron", 1, model))))
        found += [neuron_slice(f"trn-{i:04d}", 16, topology="torus", rows=4, columns=4) for i in range(nodes)]
        found += [claim_pod(f"pod-{i:05d}", templates={"neuron": "one-device"}) for i in range(pods)]
    else:
        found += [
            {
                "kind": "Pod",
                "metadata": {"name": f"pod-{i:05d}", "namespace": "default"},
                "spec": {
                    "containers": [{"name": "main", "resources": {"limits": {"aws.amazon.com/neurondevice": "1"}}}]
                },
            }
            for i in range(pods)
        ]
    return found


def run(nodes: int, pods: int, dra: bool) -> tuple[float, list[float], int]:
    """(pods/s, per-pod cycle seconds, pods scheduled) of one simulation."""
    engine = Engine(make_plugin_manager("scheduler"))
    events: list[PodEvent] = []
    objects: list[tuple[str, str, dict[str, Any]]] = []
    infos = []
    for number, document in enumerate(documents(nodes, pods, dra)):
        kind = document["kind"]
        if kind == "Node":
            infos.append(node_info(document))
        elif kind == "Pod":
            events.append(PodEvent(f"#{number}", pod_request(document)[0], False))
        else:
            OBJECT_KINDS[kind](document)
            objects.append((kind, f"#{number}", document))
    started = time.perf_counter()
    for info in infos:
        engine.add_node(info)
    cluster = Cluster.load(engine, objects)
    latencies: list[float] = []
    scheduled = sum(1 for event in _process(engine, events, latencies, cluster) if event["event"] == "scheduled")
    return pods / (time.perf_counter() - started), latencies, scheduled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    dra_rates, plain_rates, cycles = [], [], []
    for _ in range(args.rounds):
        rate, latencies, scheduled = run(args.nodes, args.pods, dra=True)
        dra_rates.append(rate)
        cycles += latencies
        plain, _, plain_scheduled = run(args.nodes, args.pods, dra=False)
        plain_rates.append(plain)
        if scheduled != plain_scheduled:
            print(f"warning: DRA scheduled {scheduled} pods, extended resources {plain_scheduled}")
    dra_rate, plain_rate = statistics.median(dra_rates), statistics.median(plain_rates)
    cycles.sort()
    print(f"{args.nodes} nodes, {args.pods} pods, {args.rounds} rounds (medians), {scheduled} scheduled per round")
    print(f"  one DRA claim each:               {dra_rate:8.0f} pods/s")
    print(f"  one extended-resource device each: {plain_rate:8.0f} pods/s")
    print(f"  ratio DRA / extended resource:    {dra_rate / plain_rate:8.2f}")
    print(
        f"  DRA cycle p50 {1000 * cycles[len(cycles) // 2]:.3f} ms, p99 {1000 * cycles[int(0.99 * len(cycles))]:.3f} ms"
    )
    verdict = "met" if dra_rate >= GOAL_PODS_PER_SECOND else "NOT met"
    print(f"  goal: at least {GOAL_PODS_PER_SECOND} pods/s with one claim each: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
