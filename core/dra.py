"""Dynamic Resource Allocation's objects (`resource.k8s.io/v1`, GA in Kubernetes 1.34), read at the boundary.

DRA replaces counting extended resources with naming devices: a driver publishes each node's devices as
`ResourceSlice`s (a device has a name, typed attributes and capacities), an administrator says which devices make a
class with `DeviceClass` CEL selectors, and a pod names `ResourceClaim`s (directly, or through a
`ResourceClaimTemplate` from which each pod gets its own claim) whose requests pick devices by class, more CEL
selectors, a count (or `allocationMode: All`) and constraints such as `matchAttribute`. The scheduler allocates: it
writes the chosen devices into the claim's `status.allocation` and the pod into its `status.reservedFor`.

This module and `kubegpu.core.draschema` (its pydantic models, imported at the first object decoded) decode the
four kinds in their upstream shape (`kubernetes/api`, `resource/v1/types.go`, 1.34) into
frozen records the allocator reads (`kubegpu.scheduler.dra`), with upstream's bounds on sizes (128 devices per
slice, 32 attributes and capacities per device, 32 requests, constraints and selectors per claim, CEL expressions of
at most 10 KiB, attribute strings of at most 64 characters) so that one object never costs more than itself, and
errors naming the field (`ResourceSlice.spec.devices[3].attributes.index: ...`). Fields that change what an
allocation means and that kubegpu does not implement yet (consumable capacity, partitionable devices' counters,
`distinctAttribute`) are refused by name rather than ignored; fields that only add information are ignored.

Admin access (`exactly.adminAccess`, DRAAdminAccess: beta and on by default from 1.34) is read: such a request may be
given devices other claims hold, without holding them itself. The API server lets a claim or template carry it only in
a namespace labelled `resource.kubernetes.io/admin-access: "true"` (`ADMIN_NAMESPACE_LABEL`); the allocator checks
the label again where it allocates (`kubegpu.scheduler.dra`), since kubegpu also reads claims no such API server
checked (`kubegpu simulate`'s files, CRDs standing in for the kinds) and a label may be taken off after the claim was
made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kubegpu.core.errors import InputError
from kubegpu.core.models import ClaimRef, NodeSelectorTerm

__all__ = [
    "ADMIN_NAMESPACE_LABEL",
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
# The namespace label an administrator sets where claims may ask for admin access (upstream's
# `DRAAdminNamespaceLabelKey`, 1.34+; 1.33 spelled it `resource.k8s.io/admin-access`).
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
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

_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")

Value = int | bool | str


class DraError(InputError):
    """A DeviceClass, ResourceSlice, ResourceClaim or ResourceClaimTemplate kubegpu cannot read."""


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
    # Why its spec cannot be read (a field kubegpu does not implement): it is then never allocated by kubegpu, but
    # an allocation someone else wrote (kube-scheduler's) still holds its devices, and its pods may share it.
    problem: str | None = None

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
    problem: str | None = None  # why its spec cannot be read: its pods are told so, and no claim is made from it


# -- decoding: the pydantic models live in `kubegpu.core.draschema`, built at the first DRA object decoded -------------


def resource_slice(document: Mapping[str, Any]) -> Slice:
    """A ResourceSlice, read; `DraError` naming the field when it cannot be."""
    from kubegpu.core import draschema

    return draschema.resource_slice(document)


def device_class(document: Mapping[str, Any]) -> DeviceClass:
    """A DeviceClass, read; `DraError` naming the field when it cannot be."""
    from kubegpu.core import draschema

    return draschema.device_class(document)


def resource_claim(document: Mapping[str, Any]) -> Claim:
    """A ResourceClaim, read; `DraError` naming the field when it cannot be. A claim whose spec cannot be read but
    whose metadata and status can is read without its spec, the reason in `problem`: its allocation, written by
    another scheduler that implements what kubegpu does not, holds its devices all the same."""
    from kubegpu.core import draschema

    return draschema.resource_claim(document)


def resource_claim_template(document: Mapping[str, Any]) -> Template:
    """A ResourceClaimTemplate, read; `DraError` naming the field when it cannot be. One whose spec cannot be read but
    whose metadata can is read without its spec, the reason in `problem`, so that its pods are told what is wrong
    with it rather than that it does not exist."""
    from kubegpu.core import draschema

    return draschema.resource_claim_template(document)
