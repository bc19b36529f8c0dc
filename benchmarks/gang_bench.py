"""Benchmark: gangs in the simulator's engine, measured side by side in one run.

1. A 256-member gang (8 GPUs per member) placed whole on 4,096 8-GPU nodes in 64 racks of 64 (`Engine.place_gang`
   through the simulator's path, Permit included): the time from its last member's arrival to every member holding
   a place, against the issue's 10 s budget for the live scheduler.
2. Ordinary pods' throughput with gangs interleaved against the same ordinary pods alone (the simulator's per-pod
   decision time, ordinary pods only): the goal is within 10%.

    .venv/bin/python benchmarks/gang_bench.py [--racks 64] [--rack-size 64] [--pods 4000] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.podgroups import KUEUE_GROUP_LABEL, KUEUE_TOTAL, REQUIRED_TOPOLOGY
from kubegpu.scheduler.simulate import Cluster, PodEvent, _process

GPU = "nvidia.com/gpu"
RACK = "example.com/rack"
GOAL_GANG_SECONDS = 10.0
GOAL_RATIO = 0.90


def engine(racks: int, size: int) -> Engine:
    e = Engine(make_plugin_manager("scheduler"), levels=(RACK,))
    for r in range(racks):
        for i in range(size):
            name = f"r{r}-n{i}"
            labels = {RACK: f"rack-{r}", "kubernetes.io/hostname": name}
            e.add_node(node_info(node_manifest(name, labels=labels, allocatable={GPU: 8})))
    return e


def member(gang: str, index: int, total: int, gpus: int, required: bool) -> PodEvent:
    annotations = {KUEUE_TOTAL: str(total), **({REQUIRED_TOPOLOGY: RACK} if required else {})}
    document: dict[str, Any] = pod_manifest(f"{gang}-{index}", {"main": {GPU: gpus}}, annotations=annotations)
    document["metadata"]["labels"] = {KUEUE_GROUP_LABEL: gang, "batch.kubernetes.io/job-completion-index": str(index)}
    return PodEvent(gang, pod_request(document)[0], False)


def ordinary(index: int, rng: random.Random) -> PodEvent:
    gpus = rng.choice((1, 1, 2, 4))
    return PodEvent("pod", pod_request(pod_manifest(f"web-{index}", {"main": {GPU: gpus, "cpu": "1"}}))[0], False)


def run(racks: int, size: int, events: list[PodEvent]) -> tuple[list[dict[str, Any]], list[float], float]:
    e = engine(racks, size)
    latencies: list[float] = []
    started = time.perf_counter()
    out = list(_process(e, events, latencies, Cluster([], {})))
    return out, latencies, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, default=64)
    parser.add_argument("--rack-size", type=int, default=64)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    # 1. One 256-member gang on the empty cluster.
    gang = [member("big", i, 256, 8, False) for i in range(256)]
    e = engine(args.racks, args.rack_size)
    started = time.perf_counter()
    placed = e.place_gang([event.request for event in gang])
    seconds = time.perf_counter() - started
    racks = {d.node.split("-")[0] for d in placed.decisions if d.node}
    print(
        f"256-member gang on {args.racks * args.rack_size} nodes in {args.racks} racks: placed={placed.placed} "
        f"in {seconds:.3f} s over {len(racks)} racks (goal < {GOAL_GANG_SECONDS:.0f} s)"
    )

    # 2. Ordinary pods alone, and the same pods with gangs interleaved (16-member rack-bound gangs of 8-GPU pods).
    rng = random.Random(args.seed)
    plain = [ordinary(i, rng) for i in range(args.pods)]
    mixed: list[PodEvent] = []
    gangs = 0
    for i, event in enumerate(plain):
        mixed.append(event)
        if i % 250 == 249:
            mixed.extend(member(f"train-{gangs}", m, 16, 8, True) for m in range(16))
            gangs += 1
    alone_out, alone_lat, _ = run(args.racks, args.rack_size, plain)
    mixed_out, mixed_lat, _ = run(args.racks, args.rack_size, mixed)
    keys = {event.request.key for event in plain}
    alone = sum(lat for lat in alone_lat[: len(plain)])
    # In the mixed run, latencies follow the arrival order: ordinary pods one each; a gang's members share theirs.
    mixed_plain = sum(lat for event, lat in zip(mixed, mixed_lat, strict=True) if event.request.key in keys)
    alone_rate = len(plain) / alone
    mixed_rate = len(plain) / mixed_plain
    placed_gangs = len({e["gang"] for e in mixed_out if e.get("gang") and e["event"] == "scheduled"})
    print(f"{'':34}{'alone':>12}{'with gangs':>14}{'ratio':>8}")
    print(
        f"{'ordinary pods/s (decision time)':34}{alone_rate:12.0f}{mixed_rate:14.0f}{mixed_rate / alone_rate:8.2f}"
        f"   ({gangs} gangs interleaved, {placed_gangs} placed; goal >= {GOAL_RATIO:.2f})"
    )
    assert len(alone_out) == len(plain)


if __name__ == "__main__":
    main()
