"""Benchmark: pod start latency through a real kubelet 1.20 with `kubegpu crishim` vs straight to containerd.

Two nodes side by side in one run, on one machine: node `via-shim` (kubelet -> `kubegpu crishim` -> containerd) and
node `direct` (kubelet -> its own containerd). Each pod is created unscheduled and then bound with a Binding that
carries a signed four-device Neuron allocation for its UID (as kubegpu's scheduler and extender bind); pods alternate
between the two nodes, so both paths see the same load. Latency = from the Binding to the pod's phase Running as
read from the API server (polled every 20 ms). Through the shim the allocation is verified and the container gets its
devices; straight to containerd the same pod runs unedited.

Goal: through the shim at most 1.05 times the direct median.

    KUBEGPU_K8S_BIN=... KUBEGPU_BUSYBOX_OCI=... .venv/bin/python benchmarks/kubelet_start_bench.py [--pods 15]
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord, encode_allocation, sign_allocation  # noqa: E402
from tests.integration.cluster import running_cluster, wait_for  # noqa: E402
from tests.integration.containerd import make_char_devices, running_containerd, start_shim_process  # noqa: E402
from tests.integration.kubelet import Kubelet, pod  # noqa: E402

NEURON = "aws.amazon.com/neurondevice"
ROWS = [[str(i) for i in range(r * 4, r * 4 + 4)] for r in range(4)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=15, help="pods per node")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kubegpu-ksb-"))
    key = secrets.token_hex(32).encode()
    (work / "allocation.key").write_bytes(key + b"\n")
    make_char_devices(work / "dev", [f"neuron{i}" for i in range(16)])
    (work / "out").mkdir()
    times: dict[str, list[float]] = {"via-shim": [], "direct": []}
    try:
        with (
            running_cluster(work / "k8s") as cluster,
            running_containerd(cni_subnet="10.88.213.0/24") as shimmed,
            running_containerd(cni_subnet="10.88.214.0/24") as plain,
        ):
            shim = start_shim_process(
                socket=work / "cri.sock", runtime_endpoint=shimmed.endpoint, node_name="via-shim",
                key_file=work / "allocation.key", dev_root=work / "dev", log=work / "shim.log",
            )  # fmt: skip
            nodes = {
                "via-shim": Kubelet(cluster, "via-shim", shim.endpoint),
                "direct": Kubelet(cluster, "direct", plain.endpoint),
            }
            try:
                for node in nodes.values():
                    node.start()
                    cluster.client.patch(f"/api/v1/nodes/{node.name}/status", {"status": {"capacity": {NEURON: "16"}}})
                namespace = cluster.create_namespace("bench")
                for n in range(args.pods):
                    for name in ("via-shim", "direct"):
                        pod_name = f"{name}-{n}"
                        manifest = pod(namespace, pod_name, {"main": {NEURON: 4}}, scheduler="none", out=work / "out")
                        created = cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
                        uid = created["metadata"]["uid"]
                        containers = {"main": {NEURON: ROWS[n % 4]}}
                        record = sign_allocation(
                            AllocationRecord(
                                version=1, node=name, podUID=uid, containers=containers, issued=time.time_ns()
                            ),
                            key,
                        )
                        binding = {
                            "apiVersion": "v1", "kind": "Binding",
                            "metadata": {
                                "name": pod_name, "uid": uid, "annotations": {ALLOCATION_KEY: encode_allocation(record)}
                            },
                            "target": {"apiVersion": "v1", "kind": "Node", "name": name},
                        }  # fmt: skip
                        started = time.perf_counter()
                        cluster.client.post(f"/api/v1/namespaces/{namespace}/pods/{pod_name}/binding", binding)
                        path = f"/api/v1/namespaces/{namespace}/pods/{pod_name}"
                        try:
                            wait_for(
                                lambda p=path: cluster.client.get(p)["status"].get("phase") == "Running",
                                60, f"{pod_name} Running", interval=0.02,
                            )  # fmt: skip
                        except AssertionError:
                            print(cluster.client.get(path)["status"], shim.output()[-2000:], sep="\n")
                            print([e.get("message") for e in cluster.events(namespace)][-5:])
                            raise
                        times[name].append(time.perf_counter() - started)
                        cluster.delete_pod(namespace, f"{name}-{n - 1}") if n else None
            finally:
                for node in nodes.values():
                    node.close()
                shim.terminate()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, values in times.items():
        median, worst = statistics.median(values) * 1000, max(values) * 1000
        print(f"{name:>9}: n={len(values)} median {median:.0f} ms, max {worst:.0f} ms")
    ratio = statistics.median(times["via-shim"]) / statistics.median(times["direct"])
    print(f"pod start latency ratio (shim / direct, medians): {ratio:.3f} (goal <= 1.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
