"""`kubegpu extender` restarted while kube-scheduler keeps calling it, on the real API server.

A restarted extender listens at once and lists the cluster after. kube-scheduler can reach it in between: through
a direct `urlPrefix`, or through its Service before the kubelet's readiness probe has taken the restarted container
(same pod IP) out of the endpoints. The verbs must not be answered from a ledger that does not yet know which
devices the bound pods hold.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import urllib3

from .cluster import Cluster, free_port, wait_for
from .stall import StallingProxy
from .test_extender import Process
from .test_scheduler import P3, bound, devices_by_node

NODE = "p3-restart"


def start_extender(cluster: Cluster, key_file: Path, log: Path, kubeconfig: Path) -> tuple[Process, str]:
    port = free_port()
    command = [sys.executable, "-m", "kubegpu", "extender", "--kubeconfig", str(kubeconfig), "--listen",
               f"127.0.0.1:{port}", "--allocation-key-file", str(key_file), "--insecure-no-client-auth"]  # fmt: skip
    return Process(command, log), f"http://127.0.0.1:{port}"


def test_a_restarted_extender_binds_nothing_before_it_has_listed_the_pods_holding_devices(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path
) -> None:
    """Pod `first` holds all 8 GPUs of the node, bound by the extender before its restart. The restarted extender's
    pod list is slow (held in a proxy, as a large cluster's list takes seconds) and it is asked meanwhile to bind
    `second` (8 GPUs) there: it used to bind it at once, every GPU then held by both pods; now it answers "still
    listing" until it knows, then "no longer fits"."""
    cluster.create_ready_node(NODE, labels=P3, allocatable={"nvidia.com/gpu": 8})
    gpus = {"main": {"nvidia.com/gpu": 8}}
    uids = {name: cluster.create_pod(namespace, name, gpus, scheduler="nobody")["metadata"]["uid"]
            for name in ("first", "second")}  # fmt: skip
    http = urllib3.PoolManager()

    def bind(url: str, name: str) -> str:
        body = {"PodName": name, "PodNamespace": namespace, "PodUID": uids[name], "Node": NODE}
        answer = http.request("POST", f"{url}/bind", body=orjson.dumps(body), retries=False, timeout=5.0)
        return str(orjson.loads(answer.data)["Error"])

    def readyz(url: str) -> int:
        return int(http.request("GET", f"{url}/readyz", timeout=1.0, retries=False).status)

    def syncing(url: str) -> str:
        return str(orjson.loads(http.request("GET", f"{url}/readyz", timeout=1.0, retries=False).data)["status"])

    extender, url = start_extender(cluster, key_file, tmp_path / "before.log", cluster.kubeconfig)
    try:
        wait_for(lambda: readyz(url) == 200, 30, "the extender's informers to list")
        assert bind(url, "first") == ""
    finally:
        extender.stop()
    wait_for(lambda: "first" in bound(cluster, namespace), 10, "the first pod's Binding")

    proxy = StallingProxy(cluster, lists=True)
    proxy.hold()
    extender, url = start_extender(cluster, key_file, tmp_path / "after.log", proxy.kubeconfig(cluster, tmp_path / "k"))
    try:
        wait_for(lambda: syncing(url).startswith("syncing pods"), 30, "the restarted extender to list the nodes")
        while_listing = bind(url, "second")
        proxy.release()
        wait_for(lambda: readyz(url) == 200, 30, "the restarted extender to list the pods")
        once_listed = bind(url, "second")
    finally:
        extender.stop()
        proxy.close()
    placed = bound(cluster, namespace)
    doubles = {node: [d for d, n in devices.items() if n > 1] for node, devices in devices_by_node(placed).items()}
    assert "second" not in placed, f"bound beside the first pod, devices held twice: {doubles}"
    assert "still listing the cluster (pods)" in while_listing, while_listing
    assert "no longer fits" in once_listed, once_listed
