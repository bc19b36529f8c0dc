"""A node selector term the real kube-scheduler 1.20.2 cannot read selects no node, and kubegpu agrees.

The API server admits `NotIn: ["a b"]` (it checks a requirement's key and operator, not its values), but
kube-scheduler builds a label selector from each term and skips a term that fails (`a b` is not a label value):
the pod stays pending although every node lacks the value. Both schedulers run side by side on the same nodes, each
taking the pods that name it; each pod's fate is the same under both.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .cluster import Cluster, config_flag, free_port, process, wait_for

ZONE = "topology.kubernetes.io/zone"


def terms(*expressions: dict[str, Any]) -> dict[str, Any]:
    selector = {"nodeSelectorTerms": [{"matchExpressions": [e]} for e in expressions]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}


PODS = {
    # Every node lacks the value, yet the term selects none: "a b" is not a label value.
    "unreadable": terms({"key": ZONE, "operator": "NotIn", "values": ["a", "a b"]}),
    # The same rule, readable: zone b.
    "readable": terms({"key": ZONE, "operator": "NotIn", "values": ["a"]}),
    # Terms are ORed: the unreadable one is skipped, the next one holds.
    "second-term": terms(
        {"key": ZONE, "operator": "NotIn", "values": ["x y"]}, {"key": ZONE, "operator": "In", "values": ["b"]}
    ),
}


def create(cluster: Cluster, namespace: str, scheduler: str) -> None:
    for name, affinity in PODS.items():
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{scheduler}-{name}"},
            "spec": {
                "schedulerName": scheduler,
                "affinity": affinity,
                "containers": [{"name": "m", "image": "busybox"}],
            },
        }
        cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", body)


def test_an_unreadable_term_selects_no_node_under_either_scheduler(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path
) -> None:
    for name, zone in (("zone-a", "a"), ("zone-b", "b")):
        cluster.create_ready_node(name, labels={ZONE: zone, "kubernetes.io/hostname": name})
    config = tmp_path / "kube-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1beta1\nkind: KubeSchedulerConfiguration\n"
        f"clientConnection:\n  kubeconfig: {cluster.kubeconfig}\n"
        "leaderElection:\n  leaderElect: false\nprofiles:\n- schedulerName: kube\n"
    )
    kube = [str(cluster.bin / "kube-scheduler"), config_flag(config), "--port=0", f"--secure-port={free_port()}",
            "--bind-address=127.0.0.1", f"--cert-dir={tmp_path / 'ks-certs'}",
            "--authentication-tolerate-lookup-failure", "-v=1"]  # fmt: skip
    ours = [sys.executable, "-m", "kubegpu", "scheduler", "--kubeconfig", str(cluster.kubeconfig),
            "--scheduler-name", "kubegpu", "--allocation-key-file", str(key_file), "--no-leader-elect",
            "--metrics-address", f"127.0.0.1:{free_port()}", "--node-leases", "off"]  # fmt: skip
    with process(kube, tmp_path / "kube-scheduler.log"), process(ours, tmp_path / "kubegpu.log"):
        for scheduler in ("kube", "kubegpu"):
            create(cluster, namespace, scheduler)

        def settled() -> dict[str, str] | None:
            placed = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in cluster.pods(namespace)}
            refused = {
                e["involvedObject"]["name"]: e["message"]
                for e in cluster.events(namespace)
                if e.get("reason") == "FailedScheduling"
            }
            if all(placed.get(f"{s}-readable") and placed.get(f"{s}-second-term") for s in ("kube", "kubegpu")) and all(
                f"{s}-unreadable" in refused for s in ("kube", "kubegpu")
            ):
                return {**placed, **{f"{name} refused": message for name, message in refused.items()}}
            return None

        outcome = wait_for(settled, 90, "both schedulers to place the readable pods and refuse the unreadable one")
    for scheduler in ("kube", "kubegpu"):
        assert outcome[f"{scheduler}-readable"] == "zone-b"
        assert outcome[f"{scheduler}-second-term"] == "zone-b"
        assert outcome[f"{scheduler}-unreadable"] == ""
        # kube-scheduler 1.20.2 words it "didn't match Pod's node affinity", kubegpu "didn't match node selector".
        assert outcome[f"{scheduler}-unreadable refused"].startswith("0/2 nodes are available: 2 node(s) didn't match")
