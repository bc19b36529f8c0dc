"""DRA's four kinds in their upstream shape (`resource.k8s.io/v1`), as pydantic models, and their decoding into the
records of `kubegpu.core.dra`.

Building some thirty pydantic models costs tens of milliseconds, so this module is imported at the first DRA object
decoded (`kubegpu.core.dra.resource_slice` and its siblings), not at every start of `kubegpu scheduler`: a cluster
without DRA never builds them. The bounds and the refusals by name are `kubegpu.core.dra`'s docstring's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import ROUND_CEILING
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kubegpu.core.dra import (
    _DNS_SUBDOMAIN,
    MAX_ATTRIBUTE_VALUE,
    MAX_ATTRIBUTES_PER_DEVICE,
    MAX_CEL_LENGTH,
    MAX_CONFIGS,
    MAX_CONSTRAINTS,
    MAX_COUNT,
    MAX_DEVICES_PER_SLICE,
    MAX_DRIVER_NAME,
    MAX_OPAQUE_BYTES,
    MAX_REQUESTS,
    MAX_RESERVED_FOR,
    MAX_SELECTORS,
    MAX_SUBREQUESTS,
    Claim,
    ClaimSpec,
    Constraint,
    Device,
    DeviceClass,
    DraError,
    Request,
    Slice,
    Template,
    Value,
    qualified_name,
)
from kubegpu.core.errors import describe_validation_error
from kubegpu.core.manifests import ManifestError, node_selector_terms
from kubegpu.core.models import NodeSelectorTerm
from kubegpu.core.quantity import QuantityError, parse_quantity

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


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


class _HeldClaim(_Model):
    """A claim read without its spec: what it holds (`resource_claim`)."""

    kind: Literal["ResourceClaim"] = "ResourceClaim"
    metadata: _Meta
    status: _ClaimStatus = _ClaimStatus()


_UNREAD = ClaimSpec((), (), ())


def resource_claim(document: Mapping[str, Any]) -> Claim:
    problem = None
    try:
        parsed: _Claim | _HeldClaim = _parse(_Claim, document, "ResourceClaim")
    except DraError as exc:
        try:
            parsed = _parse(_HeldClaim, document, "ResourceClaim")
        except DraError:
            raise exc from None
        problem = str(exc)
    meta = parsed.metadata
    allocation = parsed.status.allocation
    return Claim(
        meta.namespace,
        meta.name,
        meta.uid or "",
        _claim_spec(parsed.spec) if isinstance(parsed, _Claim) else _UNREAD,
        allocation.model_dump(exclude_none=True) if allocation is not None else None,
        tuple(c.model_dump() for c in parsed.status.reservedFor),
        meta.deletionTimestamp is not None,
        _terms(allocation.nodeSelector, "ResourceClaim.status.allocation.nodeSelector") if allocation else None,
        meta.owning_pod(),
        problem,
    )


class _NamedTemplate(_Model):
    kind: Literal["ResourceClaimTemplate"] = "ResourceClaimTemplate"
    metadata: _Meta


def resource_claim_template(document: Mapping[str, Any]) -> Template:
    try:
        parsed: _Template = _parse(_Template, document, "ResourceClaimTemplate")
    except DraError as exc:
        try:
            named: _NamedTemplate = _parse(_NamedTemplate, document, "ResourceClaimTemplate")
        except DraError:
            raise exc from None
        return Template(named.metadata.namespace, named.metadata.name, _UNREAD, str(exc))
    return Template(parsed.metadata.namespace, parsed.metadata.name, _claim_spec(parsed.spec.spec))
