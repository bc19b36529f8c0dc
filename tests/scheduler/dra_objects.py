"""DRA objects in the exact upstream shape (`resource.k8s.io/v1`, Kubernetes 1.34) for the tests and benchmarks."""

from __future__ import annotations

from typing import Any

from kubegpu.core.testing import node_manifest, pod_manifest

API = "resource.k8s.io/v1"
NEURON = "neuron.kubegpu.io"


def device_class(name: str, *expressions: str, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in expressions]}
    if config:
        spec["config"] = config
    return {"apiVersion": API, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def neuron_slice(
    node: str, devices: int = 16, *, topology: str = "ring", rows: int = 0, columns: int = 0, generation: int = 0
) -> dict[str, Any]:
    """A node's Neuron devices as the advertiser publishes them."""
    extra = {"rows": {"int": rows}, "columns": {"int": columns}} if topology == "torus" else {}
    return {
        "apiVersion": API,
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
        "apiVersion": API,
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
        "apiVersion": API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def claim(name: str, spec: dict[str, Any], namespace: str = "default", **status: Any) -> dict[str, Any]:
    document = {
        "apiVersion": API,
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


__all__ = [
    "claim",
    "claim_pod",
    "claim_spec",
    "device_class",
    "exactly",
    "generic_slice",
    "neuron_slice",
    "node_manifest",
    "template",
]
