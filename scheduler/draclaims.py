"""What the custom scheduler writes about DRA claims: the claim made from a template, its allocation and
reservation before the Binding (kube-scheduler's DynamicResources PreBind), and their release when the pod goes.

Upstream splits this between two components. kube-controller-manager's resourceclaim controller makes each pod's
claim from its `ResourceClaimTemplate` (named by `generateName` `<pod>-<claim>-`, owned by the pod with
`controller: true`, annotated `resource.kubernetes.io/pod-claim-name`) and records it in the pod's
`status.resourceClaimStatuses`; when a pod is gone it takes the pod out of the claim's `status.reservedFor`, clears
`status.allocation` once nothing reserves the claim, and deletes a claim made for a pod that is done (the garbage
collector also deletes it through its owner reference). kube-scheduler allocates: it adds the
`resource.kubernetes.io/delete-protection` finalizer, then writes `status.allocation` and the pod into
`status.reservedFor` in one status update before the Binding, and undoes that when the Binding fails (Unreserve).

kubegpu's custom scheduler does both parts for its own pods, so DRA works where no controller runs (and alongside
one: it uses the claim the controller recorded in the pod's status, or a claim owned by the pod and annotated with
its claim name; the claim it makes has the shape the controller adopts). The claim it makes is named
`<pod>-<claim>` (`dra.claim_for_pod`), fixed rather than generated, so that a write whose answer was lost, or a
restart, finds it again without reading the pod's status back. Every write is guarded by the claim's
`resourceVersion` and read back on a conflict or a lost answer: a claim already allocated and reserved for this pod
is kept as it is; one allocated to other devices (another scheduler's) is respected, and the pod is tried again;
one of the pod's claim names made for another pod is refused. On release a claim made for the pod is deleted (its
finalizer removed first), guarded by its UID.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubegpu.core.models import PodRequest
from kubegpu.kube.client import ApiError, AsyncKubeClient
from kubegpu.scheduler.dra import HeldClaim, claim_for_pod

__all__ = ["FINALIZER", "POD_CLAIM_ANNOTATION", "ClaimError", "ClaimWriter", "claim_path"]

log = logging.getLogger("kubegpu.binder")

API = "resource.k8s.io/v1"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
FINALIZER = "resource.kubernetes.io/delete-protection"
ATTEMPTS = 4  # reads and writes of one claim before a pod's PreBind gives up (conflicts with other writers)

TemplateSpec = Callable[[str, str], Mapping[str, Any] | None]


class ClaimError(ApiError):
    """A pod's claims could not be made, allocated or reserved: its Binding is not written, and it is tried again."""


def claim_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{API}/namespaces/{namespace}/resourceclaims"
    return f"{base}/{name}" if name else base


def _results(allocation: Mapping[str, Any] | None) -> list[tuple[Any, ...]]:
    results = ((allocation or {}).get("devices") or {}).get("results") or ()
    return [(r.get("request"), r.get("driver"), r.get("pool"), r.get("device")) for r in results]


def _owner(claim: Mapping[str, Any]) -> str | None:
    owners = (claim.get("metadata") or {}).get("ownerReferences") or ()
    return next((o.get("uid") for o in owners if o.get("controller") and o.get("kind") == "Pod"), None)


class ClaimWriter:
    """The DRA writes of one custom scheduler; `template_spec(namespace, name)` gives a ResourceClaimTemplate's
    `spec` as written (its `metadata` and `spec`), None when it is not known."""

    def __init__(self, writer: AsyncKubeClient, template_spec: TemplateSpec) -> None:
        self.writer = writer
        self.template_spec = template_spec
        # pod key -> its release in progress, which a new PreBind of a pod of that name waits for (both run on the
        # writer's loop; a rolled-back pod tried again must not meet its own release half done).
        self._releasing: dict[str, asyncio.Task[None]] = {}

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.writer.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    # -- PreBind --------------------------------------------------------------------------------------------------

    async def reserve(self, pod: PodRequest, held: list[HeldClaim]) -> None:
        """Make, allocate and reserve each of the pod's claims as the engine decided, then record the claims made
        from templates in the pod's status; raises `ApiError` naming what went wrong (the caller rolls back)."""
        releasing = self._releasing.get(pod.key)
        if releasing is not None:
            await asyncio.shield(releasing)
        try:
            for claim in held:
                await self._reserve_one(pod, claim)
            if any(ref.template_name and ref.generated is None for ref in pod.resource_claims):
                statuses = [
                    {"name": ref.name, "resourceClaimName": ref.generated or claim_for_pod(pod, ref)}
                    for ref in pod.resource_claims
                    if ref.template_name
                ]
                path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
                await self.writer.patch(path, {"status": {"resourceClaimStatuses": statuses}})
        except ClaimError:
            raise
        except ApiError as exc:
            raise ClaimError(exc.status, exc.reason, str(exc).removeprefix(f"{exc.status} {exc.reason}: ")) from None

    async def _reserve_one(self, pod: PodRequest, held: HeldClaim) -> None:
        name = held.claim.name
        path = claim_path(pod.namespace, name)
        consumer = {"resource": "pods", "name": pod.name, "uid": pod.uid}
        for _ in range(ATTEMPTS):
            current = await self._get(path)
            if current is None:
                if not held.owned or name != _made_name(pod, held.ref):
                    raise ClaimError(404, "NotFound", f'resourceclaim "{name}" not found')
                current = await self._create(pod, held)
                if current is None:
                    continue  # the answer was lost: read it back
            if held.owned and _owner(current) != pod.uid:
                raise ClaimError(409, "Conflict", f'resourceclaim "{name}" was not created for the pod')
            meta = current.get("metadata") or {}
            status = current.get("status") or {}
            allocation = status.get("allocation")
            reserved = list(status.get("reservedFor") or ())
            if allocation is not None and _results(allocation) != _results(held.claim.allocation):
                raise ClaimError(
                    409, "Conflict", f'resourceclaim "{name}" was allocated other devices meanwhile; tried again'
                )
            if allocation is not None and any(c.get("uid") == pod.uid for c in reserved):
                return  # written before (a lost answer, or before a restart)
            try:
                finalizers = list(meta.get("finalizers") or ())
                if FINALIZER not in finalizers:
                    meta = {**meta, "finalizers": [*finalizers, FINALIZER]}
                    current = await self.writer.request("PUT", path, {**current, "metadata": meta})
                reserved.append(consumer)
                status = {
                    **status,
                    "allocation": allocation or dict(held.claim.allocation or {}),
                    "reservedFor": reserved,
                }
                await self.writer.request("PUT", f"{path}/status", {**current, "status": status})
                return
            except ApiError as exc:
                if exc.status not in (0, 409):
                    raise
                log.info("claim %s/%s changed or its answer was lost; read again: %s", pod.namespace, name, exc)
        raise ClaimError(409, "Conflict", f'resourceclaim "{name}" kept changing while it was written; tried again')

    async def _create(self, pod: PodRequest, held: HeldClaim) -> dict[str, Any] | None:
        ref = next(r for r in pod.resource_claims if r.name == held.ref)
        template = self.template_spec(pod.namespace, ref.template_name or "")
        if template is None:
            raise ClaimError(404, "NotFound", f'resourceclaimtemplate "{ref.template_name}" not found')
        template_meta = template.get("metadata") or {}
        body = {
            "apiVersion": API,
            "kind": "ResourceClaim",
            "metadata": {
                "name": held.claim.name,
                "namespace": pod.namespace,
                "labels": dict(template_meta.get("labels") or {}),
                "annotations": {**(template_meta.get("annotations") or {}), POD_CLAIM_ANNOTATION: held.ref},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod.name,
                        "uid": pod.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
                "finalizers": [FINALIZER],
            },
            "spec": template.get("spec") or {},
        }
        try:
            created: dict[str, Any] = await self.writer.request("POST", claim_path(pod.namespace), body)
        except ApiError as exc:
            if exc.status not in (0, 409):
                raise
            return None  # made before, or the answer was lost: the caller reads it
        return created

    # -- release ---------------------------------------------------------------------------------------------------

    async def release(self, pod: PodRequest, held: list[HeldClaim]) -> None:
        """The pod is gone (or its Binding failed): take it out of each claim's reservedFor; a claim nothing
        reserves any more is deallocated and its finalizer removed, and one made for the pod is deleted. A write
        that cannot be made is logged (another writer may have done it)."""
        task = asyncio.current_task()
        previous = self._releasing.get(pod.key)
        if task is not None:
            self._releasing[pod.key] = task
        try:
            if previous is not None and previous is not task:
                await asyncio.shield(previous)
            for claim in held:
                try:
                    await self._release_one(pod, claim)
                except ApiError as exc:
                    name = claim.claim.name
                    log.warning("could not release claim %s/%s: %s", pod.namespace, name, exc, extra={"pod": pod.key})
        finally:
            if self._releasing.get(pod.key) is task:
                del self._releasing[pod.key]

    async def _release_one(self, pod: PodRequest, held: HeldClaim) -> None:
        path = claim_path(pod.namespace, held.claim.name)
        for _ in range(ATTEMPTS):
            current = await self._get(path)
            if current is None:
                return
            meta = current.get("metadata") or {}
            status = dict(current.get("status") or {})
            reserved = list(status.get("reservedFor") or ())
            remaining = [c for c in reserved if c.get("uid") != pod.uid]
            owned = held.owned and _owner(current) == pod.uid
            try:
                if remaining != reserved:
                    if remaining:
                        status["reservedFor"] = remaining
                    else:  # nothing reserves it: deallocated (the resourceclaim controller's part)
                        status.pop("reservedFor", None)
                        status.pop("allocation", None)
                    current = await self.writer.request("PUT", f"{path}/status", {**current, "status": status})
                    meta = current.get("metadata") or {}
                elif remaining or (status.get("allocation") is not None and not owned):
                    return  # not this pod's to release
                if remaining:
                    return
                finalizers = list(meta.get("finalizers") or ())
                if FINALIZER in finalizers:
                    finalizers.remove(FINALIZER)
                    current = await self.writer.request(
                        "PUT", path, {**current, "metadata": {**meta, "finalizers": finalizers}}
                    )
                    meta = current.get("metadata") or {}
                if owned:
                    options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": meta.get("uid")}}
                    await self.writer.request("DELETE", path, options)
                return
            except ApiError as exc:
                if exc.status == 404:
                    return
                if exc.status not in (0, 409):
                    raise
        raise ApiError(409, "Conflict", f'resourceclaim "{held.claim.name}" kept changing while it was released')


def _made_name(pod: PodRequest, ref_name: str) -> str:
    ref = next((r for r in pod.resource_claims if r.name == ref_name), None)
    return claim_for_pod(pod, ref) if ref is not None and ref.generated is None else ""
