"""The allocation annotation, kubegpu's public contract between the scheduler side and the node side.

A placement is written on the pod as `kubegpu.io/allocation`, a JSON document::

    {"version": 1, "node": "trn-0", "podUID": "…",
     "containers": {"main": {"aws.amazon.com/neurondevice": ["4", "5", "6", "7"]}},
     "shares": {"main": {"gpu.intel.com/memory.max": {"card0": 5000000000}}},   # only for shared devices
     "init": {"check": {"aws.amazon.com/neurondevice": ["4", "5", "6", "7"]}},  # only for init containers' devices
     "plugins": {"neuron": {…}},                                                # each plugin's own fields
     "issued": 1763820000123456789,                                             # when the scheduler issued it
     "signature": "hex HMAC-SHA256"}                                            # set by the custom scheduler

`containers` names each device the pod holds once, under the container that holds it (an app container, a sidecar,
or the classic init container that holds what the pod needs beyond them: `kubegpu.core.manifests`). `init` names
what each classic init container asking devices is given, as the kubelet's device manager gives it: ids of its pod's
(`containers`'), the ones the init containers before it had first, never a sidecar's that runs beside it
(`init_devices`). The kubelet hands an init container's devices on to the containers after it, so an app
container's ids are among the init containers' where those ask at least as many. An init container asking a share of
a device its pod holds whole (30 % of the app's GPU) is lent the amounts it asks of it in `shares`, under its name.

The simulator, the custom scheduler and the extender write it; the CRI shim verifies the signature and that the
document names its node and pod before any plugin touches a container. Decoding errors are one line that names the
bad field. The node annotation `kubegpu.io/devices` (the advertised inventories) has its codec here too.

Anyone who may create a pod writes its annotations, so decoding is a trust boundary: whatever the value, the codec
raises `AnnotationError` (and `verify_allocation` answers False), in time and memory bounded by these limits:

* a value is at most `MAX_ANNOTATION_BYTES` (256 KiB, UTF-8), what the API server allows for all of an object's
  annotations together, checked before parsing;
* JSON nests at most `MAX_DEPTH` (32) levels (the parser, orjson, stops at 1024 without recursing; the rest is
  checked on the parsed value, so encoding and signing a decoded record never recurse deeply either);
* integers are within 64 bits (orjson reads nothing wider as an integer) and numbers finite;
* a signature is 64 lowercase hex digits (HMAC-SHA256), or the allocation simply does not verify;
* every id `init` names is one `containers` names for the same device, so an init container is never given a
  device its pod does not hold.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubegpu.core.errors import InputError, describe_validation_error, shorten
from kubegpu.core.models import InitStep, NodeDevices, PluginAllocation

__all__ = [
    "ALLOCATION_KEY",
    "DEVICES_KEY",
    "FOREIGN_DEVICES_KEY",
    "NODE_LEASE_LABEL",
    "NODE_LEASE_NAMESPACE",
    "NODE_LEASE_PREFIX",
    "AllocationRecord",
    "AnnotationError",
    "ForeignDevices",
    "decode_allocation",
    "decode_devices",
    "decode_foreign_devices",
    "encode_allocation",
    "encode_devices",
    "encode_foreign_devices",
    "init_devices",
    "merge_allocations",
    "sign_allocation",
    "unreadable",
    "verify_allocation",
    "verifying_key",
]

ALLOCATION_KEY = "kubegpu.io/allocation"
DEVICES_KEY = "kubegpu.io/devices"
# Each advertiser renews a Lease NODE_LEASE_NAMESPACE/NODE_LEASE_PREFIX + node name, labelled NODE_LEASE_LABEL=true;
# the scheduler side stops placing device pods on a node whose Lease expired (`kubegpu.scheduler.liveness`).
NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LEASE_PREFIX = "kubegpu-"
NODE_LEASE_LABEL = "kubegpu.io/node-lease"
# The device ids a node's kubelet gave pods that kubegpu did not place (its PodResources API), published by the node
# side (`kubegpu.crishim.podresources`) so that the scheduler side counts exactly those ids (`Engine.set_held_devices`).
FOREIGN_DEVICES_KEY = "kubegpu.io/foreign-devices"
SUPPORTED_VERSION = 1
MAX_ANNOTATION_BYTES = 256 * 1024
MAX_DEPTH = 32
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class AnnotationError(InputError):
    """A malformed kubegpu annotation; the message names the annotation and the field."""


# The fields `payload` leaves out, by (whether `issued` is set, whether `init` names anything): sets, which
# pydantic reads faster than frozensets; never changed.
_LEFT_OUT: dict[tuple[bool, bool], set[str]] = {
    (issued, init): {"signature"} | ({"issued"} if not issued else set()) | ({"init"} if not init else set())
    for issued in (False, True)
    for init in (False, True)
}


class AllocationRecord(BaseModel):
    """The decoded `kubegpu.io/allocation` value. Unknown top-level fields are kept, so newer writers round-trip."""

    model_config = ConfigDict(extra="allow", frozen=True)

    version: Literal[1]
    node: str = Field(min_length=1)
    podUID: str = Field(min_length=1)
    containers: dict[str, dict[str, list[str]]]
    shares: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # What each classic init container asking devices is given of the pod's: container -> resource -> ids, every id
    # one `containers` names. Empty in allocations written before this field existed, and left out of the payload
    # while empty, so those still verify.
    init: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    # Freshness: the scheduler's clock (Unix nanoseconds, strictly increasing within one scheduler) when it issued
    # the placement. Of two verified allocations that claim the same device, the later one is the scheduler's
    # current decision; the earlier is stale (docs/security.md). 0 in allocations written before this field existed.
    issued: int = Field(default=0, ge=0, le=2**63 - 1)
    signature: str | None = None

    def payload(self) -> bytes:
        """The canonical bytes the signature covers: every field but the signature, keys sorted (`issued` left out
        while 0 and `init` while empty, so allocations signed before those fields existed still verify)."""
        document = self.model_dump(mode="json", exclude=_LEFT_OUT[bool(self.issued), bool(self.init)])
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    def device_ids(self, container: str, resource: str) -> list[str]:
        return self.given(container).get(resource, [])

    def given(self, container: str) -> dict[str, list[str]]:
        """The ids the node side gives `container` of each device: a classic init container's from `init` (beside
        any it holds of other devices), any other container's from `containers`."""
        held = self.containers.get(container, {})
        init = self.init.get(container)
        return {**held, **init} if init else held

    def foreign_init_ids(self) -> str | None:
        """The first `init` id that `containers` does not name for the same device, as `init.<c>.<r>: <id>`."""
        held: dict[str, set[str]] = {}
        for resources in self.containers.values():
            for resource, ids in resources.items():
                held.setdefault(resource, set()).update(ids)
        for container, resources in self.init.items():
            for resource, ids in resources.items():
                for device in ids:
                    if device not in held.get(resource, ()):
                        return f"init.{container}.{resource}: {device}"
        return None


def merge_allocations(
    node: str,
    pod_uid: str,
    parts: list[PluginAllocation],
    issued: int = 0,
    init: tuple[InitStep, ...] = (),
    qualifiers: Mapping[str, str] | None = None,
) -> AllocationRecord:
    """One record from the plugins' placements of one pod, stamped `issued` (0: not stamped), naming what each of
    the pod's classic init containers asking devices (`init`, `PodRequest.init_steps`) is given (`init_devices`,
    with the plugins' `qualifiers`)."""
    containers: dict[str, dict[str, list[str]]] = {}
    shares: dict[str, dict[str, dict[str, int]]] = {}
    plugins: dict[str, dict[str, Any]] = {}
    for part in parts:
        for container, resources in part.containers.items():
            containers.setdefault(container, {}).update(resources)
        for container, by_resource in part.shares.items():
            shares.setdefault(container, {}).update(by_resource)
        if part.fields:
            plugins[part.plugin] = part.fields
    given: dict[str, dict[str, list[str]]] = {}
    if init:
        given, lent = init_devices(containers, shares, init, qualifiers)
        shares.update(lent)
    return AllocationRecord(
        version=1,
        node=node,
        podUID=pod_uid,
        containers=containers,
        shares=shares,
        plugins=plugins,
        init=given,
        issued=issued,
    )


def init_devices(
    containers: dict[str, dict[str, list[str]]],
    shares: dict[str, dict[str, dict[str, int]]],
    steps: tuple[InitStep, ...],
    qualifiers: Mapping[str, str] | None = None,
) -> tuple[dict[str, dict[str, list[str]]], dict[str, dict[str, dict[str, int]]]]:
    """What the kubelet's device manager gives each classic init container (`steps`, in order) of its pod's devices
    (`containers`): of each whole device, the ones the init containers before it had first, then others of the
    pod's, never one of a sidecar started before it (it keeps its own while the init container runs). The pod holds
    what the largest step needs (`kubegpu.core.manifests`), so each step finds enough. A share of a shared device
    (`shares`) is given whole, with its limits: the ids of the first container holding exactly as many, its shares
    of those devices with them (a GPU share's compute and memory amounts too). A device the pod does not hold
    enough of is named to nobody (the node side then gives the init container none of it). A qualifier the step
    asks beside its device (`qualifiers`: `nvidia.com/gpucores` of `nvidia.com/gpu`) is no device: where the step is
    given whole devices, it is lent its amount of each of them (30 % of the app's whole GPU), and the node side holds
    it to that share; where it is given a share, the share's own amounts go with it. Returns the ids given and the
    shares lent, each by init container and resource."""
    qualifiers = qualifiers or {}
    pool: dict[str, list[str]] = {}  # resource -> the pod's ids of each whole device, in the containers' order
    for container, resources in containers.items():
        for resource, ids in resources.items():
            if resource not in shares.get(container, {}):
                pool.setdefault(resource, []).extend(i for i in ids if i not in pool.get(resource, ()))
    given: dict[str, dict[str, list[str]]] = {}
    lent: dict[str, dict[str, dict[str, int]]] = {}
    reuse: dict[str, list[str]] = {}  # resource -> what the init containers so far had, for the next to reuse
    for step in steps:
        for resource, count in step.resources.items():
            if qualifiers.get(resource) in step.resources:
                continue  # an amount of each device of another the step asks: lent with those (below)
            if resource not in pool:
                lender = _share_lender(containers, shares, resource, count)
                if lender is None:
                    continue
                # The share goes with every amount of it the lender has (a GPU share's compute and memory beside it).
                devices = set(containers[lender][resource])
                for amount, ids in containers[lender].items():
                    if amount in shares[lender] and devices.issuperset(ids):
                        given.setdefault(step.name, {})[amount] = list(ids)
                        lent.setdefault(step.name, {})[amount] = dict(shares[lender][amount])
                continue
            running = {i for sidecar in step.sidecars for i in containers.get(sidecar, {}).get(resource, ())}
            reusable = [i for i in reuse.get(resource, ()) if i not in running]
            fresh = [i for i in pool[resource] if i not in running and i not in reusable]
            ids = (reusable + fresh)[:count]
            if len(ids) < count:
                continue
            given.setdefault(step.name, {})[resource] = ids
            reuse[resource] = reusable + [i for i in ids if i not in reusable]
            for qualifier, asked in step.resources.items():
                if qualifiers.get(qualifier) == resource and asked > 0:
                    lent.setdefault(step.name, {})[qualifier] = dict.fromkeys(ids, asked)
    return given, lent


def _share_lender(
    containers: dict[str, dict[str, list[str]]], shares: dict[str, dict[str, dict[str, int]]], resource: str, count: int
) -> str | None:
    """The first container holding exactly `count` shares of `resource`, or None."""
    for container, resources in containers.items():
        if resource in shares.get(container, {}) and len(resources.get(resource, ())) == count:
            return container
    return None


def encode_allocation(record: AllocationRecord) -> str:
    document = record.model_dump(mode="json", exclude_none=True)
    if not document.get("shares"):
        document.pop("shares", None)
    if not document.get("plugins"):
        document.pop("plugins", None)
    if not document.get("issued"):
        document.pop("issued", None)
    if not document.get("init"):
        document.pop("init", None)
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def _too_deep(document: object) -> bool:
    """Whether the parsed value nests more than `MAX_DEPTH` containers deep; iterative, so it cannot recurse."""
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                if depth >= MAX_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # the integers orjson reads as integers


def unreadable(document: object) -> str | None:
    """Why the node side could not read `document` once written into an annotation (a plugin's part of an
    allocation), or None: nested more than `MAX_DEPTH` levels, an integer beyond 64 bits, text that is no UTF-8 (a
    lone surrogate: `encode_allocation` escapes it, orjson refuses the escape, and pydantic cannot even encode it in a
    key), not JSON (a set, NaN), or more than `MAX_ANNOTATION_BYTES` encoded. The scheduler side checks what it
    writes with this, so that what the decoder refuses is never signed, bound and then refused on the node.
    Iterative, and the depth is checked before anything encodes `document`: no recursion."""
    low, high = _INT_RANGE
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} levels deep"
            if isinstance(value, dict):
                stack.extend((key, depth) for key in value if isinstance(key, str))  # JSON's names are text
                stack.extend((child, depth + 1) for child in value.values())
            else:
                stack.extend((child, depth + 1) for child in value)
        elif isinstance(value, str):
            if not value.isascii() and not _utf8(value):
                return f"the text {shorten(value)!r} is not UTF-8 (a lone surrogate)"
        elif isinstance(value, int) and not isinstance(value, bool) and not low <= value <= high:
            return f"the integer {shorten(str(value))} is beyond 64 bits"
    try:
        text = json.dumps(document, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        return f"not JSON ({shorten(str(exc))})"
    if len(text) > MAX_ANNOTATION_BYTES:  # ASCII, as `encode_allocation` writes it: characters are bytes
        return (
            f"{len(text)} bytes encoded, more than the {MAX_ANNOTATION_BYTES} the API server allows for all of a "
            "pod's annotations"
        )
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _load_json_object(text: object, key: str) -> dict[str, Any]:
    if not isinstance(text, str):
        raise AnnotationError(f"{key}: the annotation value must be a string holding JSON")
    if len(text) > MAX_ANNOTATION_BYTES:
        raise AnnotationError(f"{key}: {len(text)} characters is more than the {MAX_ANNOTATION_BYTES} bytes allowed")
    try:
        data = text.encode()
    except UnicodeEncodeError as exc:
        raise AnnotationError(f"{key}: not valid JSON (a lone surrogate at character {exc.start})") from None
    if len(data) > MAX_ANNOTATION_BYTES:
        raise AnnotationError(f"{key}: {len(data)} bytes is more than the {MAX_ANNOTATION_BYTES} allowed")
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if exc.msg.startswith("depth limit"):
            raise AnnotationError(f"{key}: nested more than {MAX_DEPTH} levels deep") from None
        raise AnnotationError(f"{key}: not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(document, dict):
        raise AnnotationError(f"{key}: expected a JSON object, got {type(document).__name__}")
    # A value with few brackets cannot nest deeply: only larger ones (node inventories) pay for the walk.
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and _too_deep(document):
        raise AnnotationError(f"{key}: nested more than {MAX_DEPTH} levels deep")
    return document


def decode_allocation(text: object) -> AllocationRecord:
    """Decode `kubegpu.io/allocation`; raise `AnnotationError` with a one-line message naming the bad field."""
    document = _load_json_object(text, ALLOCATION_KEY)
    version = document.get("version")
    if version is None:
        raise AnnotationError(f"{ALLOCATION_KEY}: version: missing (this kubegpu reads version 1)")
    if version != SUPPORTED_VERSION:
        raise AnnotationError(
            f"{ALLOCATION_KEY}: version: unsupported value {shorten(repr(version))} (this kubegpu reads version 1)"
        )
    try:
        record = AllocationRecord.model_validate(document)
    except ValidationError as exc:
        raise AnnotationError(describe_validation_error(exc, ALLOCATION_KEY)) from None
    foreign = record.foreign_init_ids() if record.init else None
    if foreign is not None:
        raise AnnotationError(
            f"{ALLOCATION_KEY}: {shorten(foreign)}: an init container is given only devices its pod holds, and "
            "`containers` names no such device"
        )
    return record


def _mac(record: AllocationRecord, key: bytes) -> str:
    return hmac.new(key, record.payload(), hashlib.sha256).hexdigest()


def sign_allocation(record: AllocationRecord, key: bytes) -> AllocationRecord:
    """The record with `signature` = HMAC-SHA256 over its canonical payload (pod UID, node, devices, fields)."""
    return record.model_copy(update={"signature": _mac(record, key)})


def verify_allocation(record: AllocationRecord, key: bytes) -> bool:
    """Whether `signature` is the HMAC of the record's payload under `key`; a malformed signature never verifies."""
    signature = record.signature
    if not isinstance(signature, str) or not _SIGNATURE.fullmatch(signature):
        return False
    return hmac.compare_digest(signature, _mac(record, key))


def verifying_key(record: AllocationRecord, keys: Sequence[bytes]) -> int | None:
    """The position in `keys` of the first key under which the record's signature verifies, or None: a process that
    also accepts the keys being rotated in or out (`--allocation-verify-key-file`) tries its own key first."""
    signature = record.signature
    if not isinstance(signature, str) or not _SIGNATURE.fullmatch(signature):
        return None
    payload = record.payload()
    for at, key in enumerate(keys):
        if hmac.compare_digest(signature, hmac.new(key, payload, hashlib.sha256).hexdigest()):
            return at
    return None


def encode_devices(devices: NodeDevices) -> str:
    return json.dumps(devices.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def decode_devices(text: object) -> NodeDevices:
    """Decode the node annotation `kubegpu.io/devices`, naming the bad field on error."""
    document = _load_json_object(text, DEVICES_KEY)
    try:
        return NodeDevices.model_validate(document)
    except ValidationError as exc:
        raise AnnotationError(describe_validation_error(exc, DEVICES_KEY)) from None


class ForeignDevices(BaseModel):
    """The decoded `kubegpu.io/foreign-devices` node annotation: `pods` is pod key (`namespace/name`) -> container ->
    resource -> the device ids the kubelet gave it."""

    model_config = ConfigDict(extra="allow", frozen=True)

    version: Literal[1]
    pods: dict[str, dict[str, dict[str, list[str]]]] = Field(default_factory=dict)


def encode_foreign_devices(pods: dict[str, dict[str, dict[str, list[str]]]]) -> str:
    document = {"version": SUPPORTED_VERSION, "pods": pods}
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def decode_foreign_devices(text: object) -> ForeignDevices:
    """Decode the node annotation `kubegpu.io/foreign-devices`, naming the bad field on error."""
    document = _load_json_object(text, FOREIGN_DEVICES_KEY)
    try:
        return ForeignDevices.model_validate(document)
    except ValidationError as exc:
        raise AnnotationError(describe_validation_error(exc, FOREIGN_DEVICES_KEY)) from None
