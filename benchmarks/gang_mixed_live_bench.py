"""Benchmark: ordinary pods' throughput through `kubegpu scheduler` on a real API server, alone and with gangs
interleaved, side by side in one run (the issue's goal: within 10 %).

On a fresh etcd + kube-apiserver 1.20.2 (tests/integration/cluster.py) with `--racks` racks of `--rack-size` fake
Ready 8-GPU nodes (the rack a `--topology` level), each round creates the same `--pods` ordinary pods (1 GPU each)
while no scheduler runs, in one of two mixes:

* alone: the ordinary pods only;
* with gangs: the same pods with `--gangs` PodGroups of `--members` members (8 GPUs each, one rack required)
  created among them, a member after every few ordinary pods, so that the queue interleaves them;

then starts `kubegpu scheduler` (client rate `--qps`) and times from its launch to the last ordinary pod bound, as a
pod watch sees it. The figure is ordinary pods per second, each mix's median over `--rounds` rounds (which mix goes
first alternates), and the ratio of the two; every gang must be bound whole in one rack.

    .venv/bin/python benchmarks/gang_mixed_live_bench.py [--racks 16] [--rack-size 64] [--pods 2000] [--gangs 8]
                                                         [--members 8] [--rounds 2] [--qps 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gang_live_bench import start_scheduler  # noqa: E402
from integration.cluster import Cluster, running_cluster  # noqa: E402
from integration.gangs import create_pod, install_podgroup_crd, podgroups_path  # noqa: E402
from scheduler_bench import BindWatch, clear_pods, parallel  # noqa: E402

GPU = "nvidia.com/gpu"
BLOCK, RACK = "example.com/block", "example.com/rack"
GOAL_RATIO = 0.90


def add_nodes(cluster: Cluster, racks: int, size: int) -> dict[str, str]:
    """node -> rack; the racks in blocks of 4 (the topology's widest level)."""
    where = {f"r{r:02d}-n{i:02d}": f"rack-{r}" for r in range(racks) for i in range(size)}
    names = sorted(where)
    parallel(
        lambda i: cluster.create_ready_node(
            names[i],
            labels={
                BLOCK: f"block-{int(where[names[i]].split('-')[1]) // 4}",
                RACK: where[names[i]],
                "kubernetes.io/hostname": names[i],
            },
            allocatable={GPU: 8},
        ),
        len(names),
    )
    return where


def create_mix(cluster: Cluster, namespace: str, args: argparse.Namespace, gangs: bool) -> list[str]:
    """The round's pods, pending (no scheduler runs yet); the ordinary pods' names."""
    ordinary = [f"p{i:05d}" for i in range(args.pods)]
    order: list[tuple[str, str | None, int]] = [(name, None, 0) for name in ordinary]
    if gangs:
        for g in range(args.gangs):
            meta = {"name": f"job-{g}", "annotations": {"kueue.x-k8s.io/podset-required-topology": RACK}}
            body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": meta}
            cluster.client.post(podgroups_path(namespace), {**body, "spec": {"minMember": args.members}})
        members = [(f"job-{g}-{i}", f"job-{g}", i) for g in range(args.gangs) for i in range(args.members)]
        step = max(1, len(order) // max(1, len(members)))
        for n, member in enumerate(members):
            order.insert(min(len(order), (n + 1) * step + n), member)

    def create(i: int) -> None:
        name, group, index = order[i]
        if group is None:
            create_pod(cluster, namespace, name, 1, scheduler="kubegpu")
            return
        labels = {"scheduling.x-k8s.io/pod-group": group}
        annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
        create_pod(cluster, namespace, name, 8, scheduler="kubegpu", labels=labels, annotations=annotations)

    parallel(create, len(order))
    return ordinary


def one_round(cluster: Cluster, work: Path, args: argparse.Namespace, where: dict[str, str], gangs: bool) -> float:
    namespace = f"mix-{'gangs' if gangs else 'alone'}-{time.monotonic_ns() % 1_000_000}"
    cluster.create_namespace(namespace)
    ordinary = create_mix(cluster, namespace, args, gangs)
    total = args.pods + (args.gangs * args.members if gangs else 0)
    watch = BindWatch(cluster.client, namespace)
    watch.start()
    time.sleep(0.5)  # the watch is established before the scheduler starts
    launched = time.monotonic()
    process, _, log = start_scheduler(cluster, work, args.qps)
    try:
        if watch.wait(total, timeout=600) is None:
            raise SystemExit(f"only {len(watch.bound)}/{total} pods bound; see {log.read_text()[-3000:]}")
    finally:
        process.terminate()
        process.wait(timeout=30)
        watch.stop.set()
    seconds = max(watch.bound[name] for name in ordinary) - launched
    if gangs:
        nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.pods(namespace)}
        for g in range(args.gangs):
            racks = Counter(where[nodes[f"job-{g}-{i}"]] for i in range(args.members))
            if len(racks) != 1:
                raise SystemExit(f"gang job-{g} spread over {dict(racks)}")
    clear_pods(cluster, namespace)
    return args.pods / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--racks", type=int, default=16)
    parser.add_argument("--rack-size", type=int, default=64)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--gangs", type=int, default=8)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--qps", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_cluster(Path(tmp) / "k8s") as cluster:
        install_podgroup_crd(cluster)
        where = add_nodes(cluster, args.racks, args.rack_size)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for number in range(args.rounds):
            for gangs in (False, True) if number % 2 == 0 else (True, False):
                rate = one_round(cluster, Path(tmp), args, where, gangs)
                rates[gangs].append(rate)
                print(f"round {number + 1}, {'with gangs' if gangs else 'alone'}: {rate:.0f} ordinary pods/s")
        alone, mixed = statistics.median(rates[False]), statistics.median(rates[True])
        ratio = mixed / alone
        print(
            f"{args.pods} ordinary pods on {len(where)} nodes, client {args.qps} qps: alone {alone:.0f} pods/s, "
            f"with {args.gangs} gangs of {args.members} interleaved {mixed:.0f} pods/s "
            f"(ratio {ratio:.2f}; goal >= {GOAL_RATIO:.2f}: {'met' if ratio >= GOAL_RATIO else 'MISSED'})"
        )
        return 0 if ratio >= GOAL_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
