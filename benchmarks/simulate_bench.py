"""Benchmark: `kubegpu simulate --json` on 5000 nodes and 20000 pod documents (deletions mixed in).

Generates a mixed cluster (trn1.32xlarge, inf2.48xlarge, Intel 2- and 4-card nodes, 8-GPU NVIDIA p3/p4d nodes) and a
seeded workload, runs the simulator as a separate process, and prints the whole-process throughput (pods/s, start
to exit, parsing included), the engine's p50/p99 per-pod decision latency and peak memory, next to the goal.

    .venv/bin/python benchmarks/simulate_bench.py [--nodes 5000] [--pods 20000] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_PODS_PER_SECOND = 2000


def node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, object]:
    resources = {"cpu": "192", "memory": "1Ti", "pods": "250", **allocatable}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"allocatable": resources}}


def cluster(count: int) -> list[dict[str, object]]:
    nodes = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            nodes.append(
                node(
                    f"trn1-{i}",
                    {"node.kubernetes.io/instance-type": "trn1.32xlarge"},
                    {"aws.amazon.com/neurondevice": "16", "aws.amazon.com/neuroncore": "32"},
                )
            )
        elif kind == 1:
            nodes.append(
                node(
                    f"inf2-{i}",
                    {"node.kubernetes.io/instance-type": "inf2.48xlarge"},
                    {"aws.amazon.com/neuron": "12", "aws.amazon.com/neuroncore": "24"},
                )
            )
        elif kind == 2:
            cards = 2 if (i // 4) % 2 else 4
            nodes.append(
                node(
                    f"intel-{i}",
                    {"gpu.intel.com/cards": ".".join(f"card{c}" for c in range(cards))},
                    {"gpu.intel.com/i915": str(4 * cards), "gpu.intel.com/memory.max": f"{8 * cards}G"},
                )
            )
        else:
            p4d = (i // 4) % 2 == 0
            labels = {
                "node.kubernetes.io/instance-type": "p4d.24xlarge" if p4d else "p3.16xlarge",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB" if p4d else "Tesla-V100-SXM2-16GB",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "40960" if p4d else "16160",
            }
            nodes.append(node(f"gpu-{i}", labels, {"nvidia.com/gpu": "8"}))
    return nodes


def pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits, "requests": {"cpu": "1"}}}]},
    }


def workload(count: int, rng: random.Random) -> list[dict[str, object]]:
    shapes = [
        ({"aws.amazon.com/neurondevice": "1"}, None),
        ({"aws.amazon.com/neurondevice": "4"}, None),
        ({"aws.amazon.com/neurondevice": "8"}, None),
        ({"aws.amazon.com/neurondevice": "7"}, None),  # refused on trn1: not a torus shape
        ({"aws.amazon.com/neuron": "2"}, None),
        ({"aws.amazon.com/neuron": "3"}, None),
        ({"aws.amazon.com/neuroncore": "3"}, None),
        ({"gpu.intel.com/i915": "1", "gpu.intel.com/memory.max": "5G"}, None),
        ({"gpu.intel.com/i915": "2", "gpu.intel.com/memory.max": "6G"}, None),
        ({"nvidia.com/gpu": "1"}, None),
        ({"nvidia.com/gpu": "4"}, {"nvidia-gpu-scheduler/gpu.model": "Tesla-V100-SXM2-16GB"}),
        ({"nvidia.com/gpu": "2"}, {"kubegpu.io/gpu-memory": "32Gi"}),
        ({}, None),
    ]
    documents: list[dict[str, object]] = []
    live: list[str] = []
    serial = 0
    while len(documents) < count:
        if live and rng.random() < 0.25:
            victim = live.pop(rng.randrange(len(live)))
            gone = pod(victim, {})
            gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
            documents.append(gone)
            continue
        limits, annotations = shapes[rng.randrange(len(shapes))]
        name = f"p{serial}"
        serial += 1
        documents.append(pod(name, dict(limits), annotations))
        live.append(name)
    return documents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.jsonl"
        with path.open("w") as out:
            for document in cluster(args.nodes) + workload(args.pods, rng):
                out.write(json.dumps(document) + "\n")
        command = [sys.executable, "-m", "kubegpu", "simulate", "--json", "--stats", str(path)]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        return done.returncode
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    events = [json.loads(line) for line in done.stdout.splitlines()]
    by_event: dict[str, int] = {}
    for event in events:
        by_event[event["event"]] = by_event.get(event["event"], 0) + 1
    whole = args.pods / wall
    print(f"kubegpu simulate --json: {args.nodes} nodes, {args.pods} pod documents ({by_event})")
    print(
        f"  whole process:   {wall:.2f} s  ->  {whole:.0f} pods/s  (goal {GOAL_PODS_PER_SECOND}: "
        f"{whole / GOAL_PODS_PER_SECOND:.2f}x)"
    )
    print(f"  engine only:     {stats['seconds']:.2f} s  ->  {stats['pods_per_second']:.0f} pods/s")
    print(f"  decision latency p50 {stats['p50_ms']:.3f} ms, p99 {stats['p99_ms']:.3f} ms")
    print(f"  peak memory      {stats['peak_rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
