"""Soak: `kubegpu scheduler` on a real API server while tenants churn without end; its memory should stay flat.

On a fresh etcd + kube-apiserver 1.20.2 (tests/integration/cluster.py, etcd compacted every few seconds), four 8-GPU
nodes and `kubegpu scheduler` run for `--minutes`. A tenant keeps creating pods (`--rate` a second), each of a shape,
labels and namespace never seen before (cpu and memory asks, a third of them a GPU, one in ten an extended resource of
a name made up for it, which no node offers), deleting the oldest past `--live` pods; every few seconds a node is
relabelled (GPU Feature Discovery's timestamp label) and an autoscaled node with a label of its own comes and the one
before goes. Halfway, the scheduler is stopped (SIGSTOP) for 15 s while the tenant deletes and creates pods, then the
API server restarts, ending its watches, and it is continued: its watches resume from the versions they had (on
1.20.2 they were answered from there, never `410 Gone`; the line at the end counts the relists the log names).

Printed, every 10 s: the scheduler's resident memory (VmRSS), the pods made so far, and the mean scheduling time of
the attempts in that period (`kubegpu_scheduler_scheduling_duration_seconds`). At the end every pod is deleted and
each node is asked for a pod of all its GPUs: each must be bound, none of the devices of deleted pods still held,
and no live pod's GPU given twice.

    .venv/bin/python benchmarks/scheduler_soak_bench.py [--minutes 4] [--live 120] [--rate 30] [--log FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import urllib3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from integration.cluster import Cluster, free_port, running_cluster, wait_for  # noqa: E402

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation  # noqa: E402
from kubegpu.kube.client import ApiError  # noqa: E402

SCHEDULER = "soak"
GPU = "nvidia.com/gpu"
P3 = {
    "node.kubernetes.io/instance-type": "p3.16xlarge",
    "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "16160",
}
NODES = 4
NODE_LABEL = "example.com/node"  # no kubelet sets kubernetes.io/hostname here


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) / 1024 if found else float("nan")


def durations(port: int) -> tuple[float, float]:
    """(sum, count) of the scheduler's scheduling_duration histogram."""
    http = urllib3.PoolManager()
    text = http.request("GET", f"http://127.0.0.1:{port}/metrics", timeout=5).data.decode()
    total = re.search(r"^kubegpu_scheduler_scheduling_duration_seconds_sum (\S+)", text, re.M)
    count = re.search(r"^kubegpu_scheduler_scheduling_duration_seconds_count (\S+)", text, re.M)
    return (float(total.group(1)) if total else 0.0, float(count.group(1)) if count else 0.0)


def pod_body(namespace: str, name: str, limits: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


def gpu_node(cluster: Cluster, name: str, labels: dict[str, str]) -> None:
    cluster.create_ready_node(name, labels={**P3, NODE_LABEL: name, **labels}, allocatable={GPU: 8})


class Tenant(threading.Thread):
    """Creates pods of ever new shapes, labels and namespaces; deletes the oldest past `live`."""

    def __init__(self, cluster: Cluster, live: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.live, self.rate = cluster, live, rate
        self.made = 0
        self.alive: list[tuple[str, str]] = []
        self.stop = threading.Event()
        self.pause = threading.Event()

    def one(self) -> None:
        i = self.made
        namespace = f"tenant-{i // 100}"
        if i % 100 == 0:
            self.cluster.create_namespace(namespace)
        limits = {"cpu": f"{100 + i % 997}m", "memory": f"{64 + i}Mi"}
        if i % 3 == 0:
            limits[GPU] = "1"
        if i % 10 == 7:
            limits[f"example.com/made-up-{i}"] = "1"
        name = f"p{i}"
        self.cluster.client.post(
            f"/api/v1/namespaces/{namespace}/pods", pod_body(namespace, name, limits, {"app": f"a{i}", f"k{i}": "v"})
        )
        self.alive.append((namespace, name))
        self.made += 1
        while len(self.alive) > self.live:
            old_namespace, old = self.alive.pop(0)
            with contextlib.suppress(ApiError):
                self.cluster.delete_pod(old_namespace, old)

    def run(self) -> None:
        while not self.stop.is_set():
            if self.pause.is_set():
                time.sleep(0.05)
                continue
            began = time.monotonic()
            try:
                self.one()
            except ApiError:
                time.sleep(0.2)  # the API server restarting
            if self.rate > 0:
                time.sleep(max(0.0, 1 / self.rate - (time.monotonic() - began)))


def held_twice(cluster: Cluster) -> list[str]:
    """GPUs two live pods hold on one node."""
    held: Counter[tuple[str, str]] = Counter()
    for pod in cluster.client.list("/api/v1/pods")[0]:
        raw = pod["metadata"].get("annotations", {}).get(ALLOCATION_KEY)
        if raw and pod["spec"].get("nodeName"):
            record = decode_allocation(raw)
            for resources in record.containers.values():
                held.update((record.node, i) for i in resources.get(GPU, ()))
    return [f"{node}:{gpu}" for (node, gpu), n in held.items() if n > 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--live", type=int, default=120)
    parser.add_argument("--rate", type=float, default=30, help="pods created a second (0: as fast as it can)")
    parser.add_argument("--log", type=Path, help="copy the scheduler's log there at the end")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as folder,
        running_cluster(Path(folder), "--watch-cache=false", "--etcd-compaction-interval=5s") as cluster,
    ):
        for n in range(NODES):
            gpu_node(cluster, f"n{n}", {})
        key = Path(folder) / "key"
        key.write_text(secrets.token_hex(32) + "\n")
        port = free_port()
        log = Path(folder) / "scheduler.log"
        command = [sys.executable, "-m", "kubegpu", "scheduler", "--kubeconfig", str(cluster.kubeconfig)]
        command += ["--scheduler-name", SCHEDULER, "--allocation-key-file", str(key)]
        command += ["--metrics-address", f"127.0.0.1:{port}", "--no-leader-elect"]  # stopped past its lease
        scheduler = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: durations(port), 60, "the scheduler's metrics")
            tenant = Tenant(cluster, args.live, args.rate)
            tenant.start()
            began = time.monotonic()
            end = began + args.minutes * 60
            stopped_once = False
            last = durations(port)
            tick, node_tick, auto = began, began, 0
            print("  t(s)  RSS MiB  pods made  mean ms/attempt (period)")
            while time.monotonic() < end:
                time.sleep(0.5)
                now = time.monotonic()
                if now - node_tick >= 5:
                    node_tick = now
                    cluster.client.patch(
                        "/api/v1/nodes/n0", {"metadata": {"labels": {"nvidia.com/gfd.timestamp": str(int(now))}}}
                    )
                    gpu_node(cluster, f"auto-{auto}", {"pool-id": str(auto)})
                    if auto:
                        cluster.client.delete(f"/api/v1/nodes/auto-{auto - 1}")
                    auto += 1
                if not stopped_once and now - began >= args.minutes * 30:
                    stopped_once = True
                    scheduler.send_signal(signal.SIGSTOP)
                    time.sleep(15)  # the tenant deletes and creates meanwhile
                    cluster.stop_apiserver()  # which ends the watches: a new server's cache starts past them
                    cluster.start_apiserver()
                    scheduler.send_signal(signal.SIGCONT)
                    print("  (scheduler stopped 15 s across an API server restart, continued)")
                if now - tick >= 10:
                    tick = now
                    current = durations(port)
                    spent, attempts = current[0] - last[0], current[1] - last[1]
                    last = current
                    mean = 1000 * spent / attempts if attempts else float("nan")
                    rss = rss_mib(scheduler.pid)
                    print(f"{now - began:6.0f}  {rss:7.1f}  {tenant.made:9d}  {mean:6.2f} ({attempts:.0f})", flush=True)
            tenant.stop.set()
            tenant.join()
            twice = held_twice(cluster)
            for pod in cluster.client.list("/api/v1/pods")[0]:
                cluster.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
            cluster.create_namespace("last")
            nodes = [f"n{n}" for n in range(NODES)] + [f"auto-{auto - 1}"]
            for name in nodes:
                cluster.client.post(
                    "/api/v1/namespaces/last/pods",
                    {
                        **pod_body("last", f"all-{name}", {GPU: "8"}, {}),
                        "spec": {
                            "schedulerName": SCHEDULER,
                            "nodeSelector": {NODE_LABEL: name},
                            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {GPU: "8"}}}],
                        },
                    },
                )
            wait_for(
                lambda: all(p["spec"].get("nodeName") for p in cluster.pods("last")),
                60,
                "a pod of all 8 GPUs bound on every node",
            )
            relists = log.read_text(errors="replace").count("relisting")
            print(f"pods made {tenant.made}; GPUs held twice: {twice or 'none'}; relists logged: {relists}")
            print(f"every node took a pod of its 8 GPUs; final RSS {rss_mib(scheduler.pid):.1f} MiB")
        except AssertionError:
            for pod in cluster.pods("last"):
                conditions = pod.get("status", {}).get("conditions") or [{}]
                print(pod["metadata"]["name"], pod["spec"].get("nodeName"), conditions[0].get("message"))
            raise
        finally:
            scheduler.send_signal(signal.SIGCONT)
            scheduler.terminate()
            scheduler.wait(timeout=30)
            if args.log:
                args.log.write_bytes(log.read_bytes())


if __name__ == "__main__":
    main()
