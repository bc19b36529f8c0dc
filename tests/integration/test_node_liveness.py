"""Node liveness on the real API server: when a node's `kubegpu advertise` dies, `kubegpu scheduler` stops placing
device pods there within the Lease's duration plus one resync tick, says why in the pod's FailedScheduling event,
keeps placing pods that request no device, and places the waiting device pod once the advertiser is back.

The advertiser renews `kube-node-lease/kubegpu-NODE` every second with a 3 s duration (the defaults are 8 s and 2 s);
the scheduler runs with the default `--node-leases auto`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.testing import FakeHost
from kubegpu.kube.client import ApiError
from kubegpu.scheduler.liveness import TICK

from .cluster import Cluster, wait_for
from .conftest import SchedulerProcess

DEVICE = "aws.amazon.com/neurondevice"
DURATION, RENEW = 3, 1


class Advertiser:
    """`kubegpu advertise` for one node as a long-running process, as its DaemonSet runs it."""

    def __init__(self, cluster: Cluster, node: str, host: FakeHost, log: Path) -> None:
        self.args = [
            sys.executable, "-m", "kubegpu.crishim.advertise", "--kubeconfig", str(cluster.kubeconfig),
            "--node-name", node, "--host-root", str(host.root), "--interval", "5s",
            "--lease-duration", f"{DURATION}s", "--lease-renew-interval", f"{RENEW}s",
        ]  # fmt: skip
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PATH": str(Path(sys.executable).parent), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(self.args, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def node(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[str, Advertiser]]:
    name = f"live-{secrets.token_hex(3)}"
    cluster.create_ready_node(
        name, labels={"node.kubernetes.io/instance-type": "trn1.32xlarge"}, allocatable={DEVICE: 16}
    )
    host = FakeHost(tmp_path / "host")
    for d in range(16):
        host.add_device_file(f"neuron{d}")
    advertiser = Advertiser(cluster, name, host, tmp_path / "advertise.log")
    try:
        yield name, advertiser
    finally:
        advertiser.kill()
        with contextlib.suppress(ApiError):
            cluster.client.delete(f"/api/v1/nodes/{name}")


def manifest(name: str, node: str, scheduler: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": resources}}],
        },
    }


def bound_to(cluster: Cluster, namespace: str, name: str) -> str | None:
    node: str | None = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")["spec"].get("nodeName")
    return node


def test_a_dead_advertiser_takes_its_node_out_of_service_for_device_pods_and_back(
    cluster: Cluster, namespace: str, node: tuple[str, Advertiser], start_scheduler: Any
) -> None:
    name, advertiser = node
    cluster.client.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {"kubernetes.io/hostname": name}}})
    advertiser.start()
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/kubegpu-{name}"

    def lease() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = cluster.client.get(lease_path)
        except ApiError:
            return None
        return found

    created = wait_for(lease, 30, f"the advertiser's Lease {lease_path}")
    assert created["spec"]["holderIdentity"] == name and created["spec"]["leaseDurationSeconds"] == DURATION
    scheduler: SchedulerProcess = start_scheduler("kubegpu-live", "--no-leader-elect")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    cluster.client.post(pods, manifest("before", name, "kubegpu-live", {DEVICE: 4}))
    assert wait_for(lambda: bound_to(cluster, namespace, "before"), 30, "the first pod bound") == name

    advertiser.kill()
    died = time.monotonic()
    marker = f"node={name}"
    wait_for(
        lambda: any("node is not live" in line and marker in line for line in scheduler.output().splitlines()),
        DURATION + TICK + 10,
        "the scheduler to take the node out of service",
    )
    out_of_service = time.monotonic() - died
    # The last renewal was at most RENEW before the kill; informer and loop latency are well under a second.
    assert out_of_service <= DURATION + TICK + 1.0, out_of_service

    cluster.client.post(pods, manifest("waiting", name, "kubegpu-live", {DEVICE: 4}))
    cluster.client.post(pods, manifest("web", name, "kubegpu-live", {"cpu": "100m"}))
    assert wait_for(lambda: bound_to(cluster, namespace, "web"), 30, "the cpu-only pod bound") == name

    def refusal() -> str | None:
        for event in cluster.events(namespace):
            if event["involvedObject"]["name"] == "waiting" and event["reason"] == "FailedScheduling":
                return str(event["message"])
        return None

    message = wait_for(refusal, 30, "the device pod's FailedScheduling event")
    assert f"1 node(s) had an expired kubegpu node lease (kube-node-lease/kubegpu-{name}, last renewed " in message
    assert bound_to(cluster, namespace, "waiting") is None
    assert bound_to(cluster, namespace, "before") == name  # running pods are left alone

    advertiser.start()
    back = time.monotonic()
    assert wait_for(lambda: bound_to(cluster, namespace, "waiting"), 30, "the device pod bound once back") == name
    restored = time.monotonic() - back
    print(f"\nout of service {out_of_service:.2f}s after the advertiser died (lease {DURATION}s, tick {TICK}s); "
          f"device pod bound {restored:.2f}s after it restarted")  # fmt: skip
    scheduler.kill(signal.SIGTERM)
