"""Benchmark: `kubegpu scheduler` vs the real kube-scheduler 1.20.2, side by side on one real API server.

On a fresh etcd + kube-apiserver (the test harness in tests/integration/cluster.py) with 1000 fake Ready trn1.32xlarge
nodes, 3000 pending pods each requesting `aws.amazon.com/neurondevice: 1` are scheduled

1. by kube-scheduler 1.20.2 (client QPS/burst 1000/1000), and
2. by `kubegpu scheduler` (the same QPS/burst), which also picks concrete devices and writes the signed allocation,

each timed from the scheduler's launch to the last Binding, as seen by a pod watch. The same is done for a second
workload without devices on the same nodes (spread over three zones): replicas of 30 apps with required pod
anti-affinity by host, `DoNotSchedule` and `ScheduleAnyway` zone spread and preferred pod affinity to another app's
zone, cpu and memory requests. A third, `replicasets`, is the device workload's pods labelled as the replicas of 13
ReplicaSets (objects only: no controller runs), so that both schedulers spread them over zones and hosts by
kube-scheduler 1.20's default constraints, as they do a Deployment's. Who goes first rotates each round; the summary
gives medians and each side's range. On the device workload a null scheduler (benchmarks/null_scheduler.py: one LIST,
then a Binding per pod with no decision, through kubegpu's client) runs in the rotation too: the floor no scheduler
written in Python passes on the machine. It also measures the API server's raw ceiling (a plain client posting Bindings
over 8 keep-alive connections) and kubegpu on a mixed topology workload (trn1, inf2, Intel and NVIDIA nodes). Needs the
binaries from scripts/k8s-binaries.sh.

    .venv/bin/python benchmarks/scheduler_bench.py [--nodes 1000] [--pods 3000] [--rounds 3] [--no-floor]
                                                   [--no-mixed] [--workloads devices,affinity,replicasets]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from integration.cluster import Cluster, config_flag, free_port, running_cluster  # noqa: E402

from kubegpu.kube.client import ApiError, KubeClient  # noqa: E402

TRN1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
APPS = 30


class BindWatch(threading.Thread):
    """Counts pods of a namespace as they get a node, from a watch, with the time of each binding."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        super().__init__(daemon=True)
        self.client, self.namespace = client, namespace
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._run()
        except ApiError:
            if not self.stop.is_set():
                raise

    def _run(self) -> None:
        # One item is enough for the collection's resourceVersion (following the pages would list every pod).
        page = self.client.get(f"/api/v1/namespaces/{self.namespace}/pods", limit=1)
        version = str(page["metadata"]["resourceVersion"])
        while not self.stop.is_set():
            for event in self.client.watch(f"/api/v1/namespaces/{self.namespace}/pods", version, timeout=60):
                obj = event.get("object") or {}
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if (obj.get("spec") or {}).get("nodeName"):
                    self.bound.setdefault(obj["metadata"]["name"], time.monotonic())
                if self.stop.is_set():
                    return

    def wait(self, count: int, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.bound) >= count:
                return max(self.bound.values())
            time.sleep(0.05)
        return None


def parallel(work: Callable[[int], Any], count: int, threads: int = 8) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(count)))


def add_trn1_nodes(cluster: Cluster, count: int) -> None:
    """`count` Ready trn1.32xlarge nodes named trn1-0000, trn1-0001, ..., 16 Neuron devices each, over three zones,
    each with the hostname label a kubelet gives its node (the affinity workload's per-host rules read it)."""
    parallel(
        lambda i: cluster.create_ready_node(
            f"trn1-{i:04d}",
            labels={**TRN1, ZONE: f"zone-{i % 3}", HOSTNAME: f"trn1-{i:04d}"},
            allocatable={"aws.amazon.com/neurondevice": 16},
        ),
        count,
    )


def make_pods(cluster: Cluster, namespace: str, count: int, scheduler: str, shapes: list[dict[str, Any]]) -> None:
    cluster.create_namespace(namespace)
    parallel(
        lambda i: cluster.create_pod(namespace, f"p{i:05d}", {"main": shapes[i % len(shapes)]}, scheduler=scheduler),
        count,
    )


def affinity_pod(namespace: str, i: int, scheduler: str) -> dict[str, Any]:
    """Pod `i` of the affinity workload: app `i % APPS`; a third of the apps one replica per host, a third spread
    evenly over zones (and softly over hosts), a third drawn to the zone of the next app's pods."""
    app = i % APPS
    labels = {"app": f"app-{app}"}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
    }  # fmt: skip
    if app % 3 == 0:
        term = {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": labels}}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    elif app % 3 == 1:
        spec["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": labels}},
            {"maxSkew": 1, "topologyKey": HOSTNAME, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": labels}},
        ]  # fmt: skip
    else:
        other = {"app": f"app-{(app + 1) % APPS}"}
        term = {"topologyKey": ZONE, "labelSelector": {"matchLabels": other}}
        spec["affinity"] = {
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": term}]
            }
        }
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": f"p{i:05d}", "namespace": namespace, "labels": labels}}  # fmt: skip


REPLICASETS = 13


def make_replicaset_pods(cluster: Cluster, namespace: str, count: int, scheduler: str) -> None:
    """`count` one-device pods, pod `i` labelled as a replica of ReplicaSet `i % 13`, and the 13 ReplicaSets."""
    cluster.create_namespace(namespace)
    for k in range(REPLICASETS):
        labels = {"app": f"rs-{k}"}
        cluster.client.post(
            f"/apis/apps/v1/namespaces/{namespace}/replicasets",
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": f"rs-{k}"},
             "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                      "template": {"metadata": {"labels": labels},
                                   "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}},
        )  # fmt: skip
    limits = {"aws.amazon.com/neurondevice": "1"}
    parallel(
        lambda i: cluster.client.post(
            f"/api/v1/namespaces/{namespace}/pods",
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"p{i:05d}", "namespace": namespace, "labels": {"app": f"rs-{i % REPLICASETS}"}},
             "spec": {"schedulerName": scheduler,
                      "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]}},
        ),
        count,
    )  # fmt: skip


def make_affinity_pods(cluster: Cluster, namespace: str, count: int, scheduler: str) -> None:
    cluster.create_namespace(namespace)
    parallel(
        lambda i: cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", affinity_pod(namespace, i, scheduler)),
        count,
    )


def clear_pods(cluster: Cluster, namespace: str) -> None:
    """Delete the namespace's pods and wait until they are gone, so that the next run does not pay for the deletions
    (nor an informer that starts then for their events)."""
    cluster.client.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": 0})
    deadline = time.monotonic() + 120
    while cluster.client.get(f"/api/v1/namespaces/{namespace}/pods", limit=1).get("items"):
        if time.monotonic() > deadline:
            raise SystemExit(f"the pods of {namespace} were not deleted within 120 s")
        time.sleep(0.2)


def run_scheduler(cluster: Cluster, command: list[str], namespace: str, count: int, log: Path) -> tuple[float, int]:
    watch = BindWatch(cluster.client, namespace)
    watch.start()
    time.sleep(0.5)  # the watch is established before the scheduler starts
    launched = time.monotonic()
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        last = watch.wait(count, timeout=600)
    finally:
        process.terminate()
        process.wait(timeout=30)
        watch.stop.set()
    if last is None:
        raise SystemExit(f"only {len(watch.bound)}/{count} pods were bound; see {log}")
    return last - launched, len(watch.bound)


def kube_scheduler(cluster: Cluster, work: Path, qps: int) -> list[str]:
    config = work / "kube-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1beta1\nkind: KubeSchedulerConfiguration\n"
        f"clientConnection:\n  kubeconfig: {cluster.kubeconfig}\n  qps: {qps}\n  burst: {qps}\n"
        "leaderElection:\n  leaderElect: false\nprofiles:\n- schedulerName: default-scheduler\n"
    )
    return [
        str(cluster.bin / "kube-scheduler"),
        config_flag(config),
        "--port=0",
        f"--secure-port={free_port()}",
        "--bind-address=127.0.0.1",
        f"--cert-dir={work / 'scheduler-certs'}",
        "--authentication-tolerate-lookup-failure",
        "-v=1",
    ]


def kubegpu_scheduler(cluster: Cluster, work: Path, qps: int, binders: int = 16) -> list[str]:
    key = work / "key"
    key.write_text(secrets.token_hex(32))
    return [
        sys.executable, "-m", "kubegpu", "scheduler", "--kubeconfig", str(cluster.kubeconfig),
        "--scheduler-name", "kubegpu", "--allocation-key-file", str(key), "--no-leader-elect",
        "--metrics-address", f"127.0.0.1:{free_port()}", "--kube-api-qps", str(qps), "--kube-api-burst", str(qps),
        "--log-level", "warning", "--binders", str(binders),
    ]  # fmt: skip


def list_nodes(cluster: Cluster) -> None:
    """Listing every node: the `kubernetes` client's typed call vs the fast path the scheduler uses."""
    from kubernetes import client as k8s
    from kubernetes import config

    configuration = k8s.Configuration()
    config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    api = k8s.CoreV1Api(k8s.ApiClient(configuration))
    timings = {}
    for name, call in [
        ("kubernetes client, typed", lambda: len(api.list_node().items)),
        ("kubernetes client, _preload_content=False + orjson",
         lambda: len(orjson.loads(api.list_node(_preload_content=False).data)["items"])),
        ("kubegpu fast path (urllib3 + orjson, pages of 500)", lambda: len(cluster.client.list("/api/v1/nodes")[0])),
    ]:  # fmt: skip
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            count = call()
            best = min(best, time.perf_counter() - started)
        timings[name] = best
        print(f"  list {count} nodes: {name:52} {best * 1000:8.1f} ms (best of 3)")


def raw_bindings(cluster: Cluster, namespace: str, count: int) -> float:
    nodes = [n["metadata"]["name"] for n in cluster.client.list("/api/v1/nodes")[0]]

    def bind(i: int) -> None:
        name = f"p{i:05d}"
        cluster.client.post(
            f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[i % len(nodes)]},
            },
        )

    started = time.monotonic()
    parallel(bind, count)
    return count / (time.monotonic() - started)


def null_scheduler(cluster: Cluster, qps: int, binders: int) -> list[str]:
    """benchmarks/null_scheduler.py: Bindings for the pending pods with no decision, kubegpu's client and settings."""
    return [
        sys.executable, str(ROOT / "benchmarks" / "null_scheduler.py"), "--kubeconfig", str(cluster.kubeconfig),
        "--scheduler-name", "kubegpu", "--binders", str(binders), "--qps", str(qps),
    ]  # fmt: skip


def compare(
    cluster: Cluster, args: argparse.Namespace, work: Path, workload: str, create: Any
) -> dict[str, list[float]]:
    """The schedulers on the same nodes, one after the other, `args.rounds` times, who goes first rotating each round
    (a later run finds a larger etcd, which would favour whoever goes first). On the device workload the null
    scheduler (`--floor`) runs in the rotation too."""
    contestants = ["kube-scheduler", "kubegpu"]
    if args.floor and workload == "devices":
        contestants.append("null")
    if args.only_kubegpu:
        contestants = ["kubegpu"]
    runs: dict[str, list[float]] = {who: [] for who in contestants}
    for round_ in range(args.rounds):
        shift = round_ % len(contestants)
        for who in contestants[shift:] + contestants[:shift]:
            namespace = f"bench-{workload}-{who}-{round_}"
            create(namespace, "default-scheduler" if who == "kube-scheduler" else "kubegpu")
            if who == "kubegpu":
                command = kubegpu_scheduler(cluster, work, args.qps, args.binders)
            elif who == "null":
                command = null_scheduler(cluster, args.qps, args.binders)
            else:
                command = kube_scheduler(cluster, work, args.qps)
            seconds, _ = run_scheduler(cluster, command, namespace, args.pods, work / f"{namespace}.log")
            clear_pods(cluster, namespace)
            runs[who].append(args.pods / seconds)
            print(f"  {workload} round {round_ + 1}: {who:15} {seconds:6.1f} s  {args.pods / seconds:7.1f} pods/s")
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--qps", type=int, default=1000)
    parser.add_argument("--binders", type=int, default=16, help="kubegpu's concurrent binders")
    parser.add_argument("--only-kubegpu", action="store_true", help="skip kube-scheduler, the ceiling and mixed runs")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both schedulers, alternating who goes first")
    parser.add_argument(
        "--workloads", default="devices,affinity,replicasets", help="comma-separated: devices, affinity, replicasets"
    )
    parser.add_argument("--no-mixed", dest="mixed", action="store_false", help="skip the mixed topology run")
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false", help="skip the null scheduler on the device workload"
    )
    args = parser.parse_args()
    one_device = [{"aws.amazon.com/neurondevice": 1}]
    with tempfile.TemporaryDirectory() as tmp, running_cluster(Path(tmp) / "k8s") as cluster:
        work = Path(tmp)
        cluster.client.limiter.qps = 0
        started = time.monotonic()
        add_trn1_nodes(cluster, args.nodes)
        print(f"{args.nodes} Ready trn1.32xlarge nodes created in {time.monotonic() - started:.0f}s")
        list_nodes(cluster)

        workloads = args.workloads.split(",")
        results: dict[str, dict[str, list[float]]] = {}
        for workload in workloads:

            def create(namespace: str, scheduler: str, workload: str = workload) -> None:
                if workload == "devices":
                    make_pods(cluster, namespace, args.pods, scheduler, one_device)
                elif workload == "replicasets":
                    make_replicaset_pods(cluster, namespace, args.pods, scheduler)
                else:
                    make_affinity_pods(cluster, namespace, args.pods, scheduler)

            runs = compare(cluster, args, work, workload, create)
            if args.only_kubegpu:
                continue
            results[workload] = runs
        if args.only_kubegpu:
            return 0

        make_pods(cluster, "bench-raw", args.pods, "nobody", one_device)
        ceiling = raw_bindings(cluster, "bench-raw", args.pods)
        clear_pods(cluster, "bench-raw")

        goals = {
            "devices": "goal >= 1.0x, 2.0x; kubegpu also allocates devices",
            "affinity": "goal >= 1.0x",
            "replicasets": "both spread by default; kubegpu also allocates devices",
        }
        for workload, runs in results.items():
            kube_rate, ours_rate = statistics.median(runs["kube-scheduler"]), statistics.median(runs["kubegpu"])
            print(
                f"\n{workload}: {args.pods} pods on {args.nodes} nodes, client QPS/burst {args.qps}, "
                f"median of {args.rounds} rounds:"
            )
            print(
                f"  kube-scheduler 1.20.2   {kube_rate:7.1f} pods/s   "
                f"(rounds {min(runs['kube-scheduler']):.0f}-{max(runs['kube-scheduler']):.0f})"
            )
            print(
                f"  kubegpu scheduler       {ours_rate:7.1f} pods/s   ratio {ours_rate / kube_rate:.2f}x "
                f"(rounds {min(runs['kubegpu']):.0f}-{max(runs['kubegpu']):.0f}; {goals[workload]})"
            )
            if "null" in runs:
                floor = statistics.median(runs["null"])
                print(
                    f"  null scheduler (floor)  {floor:7.1f} pods/s   ratio {floor / kube_rate:.2f}x "
                    "(Bindings with no decision: no Python scheduler passes it here)"
                )
        print(f"  raw Binding ceiling     {ceiling:7.1f} Bindings/s (plain client, 8 keep-alive connections)")

        if not args.mixed:
            return 0
        cluster.cleanup()
        kinds = [
            ("trn1", TRN1, {"aws.amazon.com/neurondevice": 16}),
            ("inf2", {"node.kubernetes.io/instance-type": "inf2.48xlarge"}, {"aws.amazon.com/neuron": 12}),
            ("intel", {"gpu.intel.com/cards": "card0.card1.card2.card3"},
             {"gpu.intel.com/i915": 16, "gpu.intel.com/memory.max": "64G"}),
            ("p3", {"node.kubernetes.io/instance-type": "p3.16xlarge", "nvidia.com/gpu.count": "8",
                    "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB", "nvidia.com/gpu.memory": "16160"},
             {"nvidia.com/gpu": 8}),
        ]  # fmt: skip
        parallel(
            lambda i: cluster.create_ready_node(
                f"{kinds[i % 4][0]}-{i:04d}", labels=kinds[i % 4][1], allocatable=kinds[i % 4][2]
            ),
            args.nodes,
        )
        mixed = [
            {"aws.amazon.com/neurondevice": 4}, {"aws.amazon.com/neuron": 1}, {"aws.amazon.com/neuroncore": 2},
            {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": "4G"}, {"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 1},
        ]  # fmt: skip
        make_pods(cluster, "bench-mixed", args.pods, "kubegpu", mixed)
        mixed_s, _ = run_scheduler(
            cluster, kubegpu_scheduler(cluster, work, args.qps), "bench-mixed", args.pods, work / "kubegpu-mixed.log"
        )
        print(
            f"  kubegpu, mixed topology {mixed_s:6.1f} s  {args.pods / mixed_s:7.1f} pods/s "
            "(Neuron torus/ring/cores, Intel shares, NVIDIA cube-mesh)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
