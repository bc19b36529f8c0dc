"""Kubernetes Node and Pod manifests -> kubegpu's `NodeInfo` and `PodRequest`.

Only the fields scheduling needs are read; everything else in a manifest is ignored, so real objects from the API
server and hand-written example files both load. Validation errors name the field (`spec.containers[0].resources.
limits.nvidia.com/gpu: ...`). Requests follow Kubernetes: an extended resource comes from `limits` (falling back to
`requests`); cpu and memory from `requests` (falling back to `limits`); the pod's cpu and memory are the larger of
the sum over containers and the largest init container.

Manifests are input from tenants and from files someone handed over, so reading one costs time bounded by its size:
every quantity is bounded by `kubegpu.core.quantity` before any arithmetic, and Kubernetes' own rules that kubegpu
relies on are checked here, naming the field: extended resources (a name with a domain outside `kubernetes.io`,
such as `nvidia.com/gpu`) are whole numbers, as the API server requires, rather than silently rounded up; and
container names are unique within a pod, so no container's devices are lost to another of the same name.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from kubegpu.core.annotations import DEVICES_KEY, decode_devices
from kubegpu.core.errors import InputError, describe_validation_error, shorten
from kubegpu.core.models import ContainerRequest, NodeInfo, PodRequest, Taint, Toleration
from kubegpu.core.quantity import QuantityError, parse_quantity

__all__ = ["ManifestError", "is_extended_resource", "node_info", "pod_request", "pod_uid"]

DEFAULT_PODS = 110


class ManifestError(InputError):
    """A Node or Pod manifest kubegpu cannot read."""


def _quantity(value: object) -> Decimal:
    try:
        parsed = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    if parsed < 0:
        raise ValueError(f"{value!r} is negative")
    return parsed


Quantity = Annotated[Decimal, BeforeValidator(_quantity)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Meta(_Model):
    name: str = Field(min_length=1)
    namespace: str = "default"
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    deletionTimestamp: str | None = None


class _Resources(_Model):
    limits: dict[str, Quantity] = Field(default_factory=dict)
    requests: dict[str, Quantity] = Field(default_factory=dict)


class _Container(_Model):
    name: str = Field(min_length=1)
    resources: _Resources = _Resources()


class _Toleration(_Model):
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = None


class _PodSpec(_Model):
    containers: list[_Container] = Field(min_length=1)
    initContainers: list[_Container] = Field(default_factory=list)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[_Toleration] = Field(default_factory=list)
    schedulerName: str = "default-scheduler"
    nodeName: str | None = None


class _PodStatus(_Model):
    phase: str | None = None


class _Pod(_Model):
    kind: Literal["Pod"] = "Pod"
    metadata: _Meta
    spec: _PodSpec
    status: _PodStatus = _PodStatus()


class _Taint(_Model):
    key: str = Field(min_length=1)
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class _NodeSpec(_Model):
    taints: list[_Taint] = Field(default_factory=list)
    unschedulable: bool = False


class _Condition(_Model):
    type: str
    status: str


class _NodeStatus(_Model):
    capacity: dict[str, Quantity] = Field(default_factory=dict)
    allocatable: dict[str, Quantity] = Field(default_factory=dict)
    conditions: list[_Condition] = Field(default_factory=list)


class _Node(_Model):
    kind: Literal["Node"] = "Node"
    metadata: _Meta
    spec: _NodeSpec = _NodeSpec()
    status: _NodeStatus = _NodeStatus()


def is_extended_resource(resource: str) -> bool:
    """Kubernetes' rule: a resource name with a domain outside `kubernetes.io` (devices such as `nvidia.com/gpu`)."""
    return "/" in resource and "kubernetes.io/" not in resource and not resource.startswith("requests.")


def _units(resource: str, value: Decimal, where: str) -> int:
    """cpu in millicores, everything else in whole base units, rounded up as Kubernetes rounds; extended resources
    must already be whole. `value` is bounded (`parse_quantity`), so the arithmetic here is cheap."""
    if is_extended_resource(resource) and value != value.to_integral_value():
        raise ManifestError(
            f"{where}: {value.normalize():f} is not a whole number; {shorten(resource)} is an extended resource "
            "(a device), counted in whole units as Kubernetes requires"
        )
    scaled = value * 1000 if resource == "cpu" else value
    integral = int(scaled)
    return integral if integral == scaled else integral + 1


def _container_request(container: _Container, where: str) -> ContainerRequest:
    limits, requests = container.resources.limits, container.resources.requests
    units: dict[tuple[str, str], int] = {}
    for source, amounts in (("limits", limits), ("requests", requests)):
        for name, value in amounts.items():
            units[source, name] = _units(name, value, f"{where}.resources.{source}.{shorten(name)}")
    resources: dict[str, int] = {}
    for name in limits.keys() | requests.keys():
        first, second = ("requests", "limits") if name in ("cpu", "memory") else ("limits", "requests")
        resources[name] = units[first, name] if (first, name) in units else units[second, name]
    return ContainerRequest(name=container.name, resources=resources)


def _unique_container_names(spec: _PodSpec) -> None:
    """Kubernetes refuses two containers (init containers included) of one name; kubegpu keys devices by it."""
    seen: dict[str, str] = {}
    for field, group in (("containers", spec.containers), ("initContainers", spec.initContainers)):
        for index, container in enumerate(group):
            here = f"spec.{field}[{index}]"
            if container.name in seen:
                raise ManifestError(
                    f"Pod.{here}.name: {shorten(container.name)!r} is also the name of {seen[container.name]}; "
                    "container names must be unique within a pod"
                )
            seen[container.name] = here


def pod_uid(namespace: str, name: str) -> str:
    """A stable UID for a pod that has none yet (simulator input): the same name always gets the same UID."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kubegpu:pod:{namespace}/{name}"))


def _parse(model: type[_Model], document: Mapping[str, Any], what: str) -> Any:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise ManifestError(describe_validation_error(exc, what)) from None


def pod_request(document: Mapping[str, Any]) -> tuple[PodRequest, bool]:
    """The `PodRequest` of a Pod manifest, and whether the manifest marks the pod as being deleted."""
    pod: _Pod = _parse(_Pod, document, "Pod")
    _unique_container_names(pod.spec)
    containers = tuple(_container_request(c, f"Pod.spec.containers[{i}]") for i, c in enumerate(pod.spec.containers))
    init = [_container_request(c, f"Pod.spec.initContainers[{i}]") for i, c in enumerate(pod.spec.initContainers)]
    cpu = max([sum(c.resources.get("cpu", 0) for c in containers)] + [c.resources.get("cpu", 0) for c in init])
    memory = max([sum(c.resources.get("memory", 0) for c in containers)] + [c.resources.get("memory", 0) for c in init])
    meta = pod.metadata
    request = PodRequest(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid or pod_uid(meta.namespace, meta.name),
        containers=containers,
        annotations=meta.annotations,
        labels=meta.labels,
        node_selector=pod.spec.nodeSelector,
        tolerations=tuple(
            Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect or None)
            for t in pod.spec.tolerations
        ),
        scheduler_name=pod.spec.schedulerName,
        node_name=pod.spec.nodeName,
        cpu_milli=cpu,
        memory=memory,
        phase=pod.status.phase,
    )
    return request, meta.deletionTimestamp is not None


def node_info(document: Mapping[str, Any]) -> NodeInfo:
    """The `NodeInfo` of a Node manifest. A node with no `allocatable` uses its `capacity`; `pods` defaults to 110.

    A node without conditions counts as Ready (hand-written simulator input); with conditions, `Ready` must be True.
    """
    node: _Node = _parse(_Node, document, "Node")
    field = "allocatable" if node.status.allocatable else "capacity"
    allocatable = {
        name: _units(name, value, f"Node.status.{field}.{shorten(name)}")
        for name, value in getattr(node.status, field).items()
    }
    allocatable.setdefault("pods", DEFAULT_PODS)
    ready = all(c.status == "True" for c in node.status.conditions if c.type == "Ready")
    inventories = {}
    raw = node.metadata.annotations.get(DEVICES_KEY)
    if raw is not None:
        try:
            inventories = dict(decode_devices(raw).inventories)
        except InputError as exc:
            raise ManifestError(f"Node {node.metadata.name}: metadata.annotations.{exc}") from None
    return NodeInfo(
        name=node.metadata.name,
        labels=node.metadata.labels,
        annotations=node.metadata.annotations,
        allocatable=allocatable,
        taints=tuple(Taint(t.key, t.value, t.effect) for t in node.spec.taints),
        unschedulable=node.spec.unschedulable,
        ready=ready,
        inventories=inventories,
    )
