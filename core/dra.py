"""Dynamic Resource Allocation's objects (`resource.k8s.io/v1`, GA in Kubernetes 1.34), read at the boundary.

DRA replaces counting extended resources with naming devices: a driver publishes each node's devices as
`ResourceSlice`s (a device has a name, typed attributes and capacities), an administrator says which devices make a
class with `DeviceClass` CEL selectors, and a pod names `ResourceClaim`s (directly, or through a
`ResourceClaimTemplate` from which each pod gets its own claim) whose requests pick devices by class, more CEL
selectors, a count (or `allocationMode: All`) and constraints such as `matchAttribute`. The scheduler allocates: it
writes the chosen devices into the claim's `status.allocation` and the pod into its `status.reservedFor`.

This module decodes the four kinds in their upstream shape (`kubernetes/api`, `resource/v1/types.go`, 1.34) into
frozen records the allocator reads (`kubegpu.scheduler.dra`), with upstream's bounds on sizes (128 devices per
slice, 32 attributes and capacities per device, 32 requests, constraints and selectors per claim, CEL expressions of
at most 10 KiB, attribute strings of at most 64 characters) so that one object never costs more than itself, and
errors naming the field (`ResourceSlice.spec.devices[3].attributes.index: ...`). Fields that change what an
allocation means and that kubegpu does not implement yet (consumable capacity, partitionable devices' counters,
`distinctAttribute`) are refused by name rather than ignored; fields that only add information are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kubegpu.core.errors import InputError, describe_validation_error
from kubegpu.core.manifests import ManifestError, node_selector_terms
from kubegpu.core.models import ClaimRef, NodeSelectorTerm
from kubegpu.core.quantity import QuantityError, parse_quantity

__all__ = [
    "API_VERSION",
    "Claim",
    "ClaimRef",
    "ClaimSpec",
    "Constraint",
    "Device",
    "DeviceClass",
    "DraError",
    "Request",
    "Slice",
    "Template",
    "device_class",
    "resource_claim",
    "resource_claim_template",
    "resource_slice",
]

API_VERSION = "resource.k8s.io/v1"
GROUP = "resource.k8s.io"
# Upstream's bounds (resource/v1/types.go).
MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES_PER_DEVICE = 32  # attributes and capacities together
MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_CONSTRAINTS = 32
MAX_SELECTORS = 32
MAX_CONFIGS = 32
MAX_COUNT = 32  # AllocationResultsMaxSize: devices in one allocation
MAX_RESERVED_FOR = 256
MAX_CEL_LENGTH = 10 * 1024
MAX_ATTRIBUTE_VALUE = 64
MAX_DRIVER_NAME = 63
MAX_OPAQUE_BYTES = 10 * 1024
MAX_POD_CLAIMS = 32

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")

Value = int | bool | str


class DraError(InputError):
    """A DeviceClass, ResourceSlice, ResourceClaim or ResourceClaimTemplate kubegpu cannot read."""


def _dns_label(value: str) -> str:
    if not _DNS_LABEL.match(value):
        raise ValueError(f"{value[:80]!r} is not a DNS label (lowercase letters, digits and '-', at most 63)")
    return value


def _dns_subdomain(value: str) -> str:
    if not _DNS_SUBDOMAIN.match(value):
        raise ValueError(f"{value[:80]!r} is not a DNS subdomain (lowercase letters, digits, '-' and '.')")
    return value


def _driver(value: str) -> str:
    if len(value) > MAX_DRIVER_NAME:
        raise ValueError(f"a driver name has at most {MAX_DRIVER_NAME} characters, not {len(value)}")
    return _dns_subdomain(value)


def qualified_name(name: str, driver: str) -> tuple[str, str]:
    """(domain, identifier) of an attribute or capacity name; a name without a domain is the driver's."""
    domain, sep, ident = name.rpartition("/")
    if not sep:
        domain = driver
    if not _C_IDENTIFIER.match(ident):
        raise ValueError(f"{name[:80]!r}: the name after the domain must be a C identifier of at most 32 characters")
    if sep and not (len(domain) <= MAX_DRIVER_NAME and _DNS_SUBDOMAIN.match(domain)):
        raise ValueError(f"{name[:80]!r}: the domain must be a DNS subdomain of at most {MAX_DRIVER_NAME} characters")
    return domain, ident


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Owner(_Model):
    kind: str = ""
    uid: str = ""
    controller: bool | None = None


class _Meta(_Model):
    name: str = Field(min_length=1, max_length=253)
    namespace: str = Field(default="default", min_length=1, max_length=63)
    uid: str | None = None
    generation: int = 0
    deletionTimestamp: str | None = None
    ownerReferences: list[_Owner] = Field(default_factory=list)

    def owning_pod(self) -> str | None:
        """The UID of the pod that controls the object (a claim made from a template for it), if any."""
        return next((o.uid for o in self.ownerReferences if o.controller and o.kind == "Pod" and o.uid), None)


# -- devices (ResourceSlice) -------------------------------------------------------------------------------------


class _Attribute(_Model):
    int_: int | None = Field(default=None, alias="int", ge=-(1 << 63), lt=1 << 63)
    bool_: bool | None = Field(default=None, alias="bool")
    string: str | None = Field(default=None, max_length=MAX_ATTRIBUTE_VALUE)
    version: str | None = Field(default=None, max_length=MAX_ATTRIBUTE_VALUE)

    @model_validator(mode="after")
    def _exactly_one(self) -> _Attribute:
        given = [v for v in (self.int_, self.bool_, self.string, self.version) if v is not None]
        if len(given) != 1:
            raise ValueError("exactly one of int, bool, string or version must be set")
        return self

    def value(self) -> Value:
        for v in (self.int_, self.bool_, self.string, self.version):
            if v is not None:
                return v
        raise AssertionError("validated")  # pragma: no cover


class _Capacity(_Model):
    value: str | int

    @field_validator("value")
    @classmethod
    def _quantity(cls, value: str | int) -> str | int:
        try:
            parse_quantity(value)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
        return value


class _Device(_Model):
    name: str = Field(min_length=1)
    attributes: dict[str, _Attribute] = Field(default_factory=dict)
    capacity: dict[str, _Capacity] = Field(default_factory=dict)
    consumesCounters: list[dict[str, Any]] = Field(default_factory=list)
    nodeName: str | None = None
    allNodes: bool | None = None
    nodeSelector: dict[str, Any] | None = None

    _name = field_validator("name")(_dns_label)

    @model_validator(mode="after")
    def _bounded(self) -> _Device:
        if len(self.attributes) + len(self.capacity) > MAX_ATTRIBUTES_PER_DEVICE:
            raise ValueError(f"at most {MAX_ATTRIBUTES_PER_DEVICE} attributes and capacities together")
        if self.consumesCounters:
            raise ValueError("consumesCounters (partitionable devices) is not supported by kubegpu yet")
        if self.nodeName is not None or self.allNodes is not None or self.nodeSelector is not None:
            raise ValueError("per-device node selection is not supported by kubegpu yet; set it on the slice")
        return self


class _Pool(_Model):
    name: str = Field(min_length=1, max_length=253)
    generation: int = Field(ge=0)
    resourceSliceCount: int = Field(ge=1)


class _SliceSpec(_Model):
    driver: str
    pool: _Pool
    nodeName: str | None = Field(default=None, min_length=1, max_length=253)
    nodeSelector: dict[str, Any] | None = None
    allNodes: bool | None = None
    perDeviceNodeSelection: bool | None = None
    devices: list[_Device] = Field(default_factory=list, max_length=MAX_DEVICES_PER_SLICE)
    sharedCounters: list[dict[str, Any]] = Field(default_factory=list)

    _driver = field_validator("driver")(_driver)

    @model_validator(mode="after")
    def _one_node_selection(self) -> _SliceSpec:
        chosen = [self.nodeName is not None, self.nodeSelector is not None, bool(self.allNodes)]
        if self.perDeviceNodeSelection:
            raise ValueError("perDeviceNodeSelection is not supported by kubegpu yet")
        if sum(chosen) != 1:
            raise ValueError("exactly one of nodeName, nodeSelector or allNodes must be set")
        if self.sharedCounters:
            raise ValueError("sharedCounters (partitionable devices) is not supported by kubegpu yet")
        names: set[str] = set()
        for i, device in enumerate(self.devices):
            if device.name in names:
                raise ValueError(f"devices[{i}].name: {device.name!r} appears twice")
            names.add(device.name)
        return self


class _Slice(_Model):
    kind: Literal["ResourceSlice"] = "ResourceSlice"
    metadata: _Meta
    spec: _SliceSpec


# -- classes and requests (DeviceClass, ResourceClaim) ----------------------------------------------------------------


class _CEL(_Model):
    expression: str = Field(min_length=1, max_length=MAX_CEL_LENGTH)


class _Selector(_Model):
    cel: _CEL


class _Opaque(_Model):
    driver: str
    parameters: Any

    _driver = field_validator("driver")(_driver)

    @field_validator("parameters")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        """Upstream's `OpaqueParametersMaxLength`: every allocation of the claim carries a copy of the parameters
        (in its status, in each pod's `simulate` event), so their size is bounded where they are read."""
        try:
            size = len(orjson.dumps(value))
        except (TypeError, orjson.JSONEncodeError):
            raise ValueError("must be JSON (an object, list, string, number or boolean)") from None
        if size > MAX_OPAQUE_BYTES:
            raise ValueError(f"at most {MAX_OPAQUE_BYTES} bytes of JSON (upstream's bound), not {size}")
        return value


class _ClassConfig(_Model):
    opaque: _Opaque | None = None


class _ClassSpec(_Model):
    selectors: list[_Selector] = Field(default_factory=list, max_length=MAX_SELECTORS)
    config: list[_ClassConfig] = Field(default_factory=list, max_length=MAX_CONFIGS)
    extendedResourceName: str | None = None


class _DeviceClass(_Model):
    kind: Literal["DeviceClass"] = "DeviceClass"
    metadata: _Meta
    spec: _ClassSpec = _ClassSpec()


class _SubRequest(_Model):
    name: str
    deviceClassName: str = Field(min_length=1, max_length=253)
    selectors: list[_Selector] = Field(default_factory=list, max_length=MAX_SELECTORS)
    allocationMode: Literal["ExactCount", "All"] = "ExactCount"
    count: int = Field(default=1, ge=1, le=MAX_COUNT)
    capacity: dict[str, Any] | None = None

    _name = field_validator("name")(_dns_label)

    @model_validator(mode="after")
    def _no_capacity(self) -> _SubRequest:
        if self.capacity is not None:
            raise ValueError("capacity (consumable capacity) is not supported by kubegpu yet")
        return self


class _Exact(_Model):
    deviceClassName: str = Field(min_length=1, max_length=253)
    selectors: list[_Selector] = Field(default_factory=list, max_length=MAX_SELECTORS)
    allocationMode: Literal["ExactCount", "All"] = "ExactCount"
    count: int = Field(default=1, ge=1, le=MAX_COUNT)
    adminAccess: bool | None = None
    capacity: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _no_capacity(self) -> _Exact:
        if self.capacity is not None:
            raise ValueError("capacity (consumable capacity) is not supported by kubegpu yet")
        if self.adminAccess:
            # Upstream grants it only in namespaces an administrator labelled; kubegpu reads no namespace labels, so
            # a tenant's claim would reach devices other pods hold.
            raise ValueError("adminAccess is not supported by kubegpu yet (it would give devices other claims hold)")
        return self


class _Request(_Model):
    name: str
    exactly: _Exact | None = None
    firstAvailable: list[_SubRequest] | None = Field(default=None, min_length=1, max_length=MAX_SUBREQUESTS)

    _name = field_validator("name")(_dns_label)

    @model_validator(mode="after")
    def _one_of(self) -> _Request:
        if (self.exactly is None) == (self.firstAvailable is None):
            raise ValueError("exactly one of exactly or firstAvailable must be set")
        return self


class _Constraint(_Model):
    requests: list[str] = Field(default_factory=list, max_length=MAX_REQUESTS)
    matchAttribute: str | None = None
    distinctAttribute: str | None = None

    @model_validator(mode="after")
    def _match(self) -> _Constraint:
        if self.distinctAttribute is not None:
            raise ValueError("distinctAttribute is not supported by kubegpu yet")
        if self.matchAttribute is None:
            raise ValueError("matchAttribute must be set")
        qualified_name(self.matchAttribute, "")
        if "/" not in self.matchAttribute:
            raise ValueError("matchAttribute must be a fully qualified name (domain/name)")
        return self


class _ClaimConfig(_Model):
    requests: list[str] = Field(default_factory=list, max_length=MAX_REQUESTS)
    opaque: _Opaque | None = None


class _Devices(_Model):
    requests: list[_Request] = Field(default_factory=list, max_length=MAX_REQUESTS)
    constraints: list[_Constraint] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    config: list[_ClaimConfig] = Field(default_factory=list, max_length=MAX_CONFIGS)

    @model_validator(mode="after")
    def _known_requests(self) -> _Devices:
        names: set[str] = set()
        for i, request in enumerate(self.requests):
            if request.name in names:
                raise ValueError(f"requests[{i}].name: {request.name!r} appears twice")
            names.add(request.name)
            for sub in request.firstAvailable or ():
                names.add(f"{request.name}/{sub.name}")
        named: list[tuple[str, list[str]]] = [("constraints", c.requests) for c in self.constraints]
        named += [("config", c.requests) for c in self.config]
        for what, requests in named:
            for name in requests:
                if name not in names:
                    raise ValueError(f"{what}: {name[:80]!r} names no request of this claim")
        return self


class _ClaimSpec(_Model):
    devices: _Devices = _Devices()


class _Consumer(_Model):
    apiGroup: str = ""
    resource: str = Field(min_length=1)
    name: str = Field(min_length=1)
    uid: str = Field(min_length=1)


class _Result(_Model):
    request: str = Field(min_length=1)
    driver: str
    pool: str = Field(min_length=1)
    device: str = Field(min_length=1)
    adminAccess: bool | None = None


class _AllocatedDevices(_Model):
    results: list[_Result] = Field(default_factory=list, max_length=MAX_COUNT)
    config: list[dict[str, Any]] = Field(default_factory=list, max_length=2 * MAX_CONFIGS)


class _Allocation(_Model):
    devices: _AllocatedDevices = _AllocatedDevices()
    nodeSelector: dict[str, Any] | None = None


class _ClaimStatus(_Model):
    allocation: _Allocation | None = None
    reservedFor: list[_Consumer] = Field(default_factory=list, max_length=MAX_RESERVED_FOR)


class _Claim(_Model):
    kind: Literal["ResourceClaim"] = "ResourceClaim"
    metadata: _Meta
    spec: _ClaimSpec = _ClaimSpec()
    status: _ClaimStatus = _ClaimStatus()


class _TemplateSpec(_Model):
    spec: _ClaimSpec = _ClaimSpec()


class _Template(_Model):
    kind: Literal["ResourceClaimTemplate"] = "ResourceClaimTemplate"
    metadata: _Meta
    spec: _TemplateSpec


# -- the records the allocator reads ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Device:
    """One device of a slice. `attributes` and `capacity` are keyed by (domain, identifier); capacities in base
    units, rounded up. `facts` is what a CEL selector can read of it (driver, attributes, capacity): devices alike in
    facts answer every selector alike, so answers are remembered per facts, not per device."""

    driver: str
    pool: str
    name: str
    attributes: Mapping[tuple[str, str], Value]
    capacity: Mapping[tuple[str, str], int]
    facts: tuple[object, ...]

    @property
    def id(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


@dataclass(frozen=True, slots=True, eq=False)
class Slice:
    name: str
    driver: str
    pool: str
    generation: int
    node_name: str | None
    node_selector: Mapping[str, Any] | None  # the upstream NodeSelector, as an allocation writes it
    node_terms: tuple[NodeSelectorTerm, ...] | None  # the same, read
    all_nodes: bool
    devices: tuple[Device, ...]


@dataclass(frozen=True, slots=True, eq=False)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    config: tuple[Mapping[str, Any], ...]  # each an `opaque` object


@dataclass(frozen=True, slots=True)
class Request:
    """One request, or one alternative of a `firstAvailable` request (`name` is then `request/subrequest`)."""

    name: str
    class_name: str
    selectors: tuple[str, ...]
    mode: Literal["ExactCount", "All"]
    count: int
    admin_access: bool = False
    alternatives: tuple[Request, ...] = ()  # firstAvailable: tried in order


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: tuple[str, ...]  # empty: every request
    match_attribute: tuple[str, str]


@dataclass(frozen=True, slots=True, eq=False)
class ClaimSpec:
    """A claim's (or template's) `spec.devices`. Compared by identity: one object per decoded claim or template, so
    a pod's plan can hold it in its signature cheaply."""

    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]
    config: tuple[Mapping[str, Any], ...]  # {"requests": [...], "opaque": {...}}


@dataclass(frozen=True, slots=True, eq=False)
class Claim:
    namespace: str
    name: str
    uid: str
    spec: ClaimSpec
    allocation: Mapping[str, Any] | None  # `status.allocation`, upstream shape
    reserved_for: tuple[Mapping[str, str], ...] = ()
    deleting: bool = False
    node_terms: tuple[NodeSelectorTerm, ...] | None = None  # the allocation's nodeSelector, read (None: any node)
    owner: str | None = None  # the UID of the pod it was made for from a template (its controller), if any

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def allocated_devices(self) -> list[tuple[tuple[str, str, str], bool]]:
        """(driver, pool, device) of each allocated device, and whether it was allocated with admin access."""
        if self.allocation is None:
            return []
        return [
            ((r["driver"], r["pool"], r["device"]), bool(r.get("adminAccess")))
            for r in self.allocation.get("devices", {}).get("results", ())
        ]


@dataclass(frozen=True, slots=True, eq=False)
class Template:
    namespace: str
    name: str
    spec: ClaimSpec


# -- decoding ---------------------------------------------------------------------------------------------------------


def _parse(model: type[_Model], document: Mapping[str, Any], kind: str) -> Any:
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise DraError(describe_validation_error(exc, kind)) from None


def _capacity(value: str | int) -> int:
    return int(parse_quantity(value).to_integral_value(rounding=ROUND_CEILING))


def resource_slice(document: Mapping[str, Any]) -> Slice:
    parsed: _Slice = _parse(_Slice, document, "ResourceSlice")
    spec = parsed.spec
    devices = []
    for i, device in enumerate(spec.devices):
        try:
            attributes = {qualified_name(k, spec.driver): v.value() for k, v in device.attributes.items()}
            capacity = {qualified_name(k, spec.driver): _capacity(v.value) for k, v in device.capacity.items()}
        except ValueError as exc:
            raise DraError(f"ResourceSlice.spec.devices[{i}]: {exc}") from None
        facts = (
            spec.driver,
            tuple(sorted(attributes.items(), key=lambda kv: kv[0])),
            tuple(sorted(capacity.items())),
        )
        devices.append(Device(spec.driver, spec.pool.name, device.name, attributes, capacity, facts))
    return Slice(
        parsed.metadata.name,
        spec.driver,
        spec.pool.name,
        spec.pool.generation,
        spec.nodeName,
        spec.nodeSelector,
        _terms(spec.nodeSelector, "ResourceSlice.spec.nodeSelector"),
        bool(spec.allNodes),
        tuple(devices),
    )


def _terms(selector: Mapping[str, Any] | None, where: str) -> tuple[NodeSelectorTerm, ...] | None:
    try:
        return node_selector_terms(selector, where)
    except ManifestError as exc:
        raise DraError(str(exc)) from None


def device_class(document: Mapping[str, Any]) -> DeviceClass:
    parsed: _DeviceClass = _parse(_DeviceClass, document, "DeviceClass")
    return DeviceClass(
        parsed.metadata.name,
        tuple(s.cel.expression for s in parsed.spec.selectors),
        tuple(c.opaque.model_dump(by_alias=True) for c in parsed.spec.config if c.opaque is not None),
    )


def _request(request: _Request | _SubRequest, exact: _Exact | _SubRequest, name: str) -> Request:
    return Request(
        name,
        exact.deviceClassName,
        tuple(s.cel.expression for s in exact.selectors),
        exact.allocationMode,
        exact.count,
        bool(getattr(exact, "adminAccess", None)),
    )


def _claim_spec(spec: _ClaimSpec) -> ClaimSpec:
    requests = []
    for request in spec.devices.requests:
        if request.exactly is not None:
            requests.append(_request(request, request.exactly, request.name))
        else:
            subs = tuple(_request(s, s, f"{request.name}/{s.name}") for s in request.firstAvailable or ())
            requests.append(Request(request.name, "", (), "ExactCount", 0, alternatives=subs))
    constraints = []
    for c in spec.devices.constraints:
        domain, _, ident = (c.matchAttribute or "").rpartition("/")
        constraints.append(Constraint(tuple(c.requests), (domain, ident)))
    config = tuple(
        {"requests": list(c.requests), "opaque": c.opaque.model_dump(by_alias=True)}
        for c in spec.devices.config
        if c.opaque is not None
    )
    return ClaimSpec(tuple(requests), tuple(constraints), config)


def resource_claim(document: Mapping[str, Any]) -> Claim:
    parsed: _Claim = _parse(_Claim, document, "ResourceClaim")
    meta = parsed.metadata
    allocation = parsed.status.allocation
    return Claim(
        meta.namespace,
        meta.name,
        meta.uid or "",
        _claim_spec(parsed.spec),
        allocation.model_dump(exclude_none=True) if allocation is not None else None,
        tuple(c.model_dump() for c in parsed.status.reservedFor),
        meta.deletionTimestamp is not None,
        _terms(allocation.nodeSelector, "ResourceClaim.status.allocation.nodeSelector") if allocation else None,
        meta.owning_pod(),
    )


def resource_claim_template(document: Mapping[str, Any]) -> Template:
    parsed: _Template = _parse(_Template, document, "ResourceClaimTemplate")
    return Template(parsed.metadata.namespace, parsed.metadata.name, _claim_spec(parsed.spec.spec))
