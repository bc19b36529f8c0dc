"""DRA on the real 1.20.2 API server, with CRDs of upstream's schema standing in for `resource.k8s.io/v1` and a proxy
putting back the pods' `spec.resourceClaims`, which 1.20.2 prunes (`dra.py` says what each stands in for).

The stories: the advertiser finds the group through discovery and publishes a trn1-like node's 16 Neuron devices as
a ResourceSlice, leaves it alone while nothing changes, and replaces it (the pool's generation moved on) when a
device goes unhealthy. `kubegpu scheduler` reads that slice, makes a pod's claim from its template, allocates it by
the torus rule (whole rows of the 4x4 torus) in the upstream shape of `status.allocation`, reserves it for the pod and
binds it; a second pod wanting the same devices is refused with kube-scheduler's reason, and gets them once the first
pod is deleted (its claim deallocated and deleted). A claim asking admin access to every device waits, told the
API server's reason, until its namespace is labelled `resource.kubernetes.io/admin-access=true`, then gets them all,
those another claim holds included, as kube-scheduler 1.34 gives them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import urllib3

from kubegpu.core import dra
from kubegpu.core.testing import FakeHost
from kubegpu.kube.client import ApiError

from .cluster import Cluster, wait_for
from .dra import CLAIMS_ANNOTATION, KINDS, PodClaimsProxy, dra_api
from .test_advertise import advertise, trn_host

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NEURON = "neuron.kubegpu.io"
SCHEDULER = "kubegpu-dra"


@pytest.fixture
def resource_api(cluster: Cluster) -> Iterator[None]:
    with dra_api(cluster, *KINDS):
        yield


def test_the_advertiser_publishes_its_nodes_devices_as_a_resource_slice_and_keeps_it_current(
    cluster: Cluster, namespace: str, resource_api: None, tmp_path: Path
) -> None:
    cluster.create_ready_node("trn-dra")
    host: FakeHost = trn_host(tmp_path)
    advertise(cluster, "trn-dra", host)
    stored = cluster.client.get(f"{SLICES}/trn-dra-neuron")
    piece = dra.resource_slice(stored)  # what the scheduler side reads
    assert (piece.driver, piece.pool, piece.node_name, piece.generation) == (NEURON, "trn-dra", "trn-dra", 0)
    assert [d.name for d in piece.devices] == [f"neuron-{i}" for i in range(16)]
    first = piece.devices[0].attributes
    assert first[(NEURON, "topology")] == "torus"
    assert (first[(NEURON, "rows")], first[(NEURON, "columns")]) == (4, 4)
    node_uid = cluster.client.get("/api/v1/nodes/trn-dra")["metadata"]["uid"]
    assert stored["metadata"]["ownerReferences"][0]["uid"] == node_uid

    version = stored["metadata"]["resourceVersion"]
    advertise(cluster, "trn-dra", host)
    assert cluster.client.get(f"{SLICES}/trn-dra-neuron")["metadata"]["resourceVersion"] == version, "rewritten"

    host.remove("dev/neuron3")  # the device went away: unhealthy
    advertise(cluster, "trn-dra", host)
    piece = dra.resource_slice(cluster.client.get(f"{SLICES}/trn-dra-neuron"))
    assert piece.generation == 1
    assert "neuron-3" not in [d.name for d in piece.devices] and len(piece.devices) == 15


def claim_pod(cluster: Cluster, namespace: str, name: str, template: str) -> None:
    refs = [{"name": "devs", "resourceClaimTemplateName": template}]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {CLAIMS_ANNOTATION: orjson.dumps(refs).decode()},
        },
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }
    cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", body)


def node_of(cluster: Cluster, namespace: str, name: str) -> str | None:
    node: str | None = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")["spec"].get("nodeName")
    return node


def claim_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = cluster.client.get(
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        )
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return found


def rows_of(cluster: Cluster, results: list[dict[str, Any]]) -> int:
    """How many whole rows of the 4x4 torus the allocated devices make, by the indices the published slice gives
    them; fails when they are not whole rows."""
    published = {d.name: d for d in dra.resource_slice(cluster.client.get(f"{SLICES}/trn-dra-neuron")).devices}
    indices = sorted(int(str(published[r["device"]].attributes[(NEURON, "index")])) for r in results)
    rows = sorted({i // 4 for i in indices})
    assert indices == [i for row in rows for i in range(4 * row, 4 * row + 4)], f"not whole torus rows: {indices}"
    return len(rows)


def refusals(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [
        e["message"]
        for e in cluster.events(namespace)
        if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == name
    ]


def neuron_device_class(cluster: Cluster) -> None:
    """The DeviceClass `neuron`: every device the Neuron driver publishes."""
    cluster.client.post(
        "/apis/resource.k8s.io/v1/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "neuron"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NEURON}"'}}]},
        },
    )


def post_template(cluster: Cluster, namespace: str, name: str, request: dict[str, Any]) -> None:
    """A ResourceClaimTemplate of one request."""
    cluster.client.post(
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        },
    )


def ready_scheduler(start_scheduler: Any, proxy: PodClaimsProxy) -> str:
    """`kubegpu scheduler` behind the proxy, once ready: its /readyz URL."""
    scheduler = start_scheduler(SCHEDULER, "--no-leader-elect", kubeconfig=proxy.kubeconfig)
    ready = f"http://127.0.0.1:{scheduler.metrics_port}/readyz"
    wait_for(lambda: urllib3.request("GET", ready, timeout=2.0, retries=False).status == 200, 60, "the scheduler ready")
    return ready


def test_the_scheduler_allocates_a_template_claim_on_the_published_slice_and_frees_it_with_its_pod(
    cluster: Cluster, namespace: str, resource_api: None, start_scheduler: Any, tmp_path: Path
) -> None:
    cluster.create_ready_node("trn-dra")
    advertise(cluster, "trn-dra", trn_host(tmp_path))  # 16 devices, a 4x4 torus
    neuron_device_class(cluster)
    for name, count in (("eight", 8), ("all", 16)):
        post_template(
            cluster, namespace, name, {"name": "rows", "exactly": {"deviceClassName": "neuron", "count": count}}
        )
    with PodClaimsProxy(cluster, tmp_path) as proxy:
        ready = ready_scheduler(start_scheduler, proxy)
        assert orjson.loads(urllib3.request("GET", ready, timeout=2.0, retries=False).data)["apis"][
            "resourceclaims"
        ] == ("resource.k8s.io/v1")

        claim_pod(cluster, namespace, "first", "eight")
        wait_for(lambda: node_of(cluster, namespace, "first"), 60, "the first pod bound")
        made = claim_of(cluster, namespace, "first-devs")
        assert made is not None
        pod_uid = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/first")["metadata"]["uid"]
        assert made["metadata"]["ownerReferences"][0]["uid"] == pod_uid
        assert made["status"]["reservedFor"] == [{"resource": "pods", "name": "first", "uid": pod_uid}]
        allocation = made["status"]["allocation"]
        results = allocation["devices"]["results"]
        assert {(r["request"], r["driver"], r["pool"]) for r in results} == {("rows", NEURON, "trn-dra")}
        assert rows_of(cluster, results) == 2, "two whole rows of the torus"
        assert allocation["nodeSelector"] == {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["trn-dra"]}]}]
        }

        claim_pod(cluster, namespace, "second", "all")  # the same devices and more
        wait_for(lambda: refusals(cluster, namespace, "second"), 60, "the second pod told why it waits")
        assert refusals(cluster, namespace, "second") == ["0/1 nodes are available: 1 cannot allocate all claims."]
        assert node_of(cluster, namespace, "second") is None

        cluster.delete_pod(namespace, "first")
        wait_for(lambda: claim_of(cluster, namespace, "first-devs") is None, 60, "the first pod's claim deleted")
        wait_for(lambda: node_of(cluster, namespace, "second"), 60, "the second pod bound once the first is gone")
        second = claim_of(cluster, namespace, "second-devs")
        assert second is not None
        assert rows_of(cluster, second["status"]["allocation"]["devices"]["results"]) == 4


def test_devices_another_scheduler_allocated_to_a_claim_kubegpu_cannot_read_stay_held(
    cluster: Cluster, namespace: str, resource_api: None, start_scheduler: Any, tmp_path: Path
) -> None:
    """A claim whose spec asks what kubegpu does not implement (`distinctAttribute`), allocated all 16 devices by
    another scheduler (its status written as kube-scheduler writes it): kubegpu's pod wanting 8 waits, told why,
    instead of being given devices the claim holds; it binds once the claim is deleted."""
    cluster.create_ready_node("trn-dra")
    advertise(cluster, "trn-dra", trn_host(tmp_path))
    neuron_device_class(cluster)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    request = {"name": "rows", "exactly": {"deviceClassName": "neuron", "count": 16}}
    distinct = {"requests": ["rows"], "distinctAttribute": f"{NEURON}/index"}
    made = cluster.client.post(
        claims,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "foreign", "namespace": namespace},
            "spec": {"devices": {"requests": [request], "constraints": [distinct]}},
        },
    )
    on_node = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["trn-dra"]}]}
    results = [{"request": "rows", "driver": NEURON, "pool": "trn-dra", "device": f"neuron-{i}"} for i in range(16)]
    made["status"] = {
        "allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [on_node]}},
        "reservedFor": [{"resource": "pods", "name": "x", "uid": "uid-x"}],
    }
    cluster.client.put(f"{claims}/foreign/status", made)
    post_template(cluster, namespace, "eight", {**request, "exactly": {**request["exactly"], "count": 8}})
    with PodClaimsProxy(cluster, tmp_path) as proxy:
        ready_scheduler(start_scheduler, proxy)
        claim_pod(cluster, namespace, "p", "eight")
        wait_for(lambda: refusals(cluster, namespace, "p"), 60, "the pod told why it waits")
        assert refusals(cluster, namespace, "p") == ["0/1 nodes are available: 1 cannot allocate all claims."]
        assert node_of(cluster, namespace, "p") is None

        cluster.client.delete(f"{claims}/foreign")
        wait_for(lambda: node_of(cluster, namespace, "p"), 60, "the pod bound once the claim is gone")
        mine = claim_of(cluster, namespace, "p-devs")
        assert mine is not None
        assert rows_of(cluster, mine["status"]["allocation"]["devices"]["results"]) == 2


def test_admin_access_reaches_devices_another_claim_holds_once_the_namespace_is_labelled(
    cluster: Cluster, namespace: str, resource_api: None, start_scheduler: Any, tmp_path: Path
) -> None:
    """A monitoring agent's claim asks for admin access to every Neuron device (`exactly.adminAccess`, on by default
    from 1.34). The CRDs standing in for the kinds check no namespace label, as a real API server does when the claim
    is made: kubegpu refuses it in the API server's words until an administrator labels the namespace, then gives it
    all 16 devices, 8 of which another pod's claim holds, marked `adminAccess: true`."""
    cluster.create_ready_node("trn-dra")
    advertise(cluster, "trn-dra", trn_host(tmp_path))
    neuron_device_class(cluster)
    requests = {
        "eight": {"name": "rows", "exactly": {"deviceClassName": "neuron", "count": 8}},
        "watch": {
            "name": "rows",
            "exactly": {"deviceClassName": "neuron", "allocationMode": "All", "adminAccess": True},
        },
    }
    for name, request in requests.items():
        post_template(cluster, namespace, name, request)
    with PodClaimsProxy(cluster, tmp_path) as proxy:
        ready_scheduler(start_scheduler, proxy)
        claim_pod(cluster, namespace, "work", "eight")
        wait_for(lambda: node_of(cluster, namespace, "work"), 60, "the workload bound")
        claim_pod(cluster, namespace, "agent", "watch")
        wait_for(lambda: refusals(cluster, namespace, "agent"), 60, "the agent told why it waits")
        assert refusals(cluster, namespace, "agent")[0] == (
            "0/1 nodes are available: request rows: admin access to devices requires the "
            "`resource.kubernetes.io/admin-access: true` label on the containing namespace."
        )
        assert node_of(cluster, namespace, "agent") is None

        cluster.client.patch(
            f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {dra.ADMIN_NAMESPACE_LABEL: "true"}}}
        )
        wait_for(lambda: node_of(cluster, namespace, "agent"), 60, "the agent bound once the namespace is labelled")
        agent = claim_of(cluster, namespace, "agent-devs")
        work = claim_of(cluster, namespace, "work-devs")
        assert agent is not None and work is not None
        results = agent["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in results) == sorted(f"neuron-{i}" for i in range(16))
        assert all(r["adminAccess"] is True for r in results)
        held = {r["device"] for r in work["status"]["allocation"]["devices"]["results"]}
        assert len(held) == 8 and held <= {r["device"] for r in results}, "devices the workload's claim holds"
