"""Benchmark: kube-scheduler 1.20.2's own benchmark workloads, kube-scheduler vs `kubegpu scheduler`, side by side.

kube-scheduler measures itself with `test/integration/scheduler_perf` (`config/performance-config.yaml` and its pod
templates): each workload creates nodes, some pods that are scheduled first, then the pods whose scheduling rate it
reports. This runs those workloads on a real API server (the harness of benchmarks/scheduler_bench.py: same cluster,
same launch-to-last-Binding timing, same command lines) with both schedulers in turn, and prints each one's pods/s on
the measured pods and the ratio. Each phase is timed from its scheduler's launch, so start-up (listing nodes and the
pods already placed) is counted for both alike.

The nodes are the workloads' template (4 cpus, 32Gi, 110 pods) with the hostname label a kubelet gives its node, and
their zone label where the workload sets one (round robin over its values). Sizes are upstream's 500Nodes
parameters scaled to `--nodes` (default 100, so that every workload runs on a small machine in minutes): Preemption
at `--nodes 500` is upstream's 500Nodes case (2,000 low-priority pods of 900m filling 500 nodes, then 500 pods of
3000m at priority 10, each evicting three), and at `--nodes 1000` the 1,000-node one. The workloads that need a
volume controller or CSI nodes (SchedulingInTreePVs, SchedulingMigratedInTreePVs, SchedulingCSIPVs) are not ported:
neither scheduler binds volumes here without one. Needs the binaries from scripts/k8s-binaries.sh.

    .venv/bin/python benchmarks/scheduler_perf_bench.py [--nodes 100] [--rounds 1] [--workloads Preemption,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler_bench import (
    HOSTNAME,
    ZONE,
    Cluster,
    clear_pods,
    kube_scheduler,
    kubegpu_scheduler,
    parallel,
    run_scheduler,
    running_cluster,
)

HIGH_PRIORITY = "scheduler-perf-high"  # the priority class of the preempting pods: value 10, as upstream's template

# A pod template: (setup namespace, test namespace) -> the pod's metadata labels and spec, without names.
Template = Callable[[str, str], tuple[dict[str, str], dict[str, Any]]]


def _container(cpu: str = "100m", memory: str = "500Mi", *, limits: bool = True) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": memory}
    resources = {"requests": requests, "limits": dict(requests)} if limits else {"requests": requests}
    return {"name": "pause", "image": "pause", "ports": [{"containerPort": 80}], "resources": resources}


def default_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    return {}, {"containers": [_container()]}


def low_priority_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    return {}, {"terminationGracePeriodSeconds": 0, "containers": [_container("900m")]}


def high_priority_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    return {}, {"priorityClassName": HIGH_PRIORITY, "containers": [_container("3000m")]}


def large_cpu_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    return {}, {"containers": [_container("9", limits=False)]}


def secret_volume_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    return {}, {"containers": [_container()], "volumes": [{"name": "secret", "secret": {"secretName": "secret"}}]}


def _term(color: str, key: str, setup: str, test: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"color": color}}, "topologyKey": key, "namespaces": [test, setup]}


def anti_affinity_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    rule = {"requiredDuringSchedulingIgnoredDuringExecution": [_term("green", HOSTNAME, setup, test)]}
    return {"color": "green"}, {"affinity": {"podAntiAffinity": rule}, "containers": [_container()]}


def affinity_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    rule = {"requiredDuringSchedulingIgnoredDuringExecution": [_term("blue", ZONE, setup, test)]}
    return {"color": "blue"}, {"affinity": {"podAffinity": rule}, "containers": [_container()]}


def preferred_affinity_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    rule = {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": _term("red", HOSTNAME, setup, test)}]}  # fmt: skip
    return {"color": "red"}, {"affinity": {"podAffinity": rule}, "containers": [_container()]}


def preferred_anti_affinity_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    rule = {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": _term("yellow", HOSTNAME, setup, test)}]}  # fmt: skip
    return {"color": "yellow"}, {"affinity": {"podAntiAffinity": rule}, "containers": [_container()]}


def node_affinity_pod(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
    term = {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["zone1", "zone2"]}]}
    rule = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    return {}, {"affinity": {"nodeAffinity": rule}, "containers": [_container()]}


def _spreading(when: str) -> Template:
    def template(setup: str, test: str) -> tuple[dict[str, str], dict[str, Any]]:
        constraint = {"maxSkew": 5, "topologyKey": ZONE, "whenUnsatisfiable": when,
                      "labelSelector": {"matchLabels": {"color": "blue"}}}  # fmt: skip
        return {"color": "blue"}, {"topologySpreadConstraints": [constraint], "containers": [_container()]}

    return template


@dataclass(frozen=True)
class Workload:
    """One of performance-config.yaml's workloads at its 500Nodes size: the pods placed first (template, count at
    500 nodes), then the measured ones; `zones` labels the nodes; `wait` false: the first pods stay pending."""

    init: tuple[tuple[Template, int], ...]
    measure: tuple[Template, int]
    zones: tuple[str, ...] = ()
    wait: bool = True


MIXED = (default_pod, affinity_pod, anti_affinity_pod, preferred_affinity_pod, preferred_anti_affinity_pod)
WORKLOADS = {
    "SchedulingBasic": Workload(((default_pod, 500),), (default_pod, 1000)),
    "SchedulingPodAntiAffinity": Workload(((anti_affinity_pod, 100),), (anti_affinity_pod, 400)),
    "SchedulingSecrets": Workload(((secret_volume_pod, 500),), (secret_volume_pod, 1000)),
    "SchedulingPodAffinity": Workload(((affinity_pod, 500),), (affinity_pod, 1000), zones=("zone1",)),
    "SchedulingPreferredPodAffinity": Workload(((preferred_affinity_pod, 500),), (preferred_affinity_pod, 1000)),
    "SchedulingPreferredPodAntiAffinity": Workload(
        ((preferred_anti_affinity_pod, 500),), (preferred_anti_affinity_pod, 1000)
    ),
    "SchedulingNodeAffinity": Workload(((node_affinity_pod, 500),), (node_affinity_pod, 1000), zones=("zone1",)),
    "TopologySpreading": Workload(
        ((default_pod, 1000),), (_spreading("DoNotSchedule"), 1000), zones=("moon-1", "moon-2", "moon-3")
    ),
    "PreferredTopologySpreading": Workload(
        ((default_pod, 1000),), (_spreading("ScheduleAnyway"), 1000), zones=("moon-1", "moon-2", "moon-3")
    ),
    "MixedSchedulingBasePod": Workload(tuple((t, 200) for t in MIXED), (default_pod, 1000), zones=("zone1",)),
    "Preemption": Workload(((low_priority_pod, 2000),), (high_priority_pod, 500)),
    "Unschedulable": Workload(((large_cpu_pod, 200),), (default_pod, 1000), wait=False),
}
UPSTREAM_NODES = 500  # the size of the parameters above


def create_nodes(cluster: Cluster, count: int, zones: tuple[str, ...]) -> None:
    def create(i: int) -> None:
        name = f"perf-{i:05d}"
        labels = {HOSTNAME: name, **({ZONE: zones[i % len(zones)]} if zones else {})}
        cluster.create_ready_node(name, labels=labels, allocatable={"cpu": "4", "memory": "32Gi", "pods": "110"})

    parallel(create, count)


def create_pods(
    cluster: Cluster, namespace: str, prefix: str, template: Template, count: int, scheduler: str, setup: str, test: str
) -> None:
    labels, spec = template(setup, test)

    def create(i: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{prefix}-{i:05d}", "namespace": namespace, "labels": labels},
            "spec": {**spec, "schedulerName": scheduler},
        }
        cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", body)

    parallel(create, count)


def run_workload(
    cluster: Cluster, args: argparse.Namespace, work: Path, name: str, workload: Workload
) -> dict[str, list[float]]:
    """The workload on fresh nodes with each scheduler in turn, `args.rounds` times, who goes first rotating."""
    scale = args.nodes / UPSTREAM_NODES
    cluster.cleanup()
    create_nodes(cluster, args.nodes, workload.zones)
    contestants = ["kube-scheduler", "kubegpu"]
    runs: dict[str, list[float]] = {who: [] for who in contestants}
    for round_ in range(args.rounds):
        shift = round_ % len(contestants)
        for who in contestants[shift:] + contestants[:shift]:
            scheduler = "default-scheduler" if who == "kube-scheduler" else "kubegpu"
            setup = cluster.create_namespace(f"{name.lower()}-{who}-{round_}-setup")
            test = cluster.create_namespace(f"{name.lower()}-{who}-{round_}-test")

            def command(who: str = who) -> list[str]:
                if who == "kubegpu":
                    return kubegpu_scheduler(cluster, work, args.qps, args.binders)
                return kube_scheduler(cluster, work, args.qps)

            placed = 0
            for k, (template, count) in enumerate(workload.init):
                count = round(count * scale)
                create_pods(cluster, setup, f"init{k}", template, count, scheduler, setup, test)
                placed += count
            if workload.wait and placed:
                run_scheduler(cluster, command(), setup, placed, work / f"{setup}.log")
            template, count = workload.measure
            count = round(count * scale)
            create_pods(cluster, test, "measure", template, count, scheduler, setup, test)
            seconds, _ = run_scheduler(cluster, command(), test, count, work / f"{test}.log")
            runs[who].append(count / seconds)
            print(
                f"  {name} round {round_ + 1}: {who:15} {count} pods in {seconds:6.1f} s  {count / seconds:7.1f} pods/s"
            )
            clear_pods(cluster, test)
            clear_pods(cluster, setup)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100, help="nodes; every pod count scales with it (500: upstream)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of both schedulers, alternating who goes first")
    parser.add_argument("--qps", type=int, default=1000)
    parser.add_argument("--binders", type=int, default=16, help="kubegpu's concurrent binders")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of: " + ", ".join(WORKLOADS))
    args = parser.parse_args()
    chosen = args.workloads.split(",")
    unknown = [name for name in chosen if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, running_cluster(Path(tmp) / "k8s") as cluster:
        cluster.client.limiter.qps = 0
        cluster.client.post(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": HIGH_PRIORITY},
             "value": 10},
        )  # fmt: skip
        for name in chosen:
            started = time.monotonic()
            results[name] = run_workload(cluster, args, Path(tmp), name, WORKLOADS[name])
            print(f"  ({name}: {time.monotonic() - started:.0f} s with set-up)")
    print(f"\nscheduler_perf workloads on {args.nodes} nodes (sizes: upstream's 500Nodes x {args.nodes / 500:g}), "
          f"median of {args.rounds} round(s), measured pods only:")  # fmt: skip
    print(f"  {'workload':36} {'kube-scheduler':>15} {'kubegpu':>10} {'ratio':>7}")
    for name, runs in results.items():
        kube, ours = statistics.median(runs["kube-scheduler"]), statistics.median(runs["kubegpu"])
        print(f"  {name:36} {kube:10.1f} pods/s {ours:10.1f} {ours / kube:6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
