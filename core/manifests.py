"""Kubernetes Node and Pod manifests -> kubegpu's `NodeInfo` and `PodRequest`.

Only the fields scheduling needs are read; everything else in a manifest is ignored, so real objects from the API
server and hand-written example files both load. Validation errors name the field (`spec.containers[0].resources.
limits.nvidia.com/gpu: ...`). Requests follow Kubernetes: an extended resource comes from `limits` (falling back to
`requests`); cpu and memory from `requests` (falling back to `limits`). The pod's request of each resource is
kube-scheduler's (1.29+ `resource.PodRequests`): sidecars (init containers with `restartPolicy: Always`, 1.28+) run
for the pod's life, so their requests add to the containers'; each classic init container runs beside the sidecars
started before it; the pod needs the larger of the two, plus `spec.overhead`. Devices follow the same rule: a sidecar
holds its own devices beside the app containers' (the kubelet's device manager does not hand them on), so sidecars
join `PodRequest.containers`. The kubelet hands a classic init container's devices on to the containers after it, so
the pod holds of each device the larger of what its app containers and sidecars hold and what an init container's
step needs (the init container's count with the sidecars started before it): where a step needs more, the init
container whose step needs the most holds the difference (`_init_holders`; all of it for a device only init
containers ask for), so that the allocation names every device the kubelet gives the pod, and
`PodRequest.init_steps` lets the allocation name what each init container is given of them. A resource a plugin
declares a qualifier of another (`nvidia.com/gpucores`, an amount of each `nvidia.com/gpu`: `pod_request`'s
`qualifiers`) is no device alone: it is held only beside more of its device.

Manifests are input from tenants and from files someone handed over, so reading one costs time bounded by its size:
every quantity is bounded by `kubegpu.core.quantity` before any arithmetic, and Kubernetes' own rules that kubegpu
relies on are checked here, naming the field: extended resources (a name with a domain outside `kubernetes.io`,
such as `nvidia.com/gpu`) are whole numbers, as the API server requires, rather than silently rounded up; and
container names are unique within a pod, so no container's devices are lost to another of the same name.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, Context, Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from kubegpu.core.annotations import ALLOCATION_KEY, DEVICES_KEY, decode_devices
from kubegpu.core.errors import InputError, describe_validation_error, shorten
from kubegpu.core.legacy_kubegpu import DEVICE_INFORMATION, GPU_RESOURCE, kubegpu_gpus
from kubegpu.core.limits import MAX_IMAGE_NAME_LENGTH, MAX_NODE_IMAGE_NAMES
from kubegpu.core.models import (
    ClaimRef,
    ContainerRequest,
    HostPort,
    InitStep,
    LabelSelector,
    NodeInfo,
    NodeSelectorTerm,
    OwnerReference,
    PodAffinityTerm,
    PodRequest,
    Requirement,
    SpreadConstraint,
    Taint,
    Toleration,
)
from kubegpu.core.quantity import QuantityError, parse_quantity

__all__ = [
    "ManifestError",
    "is_extended_resource",
    "label_selector",
    "node_images",
    "node_info",
    "node_selector_terms",
    "pod_request",
    "pod_uid",
]

DEFAULT_PODS = 110
MAX_POD_CLAIMS = 32  # spec.resourceClaims, and one container's resources.claims
SIDECAR_RESTART_POLICY = "Always"  # an init container with this restartPolicy is a sidecar


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


class _OwnerReference(_Model):
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class _Meta(_Model):
    name: str = Field(min_length=1)
    namespace: str = "default"
    uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    deletionTimestamp: str | None = None
    ownerReferences: list[_OwnerReference] = Field(default_factory=list)


class _ContainerClaim(_Model):
    name: str = Field(min_length=1)
    request: str | None = None


class _Resources(_Model):
    limits: dict[str, Quantity] = Field(default_factory=dict)
    requests: dict[str, Quantity] = Field(default_factory=dict)
    claims: list[_ContainerClaim] = Field(default_factory=list, max_length=MAX_POD_CLAIMS)


class _Port(_Model):
    containerPort: int = Field(default=0, ge=0, le=65535)
    hostPort: int = Field(default=0, ge=0, le=65535)
    protocol: str = "TCP"
    hostIP: str = ""


class _Container(_Model):
    name: str = Field(min_length=1)
    image: str = ""
    resources: _Resources = Field(default_factory=_Resources)
    ports: list[_Port] = Field(default_factory=list)
    restartPolicy: str | None = None  # on an init container, "Always" makes it a sidecar (Kubernetes 1.28+)


class _Toleration(_Model):
    key: str | None = None
    operator: Literal["Equal", "Exists", "Lt", "Gt"] = "Equal"  # Lt, Gt: 1.35+ (alpha), numeric
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = None


class _Requirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)


class _LabelSelector(_Model):
    matchLabels: dict[str, str] = Field(default_factory=dict)
    matchExpressions: list[_Requirement] = Field(default_factory=list)


class _NodeSelectorTerm(_Model):
    matchExpressions: list[_Requirement] = Field(default_factory=list)
    matchFields: list[_Requirement] = Field(default_factory=list)


class _NodeSelector(_Model):
    nodeSelectorTerms: list[_NodeSelectorTerm] = Field(default_factory=list)


class _PreferredSchedulingTerm(_Model):
    weight: int = Field(ge=1, le=100)
    preference: _NodeSelectorTerm


class _NodeAffinity(_Model):
    requiredDuringSchedulingIgnoredDuringExecution: _NodeSelector | None = None
    preferredDuringSchedulingIgnoredDuringExecution: list[_PreferredSchedulingTerm] = Field(default_factory=list)


class _PodAffinityTerm(_Model):
    labelSelector: _LabelSelector | None = None
    namespaces: list[str] = Field(default_factory=list)
    namespaceSelector: _LabelSelector | None = None  # 1.22+ (GA 1.24): `{}` selects every namespace
    topologyKey: str = Field(min_length=1)
    matchLabelKeys: list[str] = Field(default_factory=list)  # 1.29+: `key In (the pod's value)`
    mismatchLabelKeys: list[str] = Field(default_factory=list)  # 1.29+: `key NotIn (the pod's value)`


class _WeightedPodAffinityTerm(_Model):
    weight: int = Field(ge=1, le=100)
    podAffinityTerm: _PodAffinityTerm


class _PodAffinity(_Model):
    requiredDuringSchedulingIgnoredDuringExecution: list[_PodAffinityTerm] = Field(default_factory=list)
    preferredDuringSchedulingIgnoredDuringExecution: list[_WeightedPodAffinityTerm] = Field(default_factory=list)


class _Affinity(_Model):
    nodeAffinity: _NodeAffinity | None = None
    podAffinity: _PodAffinity | None = None
    podAntiAffinity: _PodAffinity | None = None


class _SpreadConstraint(_Model):
    maxSkew: int = Field(ge=1)
    topologyKey: str = Field(min_length=1)
    whenUnsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    labelSelector: _LabelSelector | None = None
    minDomains: int | None = Field(default=None, ge=1, le=2**31 - 1)  # 1.24+, GA 1.30
    nodeAffinityPolicy: Literal["Honor", "Ignore"] | None = None  # 1.25+, GA 1.33
    nodeTaintsPolicy: Literal["Honor", "Ignore"] | None = None  # 1.25+, GA 1.33
    matchLabelKeys: list[str] = Field(default_factory=list)  # 1.27+


class _ClaimSource(_Model):
    claimName: str = Field(min_length=1)


class _Volume(_Model):
    name: str = ""
    persistentVolumeClaim: _ClaimSource | None = None


class _PodResourceClaim(_Model):
    """One of `spec.resourceClaims` (DRA, 1.34+): exactly one of a claim's name and a template's name."""

    name: str = Field(min_length=1, max_length=63)
    resourceClaimName: str | None = Field(default=None, min_length=1, max_length=253)
    resourceClaimTemplateName: str | None = Field(default=None, min_length=1, max_length=253)

    @model_validator(mode="after")
    def _one_source(self) -> _PodResourceClaim:
        if (self.resourceClaimName is None) == (self.resourceClaimTemplateName is None):
            raise ValueError("exactly one of resourceClaimName or resourceClaimTemplateName must be set")
        return self


class _ClaimStatus(_Model):
    name: str = Field(min_length=1)
    resourceClaimName: str | None = None


class _SchedulingGate(_Model):
    name: str = Field(min_length=1)


class _PodSpec(_Model):
    containers: list[_Container] = Field(min_length=1)
    initContainers: list[_Container] = Field(default_factory=list)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[_Toleration] = Field(default_factory=list)
    schedulerName: str = "default-scheduler"
    nodeName: str | None = None
    affinity: _Affinity | None = None
    topologySpreadConstraints: list[_SpreadConstraint] = Field(default_factory=list)
    volumes: list[_Volume] = Field(default_factory=list)
    overhead: dict[str, Quantity] = Field(default_factory=dict)
    priority: int | None = None
    priorityClassName: str | None = None
    preemptionPolicy: Literal["PreemptLowerPriority", "Never"] | None = None
    schedulingGates: list[_SchedulingGate] = Field(default_factory=list)  # Kubernetes 1.26+
    resourceClaims: list[_PodResourceClaim] = Field(default_factory=list, max_length=MAX_POD_CLAIMS)  # 1.34+ (DRA)
    resources: _Resources | None = None  # pod-level resources, 1.32+ (beta 1.34)


class _ContainerStatus(_Model):
    """What the kubelet reports of a container's resources after an in-place resize (1.27+, beta 1.33): those it
    runs with (`resources`) and those it set aside (`allocatedResources`)."""

    name: str = ""
    resources: _Resources | None = None
    allocatedResources: dict[str, Quantity] | None = None


class _PodCondition(_Model):
    type: str = ""
    reason: str | None = None


class _ResizeStatus(_Model):
    """The part of a pod's status an in-place resize writes; read only when some container status reports
    `resources` (every running pod has container statuses and conditions: most need not be parsed at all)."""

    containerStatuses: list[_ContainerStatus] = Field(default_factory=list)
    initContainerStatuses: list[_ContainerStatus] = Field(default_factory=list)
    conditions: list[_PodCondition] = Field(default_factory=list)


class _PodStatus(_Model):
    phase: str | None = None
    startTime: str | None = None
    resourceClaimStatuses: list[_ClaimStatus] = Field(default_factory=list, max_length=MAX_POD_CLAIMS)


class _Pod(_Model):
    kind: Literal["Pod"] = "Pod"
    metadata: _Meta
    spec: _PodSpec
    status: _PodStatus = Field(default_factory=_PodStatus)


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
    spec: _NodeSpec = Field(default_factory=_NodeSpec)
    status: _NodeStatus = Field(default_factory=_NodeStatus)


def is_extended_resource(resource: str) -> bool:
    """Kubernetes' rule: a resource name with a domain outside `kubernetes.io` (devices such as `nvidia.com/gpu`)."""
    return "/" in resource and "kubernetes.io/" not in resource and not resource.startswith("requests.")


def _units(resource: str, value: Decimal, within: str) -> int:
    """cpu in millicores, everything else in whole base units, rounded up as Kubernetes rounds; extended resources
    must already be whole. `value` is bounded (`parse_quantity`), so the arithmetic here is cheap. `within` is where
    the map of resources lies in the document: an error names `within.<resource>`, a path only spelled out then
    (every pod and node document passes here for each of its resources)."""
    if is_extended_resource(resource) and value != value.to_integral_value():
        raise ManifestError(
            f"{within}.{shorten(resource)}: {value.normalize():f} is not a whole number; {shorten(resource)} is an "
            "extended resource (a device), counted in whole units as Kubernetes requires"
        )
    scaled = value * 1000 if resource == "cpu" else value
    integral = int(scaled)
    return integral if integral == scaled else integral + 1


def _container_request(container: _Container, where: str) -> ContainerRequest:
    limits, requests = container.resources.limits, container.resources.requests
    _check_requests_against_limits(requests, limits, f"{where}.resources")
    units: dict[tuple[str, str], int] = {}
    for source, amounts in (("limits", limits), ("requests", requests)):
        if amounts:
            within = f"{where}.resources.{source}"
            for name, value in amounts.items():
                units[source, name] = _units(name, value, within)
    resources: dict[str, int] = {}
    for name in limits.keys() | requests.keys():
        first, second = ("limits", "requests") if is_extended_resource(name) else ("requests", "limits")
        resources[name] = units[first, name] if (first, name) in units else units[second, name]
    return ContainerRequest(name=container.name, resources=resources)


def _check_requests_against_limits(requests: dict[str, Decimal], limits: dict[str, Decimal], where: str) -> None:
    """A request above its limit, which the API server refuses (`kubegpu simulate`'s input): refused here too,
    naming the field, rather than counted at the request the cluster would never run. Extended resources are read
    from their limit first, as before (kube-scheduler's own tests ask them in requests alone)."""
    for name, asked in requests.items():
        limit = limits.get(name)
        if limit is not None and _nano(asked) > _nano(limit) and not is_extended_resource(name):
            raise ManifestError(
                f"{where}.requests.{shorten(name)}: {asked.normalize():f} is above its limit {limit.normalize():f}, "
                "which Kubernetes refuses"
            )


def _nano(value: Decimal) -> Decimal:
    """A quantity rounded up to a nano-unit, as the API server reads it (1.0000000001 is 1000000001n) before it
    compares a request with its limit."""
    return value.quantize(_NANO, rounding=ROUND_CEILING, context=_EXACT)


_NANO = Decimal("1e-9")
_EXACT = Context(prec=40)  # 2**63 base units to the nano-unit: 28 digits, past the default context's


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


_POD_UID_SEED = uuid.NAMESPACE_URL.bytes + b"kubegpu:pod:"


def pod_uid(namespace: str, name: str) -> str:
    """A stable UID for a pod that has none yet (simulator input): the same name always gets the same UID,
    `uuid.uuid5(uuid.NAMESPACE_URL, "kubegpu:pod:<namespace>/<name>")` spelled out (RFC 4122's name-based SHA-1
    UUID: version 5, variant 10), without building a `uuid.UUID` for every pod document the simulator reads."""
    digest = bytearray(hashlib.sha1(_POD_UID_SEED + f"{namespace}/{name}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _parse(model: type[_Model], document: Mapping[str, Any], what: str) -> Any:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise ManifestError(describe_validation_error(exc, what)) from None


def pod_request(document: Mapping[str, Any], qualifiers: Mapping[str, str] | None = None) -> tuple[PodRequest, bool]:
    """The `PodRequest` of a Pod manifest, and whether the manifest marks the pod as being deleted. `qualifiers`:
    the resources the plugins declare amounts of each device of another (`KubegpuPluginManager.qualifiers`), which
    no init container holds without that device (`_init_holders`)."""
    pod: _Pod = _parse(_Pod, document, "Pod")
    _unique_container_names(pod.spec)
    resized = _Resized.of(document.get("status"))
    containers = tuple(resized.request(c, f"Pod.spec.containers[{i}]") for i, c in enumerate(pod.spec.containers))
    init = [
        (
            resized.request(c, f"Pod.spec.initContainers[{i}]")
            if c.restartPolicy == SIDECAR_RESTART_POLICY
            else _container_request(c, f"Pod.spec.initContainers[{i}]"),
            c.restartPolicy == SIDECAR_RESTART_POLICY,
        )
        for i, c in enumerate(pod.spec.initContainers)
    ]
    containers, init = _with_kubegpu_gpus(containers, init, pod)
    overhead = {name: _units(name, value, "Pod.spec.overhead") for name, value in pod.spec.overhead.items()}
    requests = _pod_requests(containers, init, overhead, _pod_level(pod.spec.resources))
    containers += tuple(container for container, sidecar in init if sidecar)
    containers += _init_holders(containers, init, qualifiers or {})
    meta = pod.metadata
    spec = pod.spec
    affinity = spec.affinity or _Affinity()
    required = affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution if affinity.nodeAffinity else None
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
        cpu_milli=requests.get("cpu", 0),
        memory=requests.get("memory", 0),
        phase=pod.status.phase,
        requests=requests,
        node_affinity=None if required is None else tuple(_node_term(t) for t in required.nodeSelectorTerms),
        pod_affinity=_affinity_terms(affinity.podAffinity, meta, "podAffinity"),
        pod_anti_affinity=_affinity_terms(affinity.podAntiAffinity, meta, "podAntiAffinity"),
        spread=tuple(
            _spread_constraint(c, meta.labels, f"Pod.spec.topologySpreadConstraints[{i}]")
            for i, c in enumerate(spec.topologySpreadConstraints)
        ),
        host_ports=tuple(
            HostPort(port.hostPort, port.protocol or "TCP", port.hostIP or "0.0.0.0")
            for container in spec.containers
            for port in container.ports
            if port.hostPort > 0
        ),
        claims=tuple(v.persistentVolumeClaim.claimName for v in spec.volumes if v.persistentVolumeClaim is not None),
        priority=spec.priority or 0,
        priority_class=spec.priorityClassName or "",
        preemption_policy=spec.preemptionPolicy or "PreemptLowerPriority",
        start_time=pod.status.startTime,
        terminating=meta.deletionTimestamp is not None,
        preferred_node_affinity=_preferred_node_terms(affinity.nodeAffinity),
        preferred_affinity=_preferred_terms(affinity.podAffinity, meta, "podAffinity"),
        preferred_anti_affinity=_preferred_terms(affinity.podAntiAffinity, meta, "podAntiAffinity"),
        owner_references=tuple(OwnerReference(o.kind, o.name, o.uid, bool(o.controller)) for o in meta.ownerReferences),
        images=tuple(c.image for c in spec.containers),
        scheduling_gates=tuple(gate.name for gate in spec.schedulingGates),
        resource_claims=_resource_claims(pod),
        init_steps=_init_steps(init),
    )
    return request, meta.deletionTimestamp is not None


def _with_kubegpu_gpus(
    containers: tuple[ContainerRequest, ...], init: list[tuple[ContainerRequest, bool]], pod: _Pod
) -> tuple[tuple[ContainerRequest, ...], list[tuple[ContainerRequest, bool]]]:
    """The containers and init containers (with whether each is a sidecar) with the GPUs Microsoft KubeGPU's
    `pod.alpha/DeviceInformation` gave them, for a bound pod without kubegpu's allocation; a pending pod asking GPUs
    only there, for any of them, is refused (`kubegpu.core.legacy_kubegpu`)."""
    annotations = pod.metadata.annotations
    if DEVICE_INFORMATION not in annotations or ALLOCATION_KEY in annotations:
        return containers, init
    bound = bool(pod.spec.nodeName)
    gpus = kubegpu_gpus(annotations, bound=bound)
    if not gpus:
        return containers, init
    if not bound:
        for container in (*containers, *(c for c, _ in init)):
            count = gpus.get(container.name, 0)
            if count and not container.resources.get(GPU_RESOURCE):
                raise ManifestError(
                    f"Pod.metadata.annotations.{DEVICE_INFORMATION}: Microsoft KubeGPU's annotation asks {count} "
                    f"GPU(s) for container {container.name}, and kubegpu does not read it: set resources.limits "
                    f"{GPU_RESOURCE}: {count} on the container instead (and the annotation kubegpu.io/gpu-memory for "
                    "a minimum GPU memory)"
                )
        return containers, init

    def given(c: ContainerRequest) -> ContainerRequest:
        if gpus.get(c.name) and not c.resources.get(GPU_RESOURCE):
            return ContainerRequest(c.name, {**c.resources, GPU_RESOURCE: gpus[c.name]}, c.init)
        return c

    return tuple(given(c) for c in containers), [(given(c), sidecar) for c, sidecar in init]


# What a bound pod holds on its node is read from these fields of its spec; the others say where it may go.
_HOLDING = frozenset(
    {"containers", "initContainers", "overhead", "resources", "resourceClaims", "nodeName", "schedulerName", "priority"}
)


def bound_pod_request(
    document: Mapping[str, Any], qualifiers: Mapping[str, str] | None = None, unreadable: Iterable[str] = ()
) -> tuple[PodRequest, bool, tuple[str, ...]]:
    """The `PodRequest` of a pod `pod_request` refuses, read without the fields of its spec that cannot be read, and
    their names (`spec.tolerations`). For a pod already bound to a node: what it holds there (its containers,
    overhead, pod-level resources and claims) is counted whatever else its spec says (a value a later Kubernetes
    release added), since leaving the pod out would give its node's cpu and devices to another pod, which the
    kubelet then refuses. Every other field kubegpu reads is kept where it can be read on its own (the pod's
    anti-affinity still keeps others away). Raises `ManifestError` when what the pod holds cannot be read.

    Finding those fields reads the pod once per field of its spec (ten times in all). `unreadable`: the fields an
    earlier read of the same pod dropped (as returned, `spec.tolerations`); the pod is read once without them first,
    and only if that fails field by field. A bound pod's spec changes little (tolerations are only added, the images
    replaced), so the pod's owner, relabelling it in a loop, makes each of its events cost two reads, not eleven."""
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        raise ManifestError("Pod.spec: must be an object")
    known = tuple(sorted({name.removeprefix("spec.") for name in unreadable} - _HOLDING))
    if known:
        try:
            request, deleting = pod_request(
                {**document, "spec": {name: value for name, value in spec.items() if name not in known}}, qualifiers
            )
        except InputError:
            pass  # something else cannot be read now: found field by field below
        else:
            return request, deleting, tuple(f"spec.{name}" for name in known if name in spec)
    kept = {name: value for name, value in spec.items() if name in _HOLDING}
    pod_request({**document, "spec": kept}, qualifiers)
    dropped = []
    for name in sorted(spec.keys() & _PodSpec.model_fields.keys() - _HOLDING):
        trial = {**kept, name: spec[name]}
        try:
            pod_request({**document, "spec": trial}, qualifiers)
        except InputError:
            dropped.append(name)
        else:
            kept = trial
    request, deleting = pod_request({**document, "spec": kept}, qualifiers)
    return request, deleting, tuple(f"spec.{name}" for name in dropped)


def _resource_claims(pod: _Pod) -> tuple[ClaimRef, ...]:
    """The pod's `spec.resourceClaims`, with the claims made from templates (`status.resourceClaimStatuses`). A
    container's `resources.claims` must name one of them, as the API server's validation holds."""
    spec = pod.spec
    names: set[str] = set()
    for i, ref in enumerate(spec.resourceClaims):
        if ref.name in names:
            raise ManifestError(f"Pod.spec.resourceClaims[{i}].name: {shorten(ref.name)!r} appears twice")
        names.add(ref.name)
    for kind, containers in (("containers", spec.containers), ("initContainers", spec.initContainers)):
        for i, container in enumerate(containers):
            for j, claim in enumerate(container.resources.claims):
                if claim.name not in names:
                    raise ManifestError(
                        f"Pod.spec.{kind}[{i}].resources.claims[{j}].name: {shorten(claim.name)!r} must be the name "
                        "of one of the pod's spec.resourceClaims"
                    )
    generated = {s.name: s.resourceClaimName for s in pod.status.resourceClaimStatuses}
    return tuple(
        ClaimRef(ref.name, ref.resourceClaimName, ref.resourceClaimTemplateName, generated.get(ref.name))
        for ref in spec.resourceClaims
    )


class _Resized:
    """The containers' requests as kube-scheduler 1.33+ counts them (`resource.PodRequests` with
    `UseStatusResources`, the InPlacePodVerticalScaling gate on by default): a container whose status reports
    `resources` counts the largest of its spec's requests, the status' `resources.requests` and its
    `allocatedResources`, resource by resource; while the kubelet calls the resize infeasible (the `PodResizePending`
    condition with reason `Infeasible`) the spec's new requests are not counted, only the two the kubelet reports.
    Sidecars follow the same rule; classic init containers count their spec. Devices (extended resources) cannot be
    resized: the spec's count stays the floor, so a resize never frees devices a container holds."""

    def __init__(self, statuses: dict[str, tuple[_ContainerStatus, str]], infeasible: bool) -> None:
        self.statuses, self.infeasible = statuses, infeasible

    @classmethod
    def of(cls, raw: Any) -> _Resized:
        if not isinstance(raw, Mapping) or not any(
            isinstance(entry, Mapping) and "resources" in entry
            for field in ("containerStatuses", "initContainerStatuses")
            for entry in _list(raw.get(field))
        ):
            return _NOT_RESIZED
        status: _ResizeStatus = _parse(_ResizeStatus, raw, "Pod.status")
        statuses = {}
        for field, group in (
            ("containerStatuses", status.containerStatuses),
            ("initContainerStatuses", status.initContainerStatuses),
        ):
            for index, entry in enumerate(group):
                if entry.resources is not None:
                    statuses[entry.name] = (entry, f"Pod.status.{field}[{index}]")
        infeasible = next((c.reason == "Infeasible" for c in status.conditions if c.type == "PodResizePending"), False)
        return cls(statuses, infeasible)

    def request(self, container: _Container, where: str) -> ContainerRequest:
        spec = _container_request(container, where)
        found = self.statuses.get(container.name)
        if found is None:
            return spec
        status, at = found
        counted = dict(spec.resources)
        if self.infeasible:
            counted = {name: amount for name, amount in counted.items() if is_extended_resource(name)}
        reported = (status.resources.requests if status.resources else {}, f"{at}.resources.requests")
        for amounts, here in (reported, (status.allocatedResources or {}, f"{at}.allocatedResources")):
            for name, value in amounts.items():
                amount = _units(name, value, here)
                counted[name] = max(counted.get(name, 0), amount)
        return ContainerRequest(name=container.name, resources=counted)


_NOT_RESIZED = _Resized({}, False)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


POD_LEVEL = ("cpu", "memory")  # and hugepages-*: kube-scheduler's IsSupportedPodLevelResource


def _pod_level(resources: _Resources | None) -> dict[str, int]:
    """`spec.resources.requests` (pod-level resources, 1.32+, beta 1.34) of the resources that may be set per pod;
    each replaces the containers' sum for the pod's request (kube-scheduler's `applyPodLevelResources`)."""
    if resources is None:
        return {}
    _check_requests_against_limits(resources.requests, resources.limits, "Pod.spec.resources")
    return {
        name: _units(name, value, "Pod.spec.resources.requests")
        for name, value in resources.requests.items()
        if name in POD_LEVEL or name.startswith("hugepages-")
    }


def _init_holders(
    containers: tuple[ContainerRequest, ...],
    init: list[tuple[ContainerRequest, bool]],
    qualifiers: Mapping[str, str] | None = None,
) -> tuple[ContainerRequest, ...]:
    """For each device (extended resource) whose classic init containers' steps need more than the app containers
    and sidecars (`containers`) hold together, the init container whose step needs the most (the first such) holds
    the difference: the kubelet gives it that many devices more than the pod's other containers take from it, and
    keeps them for the pod. A step is the init container's count with the sidecars started before it (`init`, in
    order, True marking a sidecar), which keep theirs while it runs. Of the devices the others hold too, the holder
    holds more only where its step needs more of each it asks (a GPU share asking more memory than the app's, of
    as many GPUs, holds nothing: its memory is no device alone; it is given the app's share). A qualifier (a
    resource `qualifiers` maps to the device it is an amount of each of: `nvidia.com/gpucores` of `nvidia.com/gpu`)
    is held only beside more of its device: an init container asking a share of a GPU beside an app asking the whole
    GPU holds nothing, and is given its share of the app's GPU (`kubegpu.core.annotations.init_devices`)."""
    if not any(not sidecar for _, sidecar in init):
        return ()
    held: dict[str, int] = {}
    for container in containers:
        for name, amount in container.resources.items():
            held[name] = held.get(name, 0) + amount
    started: dict[str, int] = {}  # what the sidecars started so far hold
    most: dict[str, tuple[int, str]] = {}  # device -> (the most a step needs, the init container whose step it is)
    for container, sidecar in init:
        for name, amount in container.resources.items():
            if not is_extended_resource(name):
                continue
            if sidecar:
                started[name] = started.get(name, 0) + amount
            elif started.get(name, 0) + amount > max(held.get(name, 0), most.get(name, (0, ""))[0]):
                most[name] = (started.get(name, 0) + amount, container.name)
    asks = {c.name: c.resources for c, sidecar in init if not sidecar}
    extra: dict[str, dict[str, int]] = {}
    qualifiers = qualifiers or {}
    for name, (step, holder) in most.items():
        qualified = qualifiers.get(name)
        if qualified is not None and most.get(qualified, (0, ""))[1] != holder:
            continue  # an amount of each device of `qualified`, which the holder does not hold: no device alone
        # Beside the devices the others hold, the holder's request must still read as one (a GPU share's memory
        # is no device without its GPU): only where its step needs more of every such device it asks.
        shared = [other for other in asks[holder] if held.get(other, 0) and is_extended_resource(other)]
        if held.get(name, 0) and any(most.get(other, (0, ""))[1] != holder for other in shared):
            continue
        extra.setdefault(holder, {})[name] = step - held.get(name, 0)
    return tuple(ContainerRequest(name=c.name, resources=extra[c.name], init=True) for c, _ in init if c.name in extra)


def _init_steps(init: list[tuple[ContainerRequest, bool]]) -> tuple[InitStep, ...]:
    """The classic init containers that ask devices, each with the sidecars started before it."""
    steps = []
    sidecars: list[str] = []
    for container, sidecar in init:
        if sidecar:
            sidecars.append(container.name)
            continue
        devices = {name: n for name, n in container.resources.items() if n > 0 and is_extended_resource(name)}
        if devices:
            steps.append(InitStep(container.name, devices, tuple(sidecars)))
    return tuple(steps)


def _pod_requests(
    containers: tuple[ContainerRequest, ...],
    init: list[tuple[ContainerRequest, bool]],
    overhead: Mapping[str, int],
    pod_level: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Kubernetes' pod request per resource (`resource.PodRequests`): the sum over the containers and the sidecars
    (`init` entries marked True), at least what any init step needs (a classic init container with the sidecars
    started before it, or the sidecars started so far), the pod-level requests in place of that where set, plus
    overhead."""
    totals: dict[str, int] = {}
    for container in containers:
        for name, amount in container.resources.items():
            totals[name] = totals.get(name, 0) + amount
    # A step of the sidecars alone never needs more than `totals`, which holds them all; nor does a classic init
    # container's step in a resource it does not request. So each init container costs only its own resources.
    steps: dict[str, int] = {}  # the most a classic init container's step needs
    sidecars: dict[str, int] = {}  # the sidecars started so far
    for container, sidecar in init:
        for name, amount in container.resources.items():
            if sidecar:
                sidecars[name] = sidecars.get(name, 0) + amount
                totals[name] = totals.get(name, 0) + amount
            else:
                steps[name] = max(steps.get(name, 0), sidecars.get(name, 0) + amount)
    for name, amount in steps.items():
        totals[name] = max(totals.get(name, 0), amount)
    totals.update(pod_level or {})
    for name, amount in overhead.items():
        totals[name] = totals.get(name, 0) + amount
    return {name: amount for name, amount in totals.items() if amount > 0}


def _requirements(items: list[_Requirement], where: str, *, numeric: bool) -> tuple[Requirement, ...]:
    """Selector requirements, checked as Kubernetes checks them: `In`/`NotIn` need values, `Exists`/`DoesNotExist`
    none, `Gt`/`Lt` (node selectors only) one integer."""
    found = []
    for index, item in enumerate(items):
        here = f"{where}[{index}]"
        if item.operator in ("In", "NotIn") and not item.values:
            raise ManifestError(f"{here}.values: operator {item.operator} needs at least one value")
        if item.operator in ("Exists", "DoesNotExist") and item.values:
            raise ManifestError(f"{here}.values: operator {item.operator} takes no values")
        if item.operator in ("Gt", "Lt"):
            if not numeric:
                raise ManifestError(f"{here}.operator: {item.operator} is only valid in node selectors")
            if len(item.values) != 1 or not _is_integer(item.values[0]):
                raise ManifestError(f"{here}.values: operator {item.operator} needs exactly one integer value")
        found.append(Requirement(item.key, item.operator, tuple(item.values)))
    return tuple(found)


def _is_integer(text: str) -> bool:
    body = text[1:] if text[:1] in "+-" else text
    return body.isascii() and body.isdigit() and len(body) <= 19


def _node_term(
    term: _NodeSelectorTerm,
    where: str = "Pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
) -> NodeSelectorTerm:
    return NodeSelectorTerm(
        _requirements(term.matchExpressions, f"{where}.matchExpressions", numeric=True),
        _requirements(term.matchFields, f"{where}.matchFields", numeric=True),
    )


def _preferred_node_terms(affinity: _NodeAffinity | None) -> tuple[tuple[int, NodeSelectorTerm], ...]:
    if affinity is None:
        return ()
    where = "Pod.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    return tuple(
        (term.weight, _node_term(term.preference, f"{where}[{i}].preference"))
        for i, term in enumerate(affinity.preferredDuringSchedulingIgnoredDuringExecution)
    )


def _preferred_terms(affinity: _PodAffinity | None, meta: _Meta, kind: str) -> tuple[tuple[int, PodAffinityTerm], ...]:
    if affinity is None:
        return ()
    where = f"Pod.spec.affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution"
    return tuple(
        (term.weight, _affinity_term(term.podAffinityTerm, meta, f"{where}[{i}].podAffinityTerm"))
        for i, term in enumerate(affinity.preferredDuringSchedulingIgnoredDuringExecution)
    )


def _selector(selector: _LabelSelector | None, where: str) -> LabelSelector | None:
    if selector is None:
        return None
    labels = tuple(Requirement(key, "In", (value,)) for key, value in sorted(selector.matchLabels.items()))
    expressions = _requirements(selector.matchExpressions, f"{where}.matchExpressions", numeric=False)
    return LabelSelector(labels + expressions)


def _affinity_terms(affinity: _PodAffinity | None, meta: _Meta, kind: str) -> tuple[PodAffinityTerm, ...]:
    if affinity is None:
        return ()
    where = f"Pod.spec.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution"
    return tuple(
        _affinity_term(term, meta, f"{where}[{i}]")
        for i, term in enumerate(affinity.requiredDuringSchedulingIgnoredDuringExecution)
    )


def _affinity_term(term: _PodAffinityTerm, meta: _Meta, where: str) -> PodAffinityTerm:
    """A pod (anti-)affinity term with its `matchLabelKeys` and `mismatchLabelKeys` (1.29+, beta and on by default
    from 1.31) merged into its selector as the API server merges them when it creates the pod: `key In (value)` and
    `key NotIn (value)` with the pod's own label value, a key the pod lacks skipped, nothing when the selector is
    unset (which the API server refuses). A key the selector already holds with that operator is the server's merge,
    seen again: it is not added twice."""
    selector = _selector(term.labelSelector, f"{where}.labelSelector")
    both = set(term.matchLabelKeys) & set(term.mismatchLabelKeys)
    if both:
        raise ManifestError(
            f"{where}.mismatchLabelKeys: {shorten(sorted(both)[0])!r} is also in matchLabelKeys; a key may be in "
            "only one of them"
        )
    for field, keys, operator in (
        ("matchLabelKeys", term.matchLabelKeys, "In"),
        ("mismatchLabelKeys", term.mismatchLabelKeys, "NotIn"),
    ):
        _check_label_keys(keys, f"{where}.{field}")
        if keys and selector is None:
            raise ManifestError(f"{where}.{field}: must not be set when labelSelector is not set")
        if selector is not None:
            selector = _merge_label_keys(selector, keys, operator, meta.labels)
    # The pod's own namespace only where neither `namespaces` nor `namespaceSelector` says otherwise (an empty
    # selector, `{}`, is every namespace; the API server keeps it apart from an absent one).
    chosen = _selector(term.namespaceSelector, f"{where}.namespaceSelector")
    namespaces = term.namespaces or (() if chosen is not None else (meta.namespace,))
    return PodAffinityTerm(selector, frozenset(namespaces), term.topologyKey, chosen)


def _spread_constraint(constraint: _SpreadConstraint, labels: Mapping[str, str], where: str) -> SpreadConstraint:
    """A topology spread constraint as kube-scheduler 1.33+ reads it: `minDomains` (only with DoNotSchedule, as the
    API server requires), the node inclusion policies (absent: Honor node affinity, Ignore taints) and
    `matchLabelKeys` merged into the selector as `key In (the pod's value)` (a key the pod lacks skipped; an unset
    selector then selects by those labels alone, as kube-scheduler's merge gives)."""
    if constraint.minDomains is not None and constraint.whenUnsatisfiable != "DoNotSchedule":
        raise ManifestError(
            f"{where}.minDomains: can only be used with whenUnsatisfiable: DoNotSchedule, not "
            f"{constraint.whenUnsatisfiable}"
        )
    _check_label_keys(constraint.matchLabelKeys, f"{where}.matchLabelKeys")
    selector = _selector(constraint.labelSelector, f"{where}.labelSelector")
    if constraint.matchLabelKeys and any(key in labels for key in constraint.matchLabelKeys):
        selector = _merge_label_keys(selector or LabelSelector(), constraint.matchLabelKeys, "In", labels)
    return SpreadConstraint(
        constraint.maxSkew,
        constraint.topologyKey,
        constraint.whenUnsatisfiable,
        selector,
        constraint.minDomains or 1,
        constraint.nodeAffinityPolicy or "Honor",
        constraint.nodeTaintsPolicy or "Ignore",
    )


def _merge_label_keys(
    selector: LabelSelector, keys: list[str], operator: str, labels: Mapping[str, str]
) -> LabelSelector:
    have = {(r.key, r.operator) for r in selector.requirements}
    added = tuple(
        Requirement(key, operator, (labels[key],)) for key in keys if key in labels and (key, operator) not in have
    )
    return LabelSelector(selector.requirements + added) if added else selector


def _check_label_keys(keys: list[str], where: str) -> None:
    for index, key in enumerate(keys):
        if not _valid_label_key(key):
            raise ManifestError(f"{where}[{index}]: {shorten(key)!r} is not a valid label key")


_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _valid_label_key(key: str) -> bool:
    """Kubernetes' qualified name: an optional DNS subdomain prefix (253 at most) and `/`, then a name of 63 at
    most, alphanumeric at both ends."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (0 < len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def node_info(document: Mapping[str, Any]) -> NodeInfo:
    """The `NodeInfo` of a Node manifest. A node with no `allocatable` uses its `capacity`; `pods` defaults to 110.

    A node without conditions counts as Ready (hand-written simulator input); with conditions, `Ready` must be True.
    """
    node: _Node = _parse(_Node, document, "Node")
    field = "allocatable" if node.status.allocatable else "capacity"
    allocatable = {
        name: _units(name, value, f"Node.status.{field}") for name, value in getattr(node.status, field).items()
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
        images=node_images(document),
    )


def node_images(document: Mapping[str, Any]) -> dict[str, int]:
    """A Node's `status.images` as image name -> size in bytes, every name of each image, in the kubelet's order
    (largest first). Read leniently and within bounds (`kubegpu.core.limits`): the first `MAX_NODE_IMAGE_NAMES`
    names are looked at, and a name too long, an entry of the wrong shape or a size that is not a count is skipped,
    so a Node's image list never refuses the node nor costs what it claims."""
    status = document.get("status")
    images = status.get("images") if isinstance(status, Mapping) else None
    found: dict[str, int] = {}
    if not isinstance(images, list):
        return found
    budget = MAX_NODE_IMAGE_NAMES  # names left to look at (an entry without usable names costs one)
    for image in images:
        if budget <= 0:
            break
        names = image.get("names") if isinstance(image, Mapping) else None
        size = image.get("sizeBytes", 0) if isinstance(image, Mapping) else None
        if not isinstance(names, list) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            budget -= 1
            continue
        looked = names[:budget]
        for name in looked:
            if isinstance(name, str) and 0 < len(name) <= MAX_IMAGE_NAME_LENGTH:
                found.setdefault(name, min(size, 1 << 62))
        budget -= max(1, len(looked))
    return found


def label_selector(document: Any, where: str) -> LabelSelector | None:
    """A `metav1.LabelSelector` (`matchLabels`, `matchExpressions`) from any object kind; None when absent."""
    if document is None:
        return None
    return _selector(_parse(_LabelSelector, document, where), where)


def node_selector_terms(document: Any, where: str) -> tuple[NodeSelectorTerm, ...] | None:
    """The terms of a `NodeSelector` (`nodeSelectorTerms`) from any object kind (a PersistentVolume's
    `spec.nodeAffinity.required`); None when absent."""
    if document is None:
        return None
    return tuple(_node_term(t) for t in _parse(_NodeSelector, document, where).nodeSelectorTerms)
