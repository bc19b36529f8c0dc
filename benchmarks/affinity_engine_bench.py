"""Benchmark: the engine's cost per pod on one of scheduler_bench.py's workloads, checkouts side by side.

No API server: the workload's pods go through `Engine.schedule` directly on the same 1,000 trn1 nodes over three
zones, as `kubegpu scheduler` decides them (with an allocation signing key, as it runs). `--workload` picks
benchmarks/scheduler_bench.py's workload: `affinity` (the default; `affinity_pod`: required anti-affinity per host,
zone spread, preferred affinity to another app's zone), `devices` (one Neuron device per pod) or `replicasets` (one
device per pod, pod `i` a replica of ReplicaSet `i % 13`, the ReplicaSets told to the engine, so the profile's
default spreading applies). Each checkout given (`--tree`, a worktree with its own .venv; default this one) runs in
its own process with its own code, in turn, `--rounds` times, and the median per-pod cost of each is printed, with
its ratio to the first, in wall-clock time and in the process's CPU time (steadier on a shared machine); each
starts its window right after a full garbage collection, so that a collection its set-up left due is not counted
as the engine's. Comparing
a branch with main in one run:

    .venv/bin/python benchmarks/affinity_engine_bench.py --tree /path/to/main --tree . [--workload devices]

With `--profile`, one run of the first tree under cProfile prints the 40 costliest functions instead (`--sort`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()

# Run in the checkout's own interpreter: build the engine and the pods, then time `schedule` alone.
CHILD = r"""
import cProfile, gc, json, pstats, sys, time
sys.path.insert(0, sys.argv[1])
from scheduler_bench import HOSTNAME, REPLICASETS, TRN1, ZONE, affinity_pod
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler import objects
from kubegpu.scheduler.engine import Engine

nodes, pods, profile, workload = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[6]
engine = Engine(make_plugin_manager("scheduler"), signing_key=b"k" * 32)
for i in range(nodes):
    name = f"trn1-{i:04d}"
    labels = {**TRN1, ZONE: f"zone-{i % 3}", HOSTNAME: name}
    engine.add_node(node_info(node_manifest(name, labels=labels, allocatable={"aws.amazon.com/neurondevice": 16},
                                            memory="768Gi", cpu="96")))


def device_pod(i, labels):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i:05d}", "namespace": "bench", "labels": labels},
            "spec": {"schedulerName": "kubegpu", "containers": [
                {"name": "main", "image": "busybox",
                 "resources": {"limits": {"aws.amazon.com/neurondevice": "1"}}}]}}


if workload == "affinity":
    manifests = [affinity_pod("bench", i, "kubegpu") for i in range(pods)]
elif workload == "devices":
    manifests = [device_pod(i, {}) for i in range(pods)]
else:
    for k in range(REPLICASETS):
        selector = {"matchLabels": {"app": f"rs-{k}"}}
        engine.set_owner(*objects.owner("ReplicaSet", {"metadata": {"name": f"rs-{k}", "namespace": "bench"},
                                                       "spec": {"selector": selector}}))
    manifests = [device_pod(i, {"app": f"rs-{i % REPLICASETS}"}) for i in range(pods)]
requests = [pod_request(manifest)[0] for manifest in manifests]
# Collected before the window, so that a checkout's set-up (imports, nodes, documents) leaves no full collection due
# in it: otherwise whether one falls into the 3,000 pods follows from how many objects the set-up made (one of ~70 ms
# in main's window at 4f3ca5f, none in 7429e13's), not from what the engine does per pod.
gc.collect()
profiler = cProfile.Profile() if profile else None
started, cpu = time.perf_counter(), time.process_time()
if profiler:
    profiler.enable()
placed = sum(engine.schedule(request).scheduled for request in requests)
if profiler:
    profiler.disable()
    order = sys.argv[5]
    pstats.Stats(profiler, stream=sys.stderr).sort_stats(order).print_stats(40)
print(json.dumps({"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu, "placed": placed}))
"""


def run(
    tree: Path, nodes: int, pods: int, workload: str, profile: bool = False, order: str = "cumulative"
) -> dict[str, float]:
    python = tree / ".venv" / "bin" / "python"
    argv = [str(HERE.parent), str(nodes), str(pods), "1" if profile else "0", order, workload]
    out = subprocess.run(
        [str(python), "-c", CHILD, *argv],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    if profile:
        print(out.stderr)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout with its .venv (repeatable)")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workload", choices=("affinity", "devices", "replicasets"), default="affinity")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="cumulative", help="the profile's order (cumulative, tottime)")
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [HERE.parents[1]])]
    if args.profile:
        run(trees[0], args.nodes, args.pods, args.workload, profile=True, order=args.sort)
        return 0
    costs: dict[Path, list[float]] = {tree: [] for tree in trees}
    cpu: dict[Path, list[float]] = {tree: [] for tree in trees}
    for round_ in range(args.rounds):
        for tree in trees[round_ % len(trees) :] + trees[: round_ % len(trees)]:
            result = run(tree, args.nodes, args.pods, args.workload)
            costs[tree].append(result["seconds"] / args.pods * 1e6)
            cpu[tree].append(result["cpu"] / args.pods * 1e6)
            print(
                f"  round {round_ + 1}: {tree}: {costs[tree][-1]:7.1f} us/pod, {cpu[tree][-1]:7.1f} us of CPU "
                f"({int(result['placed'])} placed)"
            )
    first, first_cpu = statistics.median(costs[trees[0]]), statistics.median(cpu[trees[0]])
    print(f"\n{args.workload} workload, {args.pods} pods on {args.nodes} nodes, engine only, median of {args.rounds}:")
    for tree in trees:
        cost, used = statistics.median(costs[tree]), statistics.median(cpu[tree])
        print(
            f"  {tree!s:50} {cost:7.1f} us/pod  {cost / first:5.2f}x of the first; "
            f"CPU {used:7.1f} us/pod  {used / first_cpu:5.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
