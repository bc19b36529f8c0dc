"""The checks the CRI shim makes before any plugin touches a container.

The kubelet copies a pod's annotations into the sandbox config of every CreateContainer request, so the shim finds
the scheduler's `kubegpu.io/allocation` there. Before it is used, the allocation must

1. decode (a malformed document is refused with the field that is wrong; so is any document the codec cannot
   read at all, whatever it raises: 3000-deep nesting, a 5000-digit number);
2. carry a signature (`unsigned`) of 64 hex digits that verifies with this node's copy of the scheduler's key
   (`signature`: the devices were changed after signing, or another key signed it);
3. name this node (`node`): an allocation for another node's devices is never applied here;
4. name this pod's UID (`pod`): an allocation copied from another pod is refused.

Each failed check is an `AllocationRefused` whose message names the check, the annotation and what to do, and which
the shim returns as `FAILED_PRECONDITION`; `verified_allocation` raises nothing else. The shim adds the checks that
need the runtime (`stale`, `in-use`: no device is applied to two live pods) and its own (`request`, `plugin`,
`error`). When the annotation is absent, `managed_resources` tells from the pod's spec (read from the API server)
whether the container needed one: a container that requests a resource owned by a device plugin must not start
without its verified allocation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord, AnnotationError, decode_allocation, verifying_key

__all__ = ["AllocationRefused", "Check", "PodIdentity", "managed_resources", "verified_allocation"]

Check = Literal[
    "request",
    "missing",
    "malformed",
    "unsigned",
    "signature",
    "node",
    "pod",
    "stale",
    "in-use",
    "plugin",
    "error",
    "ambiguous",
    "shares",
    "foreign-share",
    "mount",
    "env",
]

_HEX_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class AllocationRefused(Exception):
    """A failed check: `check` names it (`unsigned`, `signature`, `node`, `pod`, ...); the message says what to do."""

    def __init__(self, check: Check, message: str) -> None:
        self.check = check
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Who the kubelet says the sandbox belongs to (`sandbox_config.metadata`)."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def verified_allocation(
    text: str, *, key: bytes, node: str, pod: PodIdentity, also: Sequence[bytes] = ()
) -> AllocationRecord:
    """Decode `kubegpu.io/allocation` and run every check; raise `AllocationRefused` naming the first that fails.
    `also`: keys whose signatures are accepted besides `key` (`--allocation-verify-key-file`, during a rotation)."""
    try:
        record = decode_allocation(text)
    except AnnotationError as exc:
        raise AllocationRefused("malformed", f"pod {pod.key}: {exc}") from None
    except Exception as exc:  # the codec's own bug or limit (RecursionError, ValueError): still this input's fault
        detail = f"{type(exc).__name__}: {exc}"
        raise AllocationRefused(
            "malformed", f"pod {pod.key}: {ALLOCATION_KEY} cannot be decoded ({detail[:200]})"
        ) from None
    if not record.signature:
        raise AllocationRefused(
            "unsigned",
            f"pod {pod.key}: {ALLOCATION_KEY} is not signed; only an allocation signed by the kubegpu scheduler "
            "(--allocation-key-file) is applied",
        )
    if not isinstance(record.signature, str) or _HEX_SIGNATURE.fullmatch(record.signature) is None:
        raise AllocationRefused(
            "signature",
            f"pod {pod.key}: the signature of {ALLOCATION_KEY} is not 64 lowercase hex digits (an HMAC-SHA256); "
            "only an allocation signed by the kubegpu scheduler is applied",
        )
    if verifying_key(record, (key, *also)) is None:
        keys = (
            "any of this node's keys (--allocation-key-file, --allocation-verify-key-file)"
            if also
            else "this node's key"
        )
        raise AllocationRefused(
            "signature",
            f"pod {pod.key}: the signature of {ALLOCATION_KEY} does not verify with {keys}: the allocation "
            "was changed after the scheduler signed it, or the scheduler and this node use different key files",
        )
    if record.node != node:
        raise AllocationRefused(
            "node",
            f"pod {pod.key}: {ALLOCATION_KEY} names node {record.node!r}, not this node {node!r}; "
            "an allocation of another node's devices is never applied",
        )
    if record.podUID != pod.uid:
        raise AllocationRefused(
            "pod",
            f"pod {pod.key}: {ALLOCATION_KEY} belongs to the pod with UID {record.podUID!r}, not to this pod "
            f"(UID {pod.uid!r}); it was copied from another pod",
        )
    return record


def managed_resources(pod: Mapping[str, Any], container: str, owner_of: Callable[[str], str | None]) -> list[str]:
    """The resources a plugin owns that the named container (or init container) of a Pod manifest requests."""
    spec = pod.get("spec") or {}
    for entry in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if entry.get("name") != container:
            continue
        resources = entry.get("resources") or {}
        wanted: set[str] = set()
        for section in ("limits", "requests"):
            for resource, quantity in (resources.get(section) or {}).items():
                if owner_of(resource) is not None and str(quantity).strip() not in ("0", ""):
                    wanted.add(resource)
        return sorted(wanted)
    return []
