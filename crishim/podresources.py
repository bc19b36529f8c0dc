"""Which device ids the kubelet gave pods that kubegpu did not place, from its PodResources API.

A pod bound outside kubegpu (by another scheduler, or with `spec.nodeName` written by hand) and admitted by the
kubelet holds devices the kubegpu scheduler cannot see: it holds them "by count" (`Engine.admit_by_count`), setting
aside devices of its own choosing, which may not be the ones the kubelet chose. The kubelet's PodResources API (`v1`,
`List`, on `pod-resources/kubelet.sock` under its root directory; messages in `protos.py`) says exactly which ids
each container of each pod holds. A device shared through share slots (`0::3`: slot 3 of GPU 0, see
`core.models.slot_id`) is read as its device, the id allocations and the scheduler use.

`kubegpu advertise --pod-resources-socket S` reads it every round and publishes, as the node annotation
`kubegpu.io/foreign-devices` (`{"version": 1, "pods": {"ns/name": {"container": {"resource": ["id", ...]}}}}`), the
pods whose devices are not exactly what their `kubegpu.io/allocation` names (`foreign_devices`): pods without one,
and pods whose claim the kubelet did not follow. Pods kubegpu placed and the kubelet admitted as placed are left
out, so the annotation changes only when a foreign device pod starts or ends. The scheduler side then counts
those pods' exact ids (`Engine.set_held_devices`). PodResources v1 names pods, not UIDs: a pod deleted and created
again under the same name within one round may be matched to the previous pod's ids until the next round.

The allocation is compared, not verified: the advertiser holds no key. A forged claim naming exactly the ids the
kubelet gave its pod is left out, and that pod stays held by count, as without this publication.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc

from kubegpu.core.annotations import ALLOCATION_KEY, AnnotationError, decode_allocation
from kubegpu.core.models import share_slot
from kubegpu.crishim.protos import POD_RESOURCES, POD_RESOURCES_PACKAGE, method_path

__all__ = ["DEFAULT_SOCKET", "Held", "foreign_devices", "list_pod_resources"]

log = logging.getLogger("kubegpu.podresources")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# pod key -> container -> resource -> device ids
Held = dict[str, dict[str, dict[str, list[str]]]]


def list_pod_resources(socket: Path, *, timeout: float = 5.0) -> Held:
    """The kubelet's `List` over its unix socket: every pod's device ids (pods and containers without devices left
    out). Raises `ConnectionError` when the kubelet cannot be asked."""
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            call = channel.unary_unary(
                method_path(POD_RESOURCES_PACKAGE, "PodResourcesLister", "List"),
                request_serializer=lambda message: message.SerializeToString(),
                response_deserializer=POD_RESOURCES["ListPodResourcesResponse"].FromString,
            )
            response = call(POD_RESOURCES["ListPodResourcesRequest"](), timeout=timeout)
    except grpc.RpcError as exc:
        error: Any = exc
        raise ConnectionError(f"PodResources List on {socket}: {error.code().name} {error.details()}") from None
    held: Held = {}
    for pod in response.pod_resources:
        containers: dict[str, dict[str, list[str]]] = {}
        for container in pod.containers:
            devices: dict[str, list[str]] = {}
            for entry in container.devices:
                if entry.device_ids:
                    devices.setdefault(entry.resource_name, []).extend(entry.device_ids)
            if devices:
                containers[container.name] = {r: sorted(ids, key=_natural) for r, ids in devices.items()}
        if containers:
            held[f"{pod.namespace}/{pod.name}"] = containers
    return held


def foreign_devices(held: Held, pods: Iterable[Mapping[str, Any]], resources: Iterable[str] | None = None) -> Held:
    """The entries of `held` (PodResources) whose pod's `kubegpu.io/allocation` does not name exactly those ids.

    `pods` are the node's pods from the API server (for their annotations); a pod missing there is foreign. Share
    slot ids are compared, and published, as their devices (`0::3` is GPU `0`).
    `resources`, when given, keeps only those resources (the ones kubegpu's plugins schedule).
    """
    wanted = set(resources) if resources is not None else None
    claims: dict[str, dict[str, dict[str, list[str]]] | None] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
        text = (meta.get("annotations") or {}).get(ALLOCATION_KEY)
        try:
            claims[key] = decode_allocation(text).containers if text is not None else None
        except AnnotationError:
            claims[key] = None
    foreign: Held = {}
    for key, containers in held.items():
        kept = {
            name: {
                r: sorted(_devices(ids), key=_natural) for r, ids in devices.items() if wanted is None or r in wanted
            }
            for name, devices in containers.items()
        }
        kept = {name: devices for name, devices in kept.items() if devices}
        if not kept:
            continue
        claim = claims.get(key)
        if claim is not None and all(
            sorted(claim.get(name, {}).get(r, []), key=_natural) == ids
            for name, devices in kept.items()
            for r, ids in devices.items()
        ):
            continue
        foreign[key] = kept
    return foreign


def _devices(ids: Iterable[str]) -> list[str]:
    """The devices the kubelet's ids name, each once: a share slot id (`0::3`, `core.models.slot_id`) is its device,
    as the allocation and the scheduler name it."""
    return list(dict.fromkeys(slot[0] if (slot := share_slot(i)) is not None else i for i in ids))


def _natural(text: str) -> tuple[int, int | str]:
    return (0, int(text)) if text.isascii() and text.isdigit() else (1, text)  # `²` is a digit, not a number
