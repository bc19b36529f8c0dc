"""Scheduler-side testing helpers that need the engine (so they cannot live in `kubegpu.core.testing`).

`simulate(documents, plugins={"fpga": module})` runs `kubegpu simulate --json` in-process: the same engine, the
same queue order, preemption and event records, on Node and Pod manifests (`node_manifest`, `pod_manifest`), with
exactly the plugins given (or the installed ones with `plugins=None`). A plugin failure never raises: it is the
pod's reason, as on a real cluster.

DRA objects in the exact upstream shape of `resource.k8s.io/v1` (Kubernetes 1.34), for tests and benchmarks:
`device_class`, `neuron_slice`, `generic_slice`, `claim_spec`, `exactly`, `template`, `claim`, and `claim_pod` (a pod
naming claims and templates in `spec.resourceClaims`, its container using them all).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubegpu.core.plugin_manager import KubegpuPluginManager, make_plugin_manager
from kubegpu.core.testing import pod_manifest
from kubegpu.scheduler.engine import Engine, Policy
from kubegpu.scheduler.simulate import OBJECT_KINDS, Cluster, PodEvent, _process

__all__ = [
    "claim",
    "claim_pod",
    "claim_spec",
    "device_class",
    "exactly",
    "generic_slice",
    "neuron_slice",
    "simulate",
    "template",
]


def simulate(
    documents: Iterable[Mapping[str, Any]],
    *,
    plugins: Mapping[str, object] | None = None,
    manager: KubegpuPluginManager | None = None,
    policy: Policy = "binpack",
) -> list[dict[str, Any]]:
    """The records `kubegpu simulate --json` prints for these manifests, one per pod document (and per victim of a
    preemption): `pod`, `event`, `node`, `reason`, `devices`, `annotations`."""
    from kubegpu.core.manifests import node_info, pod_request

    if manager is None:
        manager = (
            make_plugin_manager("scheduler")
            if plugins is None
            else make_plugin_manager("scheduler", plugins=plugins.items(), autoload=False)
        )
    engine = Engine(manager, policy=policy)
    pods: list[PodEvent] = []
    found: list[tuple[str, str, dict[str, Any]]] = []
    for number, document in enumerate(documents, 1):
        kind = document.get("kind")
        if kind == "Node":
            engine.add_node(node_info(document))
        elif kind == "Pod":
            request, deleting = pod_request(document, manager.qualifiers)
            pods.append(PodEvent(f"document#{number}", request, deleting or request.phase in ("Succeeded", "Failed")))
        elif kind in OBJECT_KINDS:
            found.append((str(kind), f"document#{number}", dict(document)))
        else:
            raise ValueError(f"document#{number}: kind {kind!r} is not simulated")
    return list(_process(engine, pods, [], Cluster.load(engine, found)))


# -- DRA objects (resource.k8s.io/v1) ---------------------------------------------------------------------------------


DRA_API = "resource.k8s.io/v1"
NEURON = "neuron.kubegpu.io"


def device_class(name: str, *expressions: str, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in expressions]}
    if config:
        spec["config"] = config
    return {"apiVersion": DRA_API, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def neuron_slice(
    node: str, devices: int = 16, *, topology: str = "ring", rows: int = 0, columns: int = 0, generation: int = 0
) -> dict[str, Any]:
    """A node's Neuron devices as the advertiser publishes them."""
    extra = {"rows": {"int": rows}, "columns": {"int": columns}} if topology == "torus" else {}
    return {
        "apiVersion": DRA_API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{NEURON}"},
        "spec": {
            "driver": NEURON,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [
                {
                    "name": f"neuron-{i}",
                    "attributes": {
                        "index": {"int": i},
                        "topology": {"string": topology},
                        "deviceCount": {"int": devices},
                        "model": {"string": "trainium"},
                        **extra,
                    },
                    "capacity": {"memory": {"value": "32Gi"}},
                }
                for i in range(devices)
            ],
        },
    }


def generic_slice(node: str, driver: str, devices: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {
        "apiVersion": DRA_API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": name, "attributes": attributes} for name, attributes in devices],
        },
    }


def claim_spec(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}


def exactly(name: str, device_class: str, count: int = 1, *selectors: str, mode: str = "ExactCount") -> dict[str, Any]:
    exact: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": mode}
    if mode == "ExactCount":
        exact["count"] = count
    if selectors:
        exact["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": exact}


def template(name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": DRA_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def claim(name: str, spec: dict[str, Any], namespace: str = "default", **status: Any) -> dict[str, Any]:
    document = {
        "apiVersion": DRA_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec,
    }
    if status:
        document["status"] = status
    return document


def claim_pod(
    name: str, *, templates: dict[str, str] | None = None, claims: dict[str, str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """A pod naming claims (`ref -> claim name`) and templates (`ref -> template name`), its container using all."""
    pod = pod_manifest(name, **kwargs)
    refs = [{"name": r, "resourceClaimTemplateName": t} for r, t in (templates or {}).items()]
    refs += [{"name": r, "resourceClaimName": c} for r, c in (claims or {}).items()]
    pod["spec"]["resourceClaims"] = refs
    pod["spec"]["containers"][0].setdefault("resources", {})["claims"] = [{"name": r["name"]} for r in refs]
    return pod
