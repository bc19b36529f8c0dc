"""Benchmark: kube-scheduler 1.20.2 alone vs kube-scheduler with `kubegpu extender`, side by side on one API server.

1000 fake Ready trn1.32xlarge nodes; 3000 pending pods requesting `aws.amazon.com/neurondevice: 1` are scheduled by
kube-scheduler alone, then (fresh pods) by kube-scheduler configured with the kubegpu extender (filter, prioritize
and bind; `nodeCacheCapable: true`), then by kube-scheduler with the null extender (`null_extender.py`: passes every
node, scores none, posts the Binding, keeps no state: the floor any HTTP extender starts from), all with client
QPS/burst 1000, timed from the scheduler's launch to the last Binding, in rotating order over several rounds. Each
extender runs only during its own run. Then the extender's filter latency is probed directly: p50/p99 of `/filter`
calls naming all 1000 nodes.

    .venv/bin/python benchmarks/extender_bench.py [--nodes 1000] [--pods 3000]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import urllib3

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from integration.cluster import Cluster, config_flag, free_port, running_cluster, wait_for  # noqa: E402
from scheduler_bench import add_trn1_nodes, clear_pods, make_pods, run_scheduler  # noqa: E402

GOAL = 0.5


def scheduler_command(cluster: Cluster, work: Path, qps: int, extender: str | None, name: str) -> list[str]:
    config = work / f"{name}.yaml"
    text = (
        "apiVersion: kubescheduler.config.k8s.io/v1beta1\nkind: KubeSchedulerConfiguration\n"
        f"clientConnection:\n  kubeconfig: {cluster.kubeconfig}\n  qps: {qps}\n  burst: {qps}\n"
        f"leaderElection:\n  leaderElect: false\nprofiles:\n- schedulerName: {name}\n"
    )
    if extender:
        text += (
            f"extenders:\n- urlPrefix: {extender}\n  filterVerb: filter\n  prioritizeVerb: prioritize\n"
            "  bindVerb: bind\n  weight: 1\n  nodeCacheCapable: true\n  ignorable: false\n"
            "  managedResources:\n  - name: aws.amazon.com/neurondevice\n    ignoredByScheduler: false\n"
        )
    config.write_text(text)
    return [
        str(cluster.bin / "kube-scheduler"), config_flag(config), "--port=0", f"--secure-port={free_port()}",
        "--bind-address=127.0.0.1", f"--cert-dir={work / (name + '-certs')}",
        "--authentication-tolerate-lookup-failure", "-v=1",
    ]  # fmt: skip


LABELS = {
    "alone": "kube-scheduler alone",
    "kubegpu": "kube-scheduler + kubegpu extender",
    "null": "kube-scheduler + null extender",
}


def start_extender(cluster: Cluster, work: Path, who: str, qps: int) -> tuple[subprocess.Popen[bytes], str]:
    """`kubegpu extender` (or the null extender), started for one run and ready before the clock starts."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    common = ["--kubeconfig", str(cluster.kubeconfig), "--listen", f"127.0.0.1:{port}", "--kube-api-qps", str(qps)]
    if who == "kubegpu":
        # Plain HTTP on loopback, as the null extender serves it, so that the two compare like for like.
        command = [sys.executable, "-m", "kubegpu", "extender", *common, "--allocation-key-file", str(work / "key"),
                   "--kube-api-burst", str(qps), "--log-level", "warning", "--insecure-no-client-auth"]  # fmt: skip
    else:
        command = [sys.executable, str(HERE / "null_extender.py"), *common]
    process = subprocess.Popen(command, stdout=(work / f"{who}.log").open("ab"), stderr=subprocess.STDOUT)
    http = urllib3.PoolManager()
    wait_for(lambda: http.request("GET", f"{url}/readyz", timeout=1.0).status == 200, 60, f"the {who} extender")
    return process, url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--qps", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every configuration, in rotating order")
    args = parser.parse_args()
    one_device = [{"aws.amazon.com/neurondevice": 1}]
    with tempfile.TemporaryDirectory() as tmp, running_cluster(Path(tmp) / "k8s") as cluster:
        work = Path(tmp)
        cluster.client.limiter.qps = 0
        add_trn1_nodes(cluster, args.nodes)
        (work / "key").write_text(secrets.token_hex(32))
        rates: dict[str, list[float]] = {who: [] for who in LABELS}
        for round_ in range(args.rounds):
            # Rotate who goes first: a later run finds a larger etcd.
            order = list(LABELS)[round_ % 3 :] + list(LABELS)[: round_ % 3]
            for who in order:
                name = f"{who}-{round_}"
                make_pods(cluster, f"bench-{name}", args.pods, name, one_device)
                # Each extender runs only during its own run, so that no idle process takes CPU from the others.
                extender, url = start_extender(cluster, work, who, args.qps) if who != "alone" else (None, None)
                try:
                    command = scheduler_command(cluster, work, args.qps, url, name)
                    seconds, _ = run_scheduler(cluster, command, f"bench-{name}", args.pods, work / f"{name}.log")
                finally:
                    if extender is not None:
                        extender.terminate()
                        extender.wait(timeout=30)
                clear_pods(cluster, f"bench-{name}")
                rates[who].append(args.pods / seconds)
                print(f"  round {round_ + 1}: {LABELS[who]:34} {seconds:6.1f} s  {args.pods / seconds:7.1f} pods/s")
        extender, url = start_extender(cluster, work, "kubegpu", args.qps)
        try:
            latencies = probe_filter(url, args.nodes, args.probes)
        finally:
            extender.terminate()
            extender.wait(timeout=30)
    median = {who: statistics.median(values) for who, values in rates.items()}
    print(
        f"\n{args.pods} pods x neurondevice: 1 on {args.nodes} nodes, client QPS/burst {args.qps}, "
        f"median of {args.rounds} rounds: alone {median['alone']:.1f} pods/s, with the kubegpu extender "
        f"{median['kubegpu']:.1f} pods/s, with the null extender {median['null']:.1f} pods/s"
    )
    ratio = median["kubegpu"] / median["alone"]
    rounds = ", ".join(f"{k / a:.2f}" for k, a in zip(rates["kubegpu"], rates["alone"], strict=True))
    print(f"  with the kubegpu extender / alone: {ratio:.2f}x (goal >= {GOAL}x; a typical HTTP extender: 0.11x); "
          f"round by round {rounds}")  # fmt: skip
    print(
        f"  the floor, with the null extender / alone: {median['null'] / median['alone']:.2f}x; kubegpu reaches "
        f"{median['kubegpu'] / median['null']:.2f} of it"
    )
    print(
        f"  /filter over {args.nodes} node names: p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {latencies[int(0.99 * (len(latencies) - 1))] * 1000:.1f} ms ({args.probes} calls)"
    )
    return 0


def probe_filter(url: str, nodes: int, probes: int) -> list[float]:
    """Latencies of `/filter` calls naming every node, sorted."""
    http = urllib3.PoolManager()
    body = orjson.dumps({
        "Pod": {"metadata": {"name": "probe", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {
                    "aws.amazon.com/neurondevice": "1"}}}]}},
        "NodeNames": [f"trn1-{i:04d}" for i in range(nodes)],
    })  # fmt: skip
    latencies = []
    for _ in range(probes):
        started = time.perf_counter()
        response = http.request("POST", f"{url}/filter", body=body)
        latencies.append(time.perf_counter() - started)
        assert response.status == 200
    return sorted(latencies)


if __name__ == "__main__":
    raise SystemExit(main())
