"""What the gang tests and the gang benchmark share: the PodGroup CRD installed from the deploy manifests, racks of
GPU nodes, gang members, and a recorder of when each pod was first seen bound.

Members are written either way users write them: as Kueue's plain pod groups (a label and a total count on each
pod, `create_member`) or as scheduler-plugins' PodGroup objects (`create_podgroup`, members labelled with its name,
`create_member(..., podgroup=True)`). The kube-apiserver needs scripts/k8s-binaries.sh's recipe 2 (reflect2 1.0.2)
for the second: the first build crashed on the first write of any custom resource."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kubegpu.kube.client import ApiError

from .cluster import Cluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "examples" / "deploy" / "kustomize" / "base" / "podgroup-crd.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
RACK = "topology.kubernetes.io/rack"  # a level of the topology the scheduler is given (gang-topology.yaml)
TOPOLOGY = Path(__file__).parent / "gang-topology.yaml"
GPU = "nvidia.com/gpu"
P5 = {
    "node.kubernetes.io/instance-type": "p5.48xlarge",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81559",
}


def install_podgroup_crd(cluster: Cluster) -> None:
    """The CRD exactly as the deploy manifests ship it, established (created once per API server)."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    with contextlib.suppress(ApiError):
        cluster.client.post(CRDS, crd)

    def established() -> bool:
        status = cluster.client.get(f"{CRDS}/{crd['metadata']['name']}").get("status") or {}
        return any(c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or [])

    wait_for(established, 30, "the PodGroup CRD established")
    wait_for(
        lambda: cluster.client.list("/apis/scheduling.x-k8s.io/v1alpha1/podgroups") is not None,
        30,
        "PodGroups served",
    )


def podgroups_path(namespace: str) -> str:
    return f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups"


def create_racks(cluster: Cluster, racks: Mapping[str, int], gpus: int = 8) -> dict[str, str]:
    """Nodes of `gpus` GPUs each, `racks[rack]` of them in each rack; returns node -> rack."""
    where = {}
    for rack, count in racks.items():
        for i in range(count):
            name = f"{rack}-n{i}"
            cluster.create_ready_node(name, labels={**P5, RACK: rack}, allocatable={GPU: gpus})
            where[name] = rack
    return where


def create_member(
    cluster: Cluster,
    namespace: str,
    name: str,
    group: str,
    gpus: int,
    *,
    total: int | str,
    scheduler: str,
    index: int | None = None,
    priority: str | None = None,
    podgroup: bool = False,
) -> dict[str, Any]:
    """A gang member as Kueue's plain pod groups write one (the group's name and size on every member), with its
    rank and the rack it requires; `podgroup`: as scheduler-plugins' write one instead (only the PodGroup's name: its
    size and topology are the PodGroup's, `total` is not written)."""
    annotations = {} if podgroup else {KUEUE_TOTAL: str(total), REQUIRED: RACK}
    if index is not None:
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
    return create_pod(
        cluster,
        namespace,
        name,
        gpus,
        scheduler=scheduler,
        priority=priority,
        labels={PODGROUP_LABEL if podgroup else KUEUE_GROUP: group},
        annotations=annotations,
    )


def create_podgroup(
    cluster: Cluster, namespace: str, name: str, spec: Mapping[str, Any], *, rack: bool = True
) -> dict[str, Any]:
    """A scheduler-plugins PodGroup (`rack`: requiring one rack, Kueue's annotation on the PodGroup)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if rack:
        meta["annotations"] = {REQUIRED: RACK}
    body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": meta, "spec": dict(spec)}
    created: dict[str, Any] = cluster.client.post(podgroups_path(namespace), body)
    return created


def podgroup_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = cluster.client.get(f"{podgroups_path(namespace)}/{name}").get("status") or {}
    return status


def create_pod(
    cluster: Cluster,
    namespace: str,
    name: str,
    gpus: int,
    *,
    scheduler: str,
    priority: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {GPU: str(gpus)}}}],
    }
    if priority:
        spec["priorityClassName"] = priority
    meta = {"name": name, "namespace": namespace, "labels": dict(labels or {}), "annotations": dict(annotations or {})}
    pod: dict[str, Any] = cluster.client.post(
        f"/api/v1/namespaces/{namespace}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    )
    return pod


def placements(cluster: Cluster, namespace: str, names: Iterable[str] | None = None) -> dict[str, str | None]:
    """pod name -> its node (None: unbound), for the named pods (default: every pod of the namespace)."""
    pods = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods(namespace)}
    return pods if names is None else {n: pods.get(n) for n in names}


def events_of(cluster: Cluster, namespace: str, reason: str, kind: str = "Pod") -> list[dict[str, Any]]:
    return [e for e in cluster.events(namespace) if e["reason"] == reason and e["involvedObject"].get("kind") == kind]


class BindRecorder:
    """Watches a namespace's pods from the start of a test: when each was first seen bound, so that a test can say
    a pod was never bound, not merely that it is unbound now."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.bound: dict[str, tuple[str, float]] = {}  # pod name -> (node, monotonic time first seen bound)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.listed = threading.Event()

    def __enter__(self) -> BindRecorder:
        self.thread.start()
        self.listed.wait(30)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()

    def _watch(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        items, version = self.cluster.client.list(path)
        for item in items:
            self._record(item)
        self.listed.set()
        while not self.stop.is_set():
            with contextlib.suppress(ApiError):
                for event in self.cluster.client.watch(path, version, timeout=5):
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(obj)
                    if self.stop.is_set():
                        return

    def _record(self, pod: dict[str, Any]) -> None:
        name, node = pod["metadata"]["name"], pod["spec"].get("nodeName")
        if node and name not in self.bound:
            self.bound[name] = (node, time.monotonic())
