"""A scheduler that was not watching while pods came and went learns it from its lists, on the real API server and etcd.

The story: `kubegpu scheduler` binds a pod of 4 of a node's 8 GPUs, then stops (SIGSTOP: a long pause, a node under
memory pressure, a partition), and the API server restarts, cutting every watch. Meanwhile that pod is deleted, a pod
asking all 8 GPUs is created, and etcd is compacted (kube-apiserver does it every 5 minutes, so the events in between
are gone from its history). The scheduler resumes: its informers list again (a cut watch is never resumed from its old
version), and from the lists alone it must learn that the first pod is gone and its GPUs free: the second pod binds, and
no GPU is held twice. (A watch that ends cleanly is resumed from its version, and a `410 Gone` then relists too: the API
server's watch timeout is the client's 300 s, too long for a test; `tests/kube/` holds it.)
"""

from __future__ import annotations

import base64
import signal
from pathlib import Path

import orjson
import urllib3

from .cluster import Cluster, free_port, running_cluster, wait_for
from .conftest import SchedulerProcess
from .test_scheduler import P3, bound, devices_by_node


def compact_etcd(cluster: Cluster) -> int:
    """Compact etcd at its current revision through its JSON gateway (etcd 3.4's `/v3/`); the revision."""
    http = urllib3.PoolManager()
    base = f"http://127.0.0.1:{cluster.etcd_port}/v3/kv"
    answer = http.request("POST", f"{base}/range", body=orjson.dumps({"key": base64.b64encode(b"/").decode()}))
    revision = int(orjson.loads(answer.data)["header"]["revision"])
    done = http.request("POST", f"{base}/compaction", body=orjson.dumps({"revision": str(revision), "physical": True}))
    assert done.status == 200, done.data
    return revision


def test_a_scheduler_whose_watches_were_cut_learns_from_its_lists_what_changed_meanwhile(
    tmp_path: Path, key_file: Path
) -> None:
    with running_cluster(tmp_path / "k8s", "--watch-cache=false") as cluster:
        namespace = cluster.create_namespace("relist")
        cluster.create_ready_node("p3-relist", labels=P3, allocatable={"nvidia.com/gpu": 8})
        port = free_port()
        scheduler = SchedulerProcess(
            [
                "--kubeconfig", str(cluster.kubeconfig), "--scheduler-name", "kubegpu",
                "--allocation-key-file", str(key_file), "--metrics-address", f"127.0.0.1:{port}", "--no-leader-elect",
            ],
            tmp_path / "scheduler.log",
            port,
        )  # fmt: skip
        try:
            cluster.create_pod(namespace, "first", {"main": {"nvidia.com/gpu": 4}}, scheduler="kubegpu")
            wait_for(lambda: "first" in bound(cluster, namespace), 60, "the first pod bound")

            # The watches are cut before anything changes: what changes next reaches no watch, not even through
            # the socket buffers of a stopped process.
            scheduler.process.send_signal(signal.SIGSTOP)
            cluster.stop_apiserver()
            cluster.start_apiserver()
            cluster.delete_pod(namespace, "first")
            cluster.create_pod(namespace, "whole", {"main": {"nvidia.com/gpu": 8}}, scheduler="kubegpu")
            compact_etcd(cluster)
            scheduler.process.send_signal(signal.SIGCONT)

            placed = wait_for(lambda: bound(cluster, namespace).get("whole") and bound(cluster, namespace), 90,
                              "the pod of all 8 GPUs bound once the scheduler relisted")  # fmt: skip
            assert set(placed) == {"whole"}
            held = devices_by_node(placed)["p3-relist"]
            assert len(held) == 8 and all(n == 1 for n in held.values()), held
            assert "informer pods: WATCH /api/v1/pods" in scheduler.output(), "the pods' watch was never cut"
            assert scheduler.process.poll() is None
        finally:
            scheduler.process.send_signal(signal.SIGCONT)
            scheduler.kill(signal.SIGTERM)
