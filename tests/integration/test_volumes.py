"""`kubegpu scheduler` and PersistentVolumeClaims on a real kube-apiserver (VolumeBinding).

No PV controller runs here, so the test does its writes: it creates the volume, sets the claim's `spec.volumeName`
(allowed once, as the controller does) and the claim's `status.phase` through the status subresource. What an
operator sees: a pod goes to the node its volume is on, a pod whose claim is not bound waits with a reason naming the
claim, and binding the claim lets it schedule without restarting anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kubegpu.kube.client import ApiError

from .cluster import Cluster, wait_for

HOST = "kubernetes.io/hostname"


@pytest.fixture
def volumes(cluster: Cluster) -> Iterator[list[str]]:
    """PersistentVolumes are cluster-wide and protected by a finalizer no controller removes here: the test's go."""
    created: list[str] = []
    yield created
    for name in created:
        with contextlib.suppress(ApiError):
            cluster.client.patch(f"/api/v1/persistentvolumes/{name}", {"metadata": {"finalizers": None}})
            cluster.client.delete(f"/api/v1/persistentvolumes/{name}")


def create_volume(cluster: Cluster, volumes: list[str], name: str, node: str) -> None:
    term = {"matchExpressions": [{"key": HOST, "operator": "In", "values": [node]}]}
    cluster.client.post(
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "local": {"path": "/mnt/data"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
            },
        },
    )
    volumes.append(name)


def create_claim(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.client.post(
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )


def bind_claim(cluster: Cluster, namespace: str, claim: str, volume: str) -> None:
    """The PV controller's two writes: the claim names its volume, then its status says Bound."""
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"
    cluster.client.patch(path, {"spec": {"volumeName": volume}})
    cluster.client.patch(f"{path}/status", {"status": {"phase": "Bound"}})


def create_pod_with_claim(cluster: Cluster, namespace: str, name: str, claim: str) -> None:
    cluster.client.post(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "kubegpu",
                "containers": [{"name": "main", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        },
    )


def node_of(cluster: Cluster, namespace: str, name: str) -> str | None:
    pod = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    node: str | None = pod["spec"].get("nodeName")
    return node


def test_pods_follow_their_bound_volume_and_an_unbound_claim_waits_until_it_is_bound(
    cluster: Cluster, namespace: str, start_scheduler: Any, volumes: list[str]
) -> None:
    for node in ("vol-x", "vol-y", "vol-z"):
        cluster.create_ready_node(node, labels={HOST: node})
    here, later = f"{namespace}-y"[-60:], f"{namespace}-z"[-60:]
    create_volume(cluster, volumes, here, "vol-y")
    create_claim(cluster, namespace, "data")
    bind_claim(cluster, namespace, "data", here)
    create_claim(cluster, namespace, "scratch")
    scheduler = start_scheduler("kubegpu", "--no-leader-elect")

    # Three pods share the bound claim: each goes to vol-y, the only node its volume reaches.
    for i in range(3):
        create_pod_with_claim(cluster, namespace, f"db-{i}", "data")

    def placed(name: str) -> Callable[[], str | None]:
        return lambda: node_of(cluster, namespace, name)

    for name in ("db-0", "db-1", "db-2"):
        assert wait_for(placed(name), 30, f"{name} bound") == "vol-y"

    # A pod whose claim has no volume yet stays pending, told which claim holds it back.
    create_pod_with_claim(cluster, namespace, "worker", "scratch")

    def refusal() -> str | None:
        events = [e for e in cluster.events(namespace) if e["involvedObject"]["name"] == "worker"]
        return next((e["message"] for e in events if e["reason"] == "FailedScheduling"), None)

    message = wait_for(refusal, 30, "a FailedScheduling event for worker")
    assert message.startswith("0/3 nodes are available: 3 pod has unbound immediate PersistentVolumeClaims")
    assert "'scratch'" in message
    assert node_of(cluster, namespace, "worker") is None

    # The claim is bound to a volume on vol-z: the pod is scheduled there, the scheduler still the same process.
    create_volume(cluster, volumes, later, "vol-z")
    bind_claim(cluster, namespace, "scratch", later)
    assert wait_for(lambda: node_of(cluster, namespace, "worker"), 30, "worker bound") == "vol-z"
    assert scheduler.process.poll() is None
    assert "forbidden" not in scheduler.output().lower()
