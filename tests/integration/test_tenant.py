"""A tenant against `kubegpu scheduler` on a real kube-apiserver: what one namespace's owner can and cannot do.

The tenant is a user whose RBAC allows pods in one namespace and nothing else; the test acts as that user through
the API server's impersonation, so every object below passed real authorization and admission. Whatever the tenant
writes into its pods (annotations, quantities, `spec.nodeName`), the scheduler stays up, other pods bind in normal
time, and no device is ever held by two live pods.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    AllocationRecord,
    decode_allocation,
    sign_allocation,
    verify_allocation,
)
from kubegpu.kube.client import ApiError, KubeClient

from .cluster import Cluster, wait_for

TRN1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
P3 = {
    "node.kubernetes.io/instance-type": "p3.16xlarge",
    "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "16160",
}
NEURON = "aws.amazon.com/neurondevice"
TENANT = "tenant-a"


@pytest.fixture
def tenant(cluster: Cluster, namespace: str) -> KubeClient:
    """A client acting as a user who may manage pods in `namespace` only."""
    admin = cluster.client
    admin.post(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-owner"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }
            ],
        },
    )
    admin.post(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-owner"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-owner"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}],
        },
    )
    client = KubeClient(admin.credentials)
    client.headers["Impersonate-User"] = TENANT
    with pytest.raises(ApiError) as refused:
        client.get("/api/v1/namespaces/default/pods")
    assert refused.value.status == 403, "the tenant must not reach other namespaces"
    return client


def tenant_pod(
    client: KubeClient,
    namespace: str,
    name: str,
    limits: dict[str, Any],
    *,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    scheduler: str = "kubegpu",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
    }
    if node:
        spec["nodeName"] = node  # bound at creation, past every scheduler: the kubelet would run it
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }
    pod: dict[str, Any] = client.post(f"/api/v1/namespaces/{namespace}/pods", body)
    return pod


def node_of(cluster: Cluster, namespace: str, name: str) -> str | None:
    pod = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    node: str | None = pod["spec"].get("nodeName")
    return node


def wait_node(cluster: Cluster, namespace: str, name: str, timeout: float = 30.0) -> str:
    node: str = wait_for(lambda: node_of(cluster, namespace, name), timeout, f"{namespace}/{name} to be bound")
    return node


def wait_ready(scheduler: Any) -> None:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{scheduler.metrics_port}/readyz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    wait_for(ready, 30, "the scheduler's /readyz")


def verified_holders(cluster: Cluster, key: bytes) -> dict[str, Counter[str]]:
    """node -> device -> how many live pods hold it by a verified allocation (what the CRI shim would apply)."""
    held: dict[str, Counter[str]] = {}
    for pod in cluster.client.list("/api/v1/pods")[0]:
        raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_KEY)
        node = pod["spec"].get("nodeName")
        if raw is None or node is None or pod["metadata"].get("deletionTimestamp"):
            continue
        try:
            record = decode_allocation(raw)
        except ValueError:
            continue
        if not verify_allocation(record, key) or record.node != node or record.podUID != pod["metadata"]["uid"]:
            continue
        counter = held.setdefault(node, Counter())
        for resources in record.containers.values():
            for resource, ids in resources.items():
                counter.update(f"{resource}:{i}" for i in ids)
    return held


def assert_no_device_shared(cluster: Cluster, key: bytes) -> None:
    for node, devices in verified_holders(cluster, key).items():
        shared = sorted(d for d, n in devices.items() if n > 1)
        assert not shared, f"{node}: devices held by two live pods: {shared}"


POISON = {
    "non-ascii-signature": json.dumps(
        {"version": 1, "node": "trn1-t", "podUID": "x", "containers": {}, "signature": "\u00e9" * 64}
    ),
    "deep-json": "[" * 3000 + "]" * 3000,
    "huge-integer": '{"version": 1, "node": "trn1-t", "podUID": "x", "containers": {}, "issued": ' + "9" * 5000 + "}",
}


def test_poison_allocations_cannot_stop_scheduling(
    cluster: Cluster, namespace: str, tenant: KubeClient, start_scheduler: Any
) -> None:
    cluster.create_ready_node("trn1-t", labels=TRN1, allocatable={NEURON: 16})
    # Bound pods carrying poison are read by the ledger rebuild at start; pending ones by the queue.
    for name, value in POISON.items():
        tenant_pod(tenant, namespace, f"bound-{name}", {}, annotations={ALLOCATION_KEY: value}, node="trn1-t")
        tenant_pod(tenant, namespace, f"pending-{name}", {NEURON: 1}, annotations={ALLOCATION_KEY: value})
    scheduler = start_scheduler("kubegpu", "--no-leader-elect")
    for name in POISON:
        wait_node(cluster, namespace, f"pending-{name}")
    cluster.create_pod(namespace, "after", {"main": {NEURON: 4}}, scheduler="kubegpu")
    assert wait_node(cluster, namespace, "after") == "trn1-t"
    assert scheduler.process.poll() is None, scheduler.output()[-3000:]
    # A restart relists the same poison: still up, still binding.
    scheduler.kill()
    again = start_scheduler("kubegpu", "--no-leader-elect")
    cluster.create_pod(namespace, "after-restart", {"main": {NEURON: 4}}, scheduler="kubegpu")
    assert wait_node(cluster, namespace, "after-restart") == "trn1-t"
    assert again.process.poll() is None, again.output()[-3000:]
    assert "AllocationRefused" in {e["reason"] for e in cluster.events(namespace)}


def test_an_unsigned_squatting_allocation_holds_no_devices(
    cluster: Cluster, namespace: str, tenant: KubeClient, start_scheduler: Any, key_file: Path
) -> None:
    cluster.create_ready_node("trn1-sq", labels=TRN1, allocatable={NEURON: 16})
    claim = AllocationRecord(
        version=1,
        node="trn1-sq",
        podUID="00000000-0000-0000-0000-000000000000",
        containers={"main": {NEURON: [str(i) for i in range(16)]}},
    )
    squatter = tenant_pod(tenant, namespace, "squatter", {}, node="trn1-sq")
    # The tenant fills in its own UID and even signs with a guessed key: still not the scheduler's signature.
    forged = sign_allocation(claim.model_copy(update={"podUID": squatter["metadata"]["uid"]}), b"guessed" * 8)
    tenant.patch(
        f"/api/v1/namespaces/{namespace}/pods/squatter",
        {"metadata": {"annotations": {ALLOCATION_KEY: forged.model_dump_json(exclude_none=True)}}},
    )
    start_scheduler("kubegpu", "--no-leader-elect")
    cluster.create_pod(namespace, "honest", {"main": {NEURON: 16}}, scheduler="kubegpu")
    assert wait_node(cluster, namespace, "honest") == "trn1-sq"
    assert_no_device_shared(cluster, key_file.read_text().strip().encode())
    refusal = wait_for(
        lambda: next((e for e in cluster.events(namespace) if e["reason"] == "AllocationRefused"), None),
        30,
        "an AllocationRefused event on the squatter",
    )
    assert refusal["involvedObject"]["name"] == "squatter"
    assert "signature does not verify" in refusal["message"]


def test_a_copied_allocation_never_lets_two_pods_hold_a_device(
    cluster: Cluster, namespace: str, tenant: KubeClient, start_scheduler: Any, key_file: Path
) -> None:
    key = key_file.read_text().strip().encode()
    cluster.create_ready_node("trn1-cp", labels=TRN1, allocatable={NEURON: 16})
    first = start_scheduler("kubegpu", "--no-leader-elect")
    tenant_pod(tenant, namespace, "victim", {NEURON: 16})
    wait_node(cluster, namespace, "victim")
    stolen = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/victim")["metadata"]["annotations"]
    # A copy that sorts first in the relist, bound straight to the node, asking for nothing.
    tenant_pod(tenant, namespace, "aaa-copy", {}, annotations={ALLOCATION_KEY: stolen[ALLOCATION_KEY]}, node="trn1-cp")
    first.kill()
    restarted = start_scheduler("kubegpu", "--no-leader-elect")
    wait_ready(restarted)  # the ledger is rebuilt with the copy in it, then the copy goes
    cluster.delete_pod(namespace, "aaa-copy")
    tenant_pod(tenant, namespace, "late", {NEURON: 16})
    time.sleep(3)  # a window in which a wrong ledger would bind `late` onto the victim's devices
    assert node_of(cluster, namespace, "late") is None
    assert_no_device_shared(cluster, key)
    cluster.delete_pod(namespace, "victim")
    assert wait_node(cluster, namespace, "late") == "trn1-cp"
    assert_no_device_shared(cluster, key)


def test_a_huge_quantity_costs_its_pod_only(
    cluster: Cluster, namespace: str, tenant: KubeClient, start_scheduler: Any
) -> None:
    cluster.create_ready_node("p3-q", labels=P3, allocatable={"nvidia.com/gpu": 8})
    start_scheduler("kubegpu", "--no-leader-elect")
    tenant_pod(tenant, namespace, "huge", {"nvidia.com/gpu": "1e600000"})
    started = time.monotonic()
    cluster.create_pod(namespace, "normal", {"main": {"nvidia.com/gpu": 1}}, scheduler="kubegpu")
    assert wait_node(cluster, namespace, "normal", timeout=10) == "p3-q"
    assert time.monotonic() - started < 5.0
    # kube-apiserver refuses `500m` of an extended resource itself; `1e600000` it admits.
    event = wait_for(
        lambda: next((e for e in cluster.events(namespace) if e["involvedObject"]["name"] == "huge"), None),
        30,
        "a FailedScheduling event naming the bad quantity",
    )
    assert event["reason"] == "FailedScheduling" and "nvidia.com/gpu" in event["message"]
    assert node_of(cluster, namespace, "huge") is None


def test_a_failed_binding_leaves_no_allocation_to_replay(
    cluster: Cluster, namespace: str, tenant: KubeClient, start_scheduler: Any, tmp_path: Path
) -> None:
    """The scheduler's identity may read pods but not bind them: every Binding fails, and the tenant never sees a
    signed allocation it could put back later (before, the annotation patch landed before the Binding failed)."""
    admin = cluster.client
    admin.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "binder"}},
    )
    rules = [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        # What scheduling waits to have listed: namespaces (pod affinity's namespaceSelector), claims and volumes,
        # and the owners that give pods their default spread constraints.
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims", "persistentvolumes"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["services", "replicationcontrollers"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["apps"], "resources": ["replicasets", "statefulsets"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list", "watch"]},  # preemption's
    ]
    name = f"no-binding-{namespace}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    admin.post(f"{rbac}/clusterroles", {"kind": "ClusterRole", "metadata": {"name": name}, "rules": rules})
    admin.post(
        f"{rbac}/clusterrolebindings",
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "binder", "namespace": namespace}],
        },
    )
    token = admin.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/binder/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600},
        },
    )["status"]["token"]
    kubeconfig = cluster.write_kubeconfig(tmp_path / "binder.kubeconfig", token)
    cluster.create_ready_node("trn1-fb", labels=TRN1, allocatable={NEURON: 16})
    scheduler = start_scheduler("kubegpu", "--no-leader-elect", kubeconfig=kubeconfig)
    tenant_pod(tenant, namespace, "unlucky", {NEURON: 4})
    wait_for(lambda: scheduler.output().count("binding failed") >= 2, 30, "two failed Bindings (a retry included)")
    pod = tenant.get(f"/api/v1/namespaces/{namespace}/pods/unlucky")
    assert ALLOCATION_KEY not in (pod["metadata"].get("annotations") or {})
    assert pod["spec"].get("nodeName") is None
