"""Shared builders for the transcribed kube-scheduler 1.20 plugin tables: nodes and pods from the few fields the
upstream tables set, and an engine holding them, driven only through public APIs (`Engine.add_node`, `admit_bound`,
`filter_node`, `schedule`; the pure functions of `kubegpu.scheduler.filters` and `scores`).

Upstream builds `v1.Pod`/`v1.Node` objects in Go; here each case is a Kubernetes manifest fragment, parsed by the
same code the scheduler uses for real objects. A pod upstream builds with no containers becomes one container asking
explicitly for no cpu and no memory: both scorers then count 0 for it (kube-scheduler's non-zero defaults apply to an
absent request only), and kubegpu requires a container as the API server does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.status import Status
from kubegpu.core.testing import node_manifest
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine

EMPTY_CONTAINER = {"name": "c", "resources": {"requests": {"cpu": "0", "memory": "0"}}}


def node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[Mapping[str, str]] = (),
    cpu: str = "96",
    memory: str = "768Gi",
    unschedulable: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    manifest = node_manifest(name, labels=labels, taints=taints, cpu=cpu, memory=memory, **extra)
    if unschedulable:
        manifest["spec"]["unschedulable"] = True
    return manifest


def container(name: str = "c", *, requests: Mapping[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": dict(requests or {})}, **fields}


def pod(name: str = "pod", spec: Mapping[str, Any] | None = None, **meta: Any) -> PodRequest:
    spec = dict(spec or {})
    spec.setdefault("containers", [EMPTY_CONTAINER])
    document = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": meta.pop("namespace", "default"), "uid": name, **meta},
        "spec": spec,
    }
    request, _ = pod_request(document)
    return request


def engine(
    nodes: Sequence[Mapping[str, Any]],
    existing: Iterable[tuple[PodRequest, str]] = (),
    *,
    profile: scores.Profile | None = None,
    policy: Any = "binpack",
) -> Engine:
    """An engine without device plugins holding `nodes` and the `existing` pods, each recorded as bound to its node
    (kube-scheduler's snapshot: a bound pod counts whether or not it would pass the filters now)."""
    e = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), policy=policy, scoring=profile)
    for manifest in nodes:
        e.add_node(node_info(manifest))
    for placed, where in existing:
        status = e.admit_bound(placed, where, None)
        assert status.ok, status
    return e


def verdict(status: Status) -> tuple[str, tuple[str, ...]]:
    """A filter answer as kube-scheduler's tables state it: the code's name and the reasons."""
    names = {0: "Success", 1: "Unschedulable", 2: "UnschedulableAndUnresolvable", 3: "Error"}
    return names[int(status.code)], status.reasons


def case_id(test: str, case: str) -> str:
    """The pytest id of a transcribed case: the upstream Go test and its case name."""
    return f"{test}/{case}"


# ---------------------------------------------------------------------------------------------------------------
# NodeResources scores: the tables' nodes, pods and the sums both schedulers score
# ---------------------------------------------------------------------------------------------------------------

Requests = list[dict[str, str]]  # one dict of requests per container; [] is upstream's pod without containers


def requesting(name: str, containers: Requests, node_name: str | None = None) -> PodRequest:
    spec: dict[str, Any] = {}
    if containers:
        spec["containers"] = [container(f"c{i}", requests=r) for i, r in enumerate(containers)]
    if node_name is not None:
        spec["nodeName"] = node_name
    return pod(name, spec)


def scored_sums(incoming: PodRequest, placed: Sequence[tuple[PodRequest, str]], name: str) -> tuple[int, int]:
    """The cpu (millicores) and memory NodeResources scores read on `name`: the incoming pod's non-zero requests and
    those of the pods placed there (kube-scheduler's `NonZeroRequested`)."""
    cpu, memory = scores.nonzero_requests(incoming)
    for other, where in placed:
        if where == name:
            more_cpu, more_memory = scores.nonzero_requests(other)
            cpu, memory = cpu + more_cpu, memory + more_memory
    return cpu, memory
