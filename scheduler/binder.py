"""Everything kubegpu writes to the API server about a pod: its Binding, its Events, its `PodScheduled` condition,
and a preemption's nominated node and evictions. Both live front-ends bind through it.

The Binding is guarded by the pod's UID and carries the placement's annotations (the signed `kubegpu.io/allocation`
and the plugins' annotations) in its metadata: the API server copies them onto the pod in the same write that sets
`spec.nodeName`, so an allocation is only ever seen on a pod bound where it says (docs/security.md, "freshness"). A
Binding whose answer was lost (a timeout, a dropped connection) is looked up before anyone rolls the reservation
back: a placement the API server holds stays. The reservation itself is the caller's to roll back
(`ClusterMirror.roll_back`), on the thread that owns the engine.

Every write goes through the asynchronous client on its event loop (`AsyncKubeClient`); nothing here blocks the
thread that owns the engine. Event and condition messages quote what tenants wrote (a reason, an exception), so each
is written as `safe_text` makes it: one line of at most `MAX_TEXT_CHARS` characters, control characters escaped.
The custom scheduler's client is fenced by its leadership: a write still waiting for its turn when the replica stops
leading is refused unsent (`Fenced`), a Binding among them returned as that error.
"""

from __future__ import annotations

import asyncio
import calendar
import enum
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from kubegpu.core.annotations import ALLOCATION_KEY
from kubegpu.core.models import PodRequest
from kubegpu.core.text import safe_text
from kubegpu.kube.client import ApiError, AsyncKubeClient, Fenced, now_rfc3339
from kubegpu.scheduler.engine import Decision
from kubegpu.scheduler.health import Metrics

__all__ = ["Binder", "Eviction", "bound_as_decided", "write_placement"]

log = logging.getLogger("kubegpu.binder")

EVENTS_V1 = "events.k8s.io/v1"
NOTE_BYTES = 1024  # the API server's limit on an events.k8s.io/v1 Event's note
# Unschedulable reports (an Event and a status patch each) written or waiting for the client's rate limit at once;
# past it a refusal is not reported, and its pod is reported at its next refusal. Tenants creating pods that fit
# nowhere faster than the limit lets them be reported queued reports without end, and the Bindings, which take their
# turn at the same limiter, behind them (in a soak, binds came minutes after their pods were deleted).
REPORTS_WAITING = 256
DISRUPTION_TARGET = "DisruptionTarget"  # the pod condition Kubernetes 1.26+ writes before it deletes a pod
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"  # its reason for a scheduler's preemption victims
# From this release kube-scheduler marks its victims (PodDisruptionConditions, on by default; GA in 1.31) and the Job
# controller's podFailurePolicy reads the mark: `--disruption-conditions auto` marks from it on.
MARKS_VICTIMS_FROM = (1, 26)
DISRUPTION_CONDITIONS = ("auto", "on", "off")
CLAIM_TRIES = 3  # conflicts `evict_unless_taken` takes before it gives up on a pod changing under it
# How long `evict_unless_taken` trusts another hand's DisruptionTarget mark to be followed by its deletion: a winner
# retries its own deletion for about 15 s (`DELETE_RETRY_DELAYS`), and its writes may wait behind the client's rate
# limit; past this, its writer failed (or stopped) and the mark is taken over.
MARK_TRUSTED_SECONDS = 60.0
DELETE_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)


class Eviction(enum.Enum):
    """What `Binder.evict_unless_taken` did."""

    EVICTED = "evicted"  # this call deleted the pod: it alone tells it why
    LEFT = "left"  # gone, another pod in its place, or being deleted: nothing to do
    MARKED = "marked"  # another hand marked it recently and has not deleted it yet: look again once not trusted
    FAILED = "failed"  # not done (logged): look again later


ACTIONS = {"Preempted": "Preempting"}  # kube-scheduler's action per reason; "Scheduling" for the others
_QUALIFIED = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_HOST = re.sub(r"[^-a-z0-9.]", "-", socket.gethostname().lower())[:63]


def _bounded_bytes(text: str, limit: int) -> str:
    """`text` (already `safe_text`) in at most `limit` UTF-8 bytes: cut by `safe_text` to fewer characters until it
    fits, so a cut note still ends with `… (N more characters)` as every other bounded text does."""
    bounded = text
    chars = len(text)
    while (size := len(bounded.encode())) > limit:
        chars -= max(1, (size - limit + 3) // 4)  # a character is at most 4 bytes: never cuts more than needed
        bounded = safe_text(text, chars)
    return bounded


T = TypeVar("T")


async def write_placement(writer: AsyncKubeClient, pod: PodRequest, decision: Decision) -> None:
    """Create the Binding, guarded by the pod's UID, carrying the placement's annotations in its metadata."""
    metadata: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
    if decision.annotations:
        metadata["annotations"] = decision.annotations
    await writer.post(
        f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": decision.node},
        },
    )


async def bound_as_decided(writer: AsyncKubeClient, pod: PodRequest, decision: Decision) -> bool:
    """After a Binding whose outcome is unknown (a timeout, a dropped connection): whether the API server holds the
    pod bound to the decided node with the decided allocation. False when it does not, or cannot tell."""
    try:
        current = await writer.request("GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}")
    except ApiError:
        return False
    meta = current.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return (
        meta.get("uid") == pod.uid
        and (current.get("spec") or {}).get("nodeName") == decision.node
        and annotations.get(ALLOCATION_KEY) == decision.annotations.get(ALLOCATION_KEY)
    )


class Binder:
    """The API writes about pods, for one component (the name its Events carry as their source)."""

    def __init__(
        self, writer: AsyncKubeClient, metrics: Metrics, *, component: str, marks: Callable[[], bool] | None = None
    ) -> None:
        self.writer = writer
        self.metrics = metrics
        self.component = component
        # The API Events are written in (`discovery.events_api`): the core "v1" until discovery says the server
        # serves events.k8s.io/v1, as kube-scheduler writes them since 1.19.
        self.events_api = "v1"
        self.reports_waiting = 0  # `report`s submitted and not yet ended (the writer's thread ends them)
        self._reports_lock = threading.Lock()
        # Whether a victim is marked `DisruptionTarget` before its deletion (`marks_victims`: the front-end's
        # `--disruption-conditions` and the API server's version); always, when not said.
        self.marks: Callable[[], bool] = marks or (lambda: True)
        self.mark_trusted_seconds = MARK_TRUSTED_SECONDS  # `evict_unless_taken`'s
        self.delete_retry_delays: Sequence[float] = DELETE_RETRY_DELAYS
        self.wall: Callable[[], float] = time.time  # the clock marks' `lastTransitionTime` is read against

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run a write on the writer's event loop; the caller does not wait (the loop thread never blocks)."""
        self.writer.submit(coroutine)

    async def on_writer(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await a write from any event loop: directly when the caller runs on the writer's loop (as both front-ends
        set their HTTP server up), else handed over to it."""
        if asyncio.get_running_loop() is self.writer.loop:
            return await coroutine
        return await asyncio.wrap_future(self.writer.submit(coroutine))

    # -- the Binding ---------------------------------------------------------------------------------------------

    async def bind(self, pod: PodRequest, decision: Decision) -> ApiError | None:
        """Create the Binding (on the writer's loop). Returns None when the API server holds the placement, else the
        error; the caller then rolls the reservation back."""
        started = time.perf_counter()
        key = pod.key
        try:
            await write_placement(self.writer, pod, decision)
        except Fenced as exc:  # never sent: this replica stopped leading while the Binding waited its turn
            log.debug("not bound: %s", exc, extra={"pod": key, "node": decision.node})
            return exc
        except Exception as exc:
            # Any exception: an ApiError, a timeout (asyncio's TimeoutError is not the builtin one before Python
            # 3.11), a bug. A Binding whose answer was lost may have been written: one the API server holds stays.
            error = exc if isinstance(exc, ApiError) else ApiError(0, "ClientError", repr(exc))
            if error.status != 0 or not await self._bound_as_decided(pod, decision):
                self.metrics.bind_errors.inc()
                return error
            log.info("bound (the answer was lost)", extra={"pod": key, "node": decision.node})
        else:
            devices = (decision.allocation.containers if decision.allocation else None) or None
            log.info("bound", extra={"pod": key, "node": decision.node, "devices": devices})
        self.metrics.bind_latency.observe(time.perf_counter() - started)
        return None

    async def _bound_as_decided(self, pod: PodRequest, decision: Decision) -> bool:
        try:
            return await bound_as_decided(self.writer, pod, decision)
        except Exception:  # cannot tell: the reservation is rolled back, and the informer corrects it if bound
            log.exception("could not read back pod %s after a lost Binding answer", pod.key)
            return False

    # -- what the pod's owner reads --------------------------------------------------------------------------------

    def event(self, pod: PodRequest, reason: str, message: str) -> None:
        """A Warning Event on the pod, written by the asynchronous writer (never blocking the caller)."""
        self.submit(self.post_event(pod, reason, message))

    async def post_event(self, pod: PodRequest, reason: str, message: str, kind: str = "Warning") -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
        await self.post_object_event(involved, reason, message, kind)

    async def post_object_event(
        self, involved: dict[str, str], reason: str, message: str, kind: str = "Warning"
    ) -> None:
        """An Event on any namespaced object (`involved`: its apiVersion, kind, name, namespace and uid), in the API
        discovery chose (`events_api`)."""
        name, namespace = involved["name"], involved["namespace"]
        if self.events_api == EVENTS_V1:
            path, event = (
                f"/apis/{EVENTS_V1}/namespaces/{namespace}/events",
                self._event_v1(involved, reason, message, kind),
            )
        else:
            path, event = f"/api/v1/namespaces/{namespace}/events", self._core_event(involved, reason, message, kind)
        try:
            await self.writer.post(path, event)
        except ApiError as exc:
            _not_written(f"write the {reason} event", exc, f"{namespace}/{name}")

    def _event_v1(self, involved: dict[str, str], reason: str, message: str, kind: str) -> dict[str, Any]:
        """An `events.k8s.io/v1` Event as kube-scheduler writes one: the reporting controller and instance, an
        action, `eventTime`, and the message as `note`, which the API server takes up to 1024 bytes."""
        controller = self.component if _QUALIFIED.fullmatch(self.component) else "kubegpu"
        return {
            "apiVersion": EVENTS_V1,
            "kind": "Event",
            # Named as kube-scheduler names them: the API server validates an events.k8s.io/v1 Event's whole
            # metadata as a DNS subdomain, which a `generateName` ending in "." is not (refused live on 1.20.2).
            # A long name is cut to leave room for the time, and never where a '-' or '.' would end a label.
            "metadata": {
                "name": f"{involved['name'][:236].rstrip('-.')}.{time.time_ns():x}",
                "namespace": involved["namespace"],
            },
            "eventTime": now_rfc3339(micro=True),
            "reportingController": controller,
            "reportingInstance": f"{controller}-{_HOST}"[:128],
            "action": ACTIONS.get(reason, "Scheduling"),
            "reason": reason,
            "regarding": involved,
            "note": _bounded_bytes(safe_text(message), NOTE_BYTES),
            "type": kind,
        }

    def _core_event(self, involved: dict[str, str], reason: str, message: str, kind: str) -> dict[str, Any]:
        now = now_rfc3339()
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"]},
            "involvedObject": involved,
            "reason": reason,
            "message": safe_text(message),
            "type": kind,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    def report(self, pod: PodRequest, message: str, reason: str = "Unschedulable") -> bool:
        """Submit `report_unschedulable` unless `REPORTS_WAITING` reports are already on their way; whether it was
        (the caller remembers the message as told only then, so that the next refusal tells it)."""
        with self._reports_lock:
            if self.reports_waiting >= REPORTS_WAITING:
                return False
            self.reports_waiting += 1

        async def counted() -> None:
            try:
                await self.report_unschedulable(pod, message, reason)
            finally:
                with self._reports_lock:
                    self.reports_waiting -= 1

        self.submit(counted())
        return True

    async def report_unschedulable(self, pod: PodRequest, message: str, reason: str = "Unschedulable") -> None:
        """kube-scheduler's two signs of a pod that fits nowhere: a `FailedScheduling` Event and the condition
        `PodScheduled=False/Unschedulable` (`SchedulerError` where its Binding was refused). The condition is written
        to this very pod only, guarded by its UID as a nomination is (`_patch_nomination`): a pod made again under
        its name meanwhile keeps its own."""
        message = safe_text(message)
        await self.post_event(pod, "FailedScheduling", message)
        condition = {
            "metadata": {"uid": pod.uid},
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now_rfc3339(),
                    }
                ]
            },
        }
        try:
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
            await self.writer.patch(path, condition, strategic=True)
        except ApiError as exc:
            if _gone(exc):
                log.debug("did not set the PodScheduled condition: the pod is gone (%s)", exc, extra={"pod": pod.key})
                return
            _not_written("set the PodScheduled condition", exc, pod.key)

    # -- preemption ----------------------------------------------------------------------------------------------

    async def evict(self, pod: PodRequest, node: str, victims: Sequence[PodRequest]) -> list[str]:
        """Delete the victims gracefully (guarded by their UIDs), all at once, then give each deleted one a
        `Preempted` Event and set the preemptor's `status.nominatedNodeName` (kube-scheduler's order: the deletions
        are what the preemptor waits for, and every write waits its turn behind the other pods' writes, so none
        queues behind another). Each victim first gets the `DisruptionTarget` condition kube-scheduler 1.26+ writes
        (`disruption_target`), where `marks` says so. Returns the keys of the victims whose deletion failed (they
        stay)."""
        message = f"{pod.scheduler_name}: preempting to accommodate a higher priority pod"
        why = disruption_target(message) if self.marks() else None
        deleted = await asyncio.gather(*(self._delete(victim, why) for victim in victims))
        message = f"Preempted by {pod.namespace}/{pod.name} on node {node}"
        await asyncio.gather(
            self.nominate(pod, node),
            *(
                self.post_event(victim, "Preempted", message, kind="Normal")
                for victim, gone in zip(victims, deleted, strict=True)
                if gone
            ),
        )
        return [victim.key for victim, gone in zip(victims, deleted, strict=True) if not gone]

    async def nominate(self, pod: PodRequest, node: str) -> None:
        """Set the preemptor's `status.nominatedNodeName`, guarded by its UID (`_patch_nomination`)."""
        await self._patch_nomination(pod, node, "set nominatedNodeName")

    async def clear_nomination(self, pod: PodRequest) -> None:
        """Clear the pending pod's `status.nominatedNodeName`: a pod of higher priority preempted on that node
        (kube-scheduler's preemption clears the nominations of lower priority there the same way)."""
        await self._patch_nomination(pod, None, "clear nominatedNodeName")

    async def _patch_nomination(self, pod: PodRequest, node: str | None, what: str) -> None:
        """Write the pod's nominated node, to this very pod only. Written behind other writes, the patch may land
        after the pod was deleted and made again under its name (a controller's new pod), whose own nomination it
        would otherwise set or clear: it names the pod's UID, which the API server holds as a precondition (a patch
        may not change a UID: 422, `metadata.uid ... field is immutable`), as the deletions' `preconditions` do. A
        pod gone, or another one in its place, is nothing to report."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        try:
            await self.writer.patch(path, {"metadata": {"uid": pod.uid}, "status": {"nominatedNodeName": node}})
        except ApiError as exc:
            if _gone(exc):
                log.debug("did not %s: the pod is gone (%s)", what, exc, extra={"pod": pod.key})
                return
            _not_written(what, exc, pod.key)

    async def evict_for(self, preemptor: str, where: str, victims: Sequence[PodRequest], message: str) -> list[str]:
        """A gang's preemption: each victim gets a `Preempted` Event naming the gang and the domain, and is deleted
        gracefully (guarded by its UID), marked first with the `DisruptionTarget` condition saying `message`
        (`disruption_target`) where `marks` says so. No nominated node: a gang waits for a domain, not one node.
        Returns the keys of the victims whose deletion failed (they stay)."""
        why = disruption_target(message) if self.marks() else None
        failed = []
        for victim in victims:
            await self.post_event(victim, "Preempted", f"Preempted by {preemptor} in {where}", kind="Normal")
            if not await self._delete(victim, why):
                failed.append(victim.key)
        return failed

    async def evict_unless_taken(self, victim: PodRequest, why: dict[str, Any] | None) -> Eviction:
        """Evict `victim` unless another hand already is. Its first write, the mark `why` (`disruption_target`,
        stamped with the time of the write) or else the deletion, is guarded by the `resourceVersion` read just
        before, so that of two callers acting on the same pod at once exactly one wins (the API server answers the
        other 409 Conflict); the winner's deletion is guarded the same way, and sent only while the pod's mark is
        still the one it wrote. So a pod is deleted by one caller, which alone answers `EVICTED` (and tells it why).

        The winner retries its own deletion when it fails (`DELETE_RETRY_DELAYS`): a mark left without a deletion
        would otherwise keep every other hand away for good. A mark (by any hand: another replica of the extender,
        kube-scheduler, the Eviction API) is trusted to be followed by a deletion for `mark_trusted_seconds` from
        its `lastTransitionTime` (`MARKED` meanwhile: look again then); past that, its writer failed, and the mark is
        written again, guarded, by whoever comes first (the disruption controller of kube-controller-manager also
        stops trusting an unfollowed mark, after two minutes, and sets it False).

        `LEFT` when the pod is gone, another pod took its name, or it is being deleted; `FAILED` when it could not be
        done (logged; a mark this call left stops being trusted in time). Costs a read per pod and per conflict (a
        status update of the pod's own between the read and the write), at most `CLAIM_TRIES` conflicts."""
        path = f"/api/v1/namespaces/{victim.namespace}/pods/{victim.name}"
        written: dict[str, Any] | None = None  # the condition this call wrote: while it is the pod's, the pod is ours
        retries = iter(self.delete_retry_delays)
        conflicts = 0
        pod: Any = None
        while True:
            if pod is None:
                try:
                    pod = await self.writer.request("GET", path)
                except ApiError as exc:
                    if exc.status == 404:
                        return Eviction.LEFT
                    _not_written("read a pod before evicting it", exc, victim.key)
                    if written is None or (delay := next(retries, None)) is None:
                        return Eviction.FAILED
                    await asyncio.sleep(delay)
                    continue
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if meta.get("uid") != victim.uid or meta.get("deletionTimestamp"):
                return Eviction.LEFT
            mark = _mark(status)
            ours = written is not None and mark is not None and _same_mark(mark, written["status"]["conditions"][0])
            if mark is not None and not ours and self._trusted(mark):
                return Eviction.MARKED
            guard = {"resourceVersion": meta.get("resourceVersion")}
            pod = None
            try:
                if why is not None and not ours:
                    stamped = _stamped(why)
                    answer = await self.writer.patch(f"{path}/status", {"metadata": guard, **stamped}, strategic=True)
                    written = stamped
                    if isinstance(answer, dict) and (answer.get("metadata") or {}).get("resourceVersion"):
                        pod = answer  # the pod as marked: its deletion is guarded by this resourceVersion
                    continue
                options = {"uid": victim.uid, **guard}
                body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": options}
                await self.writer.request("DELETE", path, body)
                return Eviction.EVICTED
            except ApiError as exc:
                if exc.status == 409:  # written meanwhile, by its kubelet or by another hand: read again
                    conflicts += 1
                    if conflicts < CLAIM_TRIES:
                        continue
                    log.warning(
                        "did not evict: the pod changed at each of %d tries", conflicts, extra={"pod": victim.key}
                    )
                    return Eviction.FAILED
                if _gone(exc):
                    return Eviction.LEFT
                _not_written("evict a member of a gang", exc, victim.key)
                if (why is not None and written is None) or (delay := next(retries, None)) is None:
                    return Eviction.FAILED  # the mark was not written: nothing keeps other hands away
                log.info("retrying the deletion in %.1f s", delay, extra={"pod": victim.key})
                await asyncio.sleep(delay)

    def _trusted(self, mark: dict[str, Any]) -> bool:
        """Whether another hand's `DisruptionTarget` mark is recent enough to wait for its deletion. A mark without a
        readable `lastTransitionTime` (every Kubernetes writer sets one) cannot be timed: not trusted. Nor can one
        dated further ahead of this clock than `mark_trusted_seconds` (its writer's clock off by more, or the time
        written by hand): trusted until this clock reached it, a mark dated next year kept every other hand away
        from a member left running below minMember for a year. A writer's clock ahead by less is trusted at most
        twice as long."""
        written = mark.get("lastTransitionTime")
        try:
            when = calendar.timegm(time.strptime(written, "%Y-%m-%dT%H:%M:%SZ")) if isinstance(written, str) else None
        except ValueError:
            when = None
        return when is not None and -self.mark_trusted_seconds < self.wall() - when < self.mark_trusted_seconds

    async def _delete(self, victim: PodRequest, why: dict[str, Any] | None = None) -> bool:
        """Whether the victim is deleted (or already gone); a failed deletion is logged. `why`: the status patch
        (`disruption_target`) written first, as kube-scheduler does; the victim is deleted even when it cannot be
        written (a preemptor must not wait on a condition), with a warning."""
        path = f"/api/v1/namespaces/{victim.namespace}/pods/{victim.name}"
        if why is not None:
            try:
                await self.writer.patch(f"{path}/status", why, strategic=True)
            except ApiError as exc:
                if exc.status == 404:
                    return True
                _not_written("mark a preemption victim with the DisruptionTarget condition", exc, victim.key)
        try:
            await self.writer.request(
                "DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": victim.uid}}
            )
        except ApiError as exc:
            if exc.status != 404:
                _not_written("delete a preemption victim", exc, victim.key)
                return False
        return True


def marks_victims(mode: str, server: Callable[[], tuple[int, int] | None]) -> Callable[[], bool]:
    """`Binder.marks` for `--disruption-conditions`: `on`, `off`, or `auto`: on an API server of 1.26 or later (where
    kube-scheduler marks its own victims and the Job controller reads the mark), not before (an unknown version
    counts as before). Each mark is one more write per victim, a third more API writes per preemption."""
    if mode == "on":
        return lambda: True
    if mode == "off":
        return lambda: False

    def auto() -> bool:
        version = server()
        return version is not None and version >= MARKS_VICTIMS_FROM

    return auto


def add_disruption_conditions_argument(parser: Any) -> None:
    parser.add_argument(
        "--disruption-conditions",
        choices=DISRUPTION_CONDITIONS,
        default="auto",
        help="mark each preemption victim DisruptionTarget=True (reason PreemptionByScheduler) before deleting it, as "
        "kube-scheduler 1.26+ does, so that a Job's podFailurePolicy can ignore it: auto (default) on Kubernetes "
        "1.26 and later, on, or off (one write less per victim)",
    )


def disruption_target(message: str) -> dict[str, Any]:
    """The status patch that tells a victim's owner why it goes, as kube-scheduler 1.26+ writes it before deleting
    a preemption victim: the condition `DisruptionTarget=True`, reason `PreemptionByScheduler` (a Job's
    `podFailurePolicy` matching `DisruptionTarget` then ignores the failure instead of counting it against
    `backoffLimit`). A strategic merge: the conditions merge by type, the others stay."""
    condition = {
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": PREEMPTION_BY_SCHEDULER,
        "message": safe_text(message),
        "lastTransitionTime": now_rfc3339(),
    }
    return {"status": {"conditions": [condition]}}


def _mark(status: dict[str, Any]) -> dict[str, Any] | None:
    """A pod's `DisruptionTarget=True` condition, None without one: someone (a scheduler, an extender, the Eviction
    API, the taint manager) has said it goes."""
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if (
            isinstance(condition, dict)
            and condition.get("type") == DISRUPTION_TARGET
            and condition.get("status") == "True"
        ):
            return condition
    return None


def _same_mark(mark: dict[str, Any], written: dict[str, Any]) -> bool:
    """Whether the pod's mark is the one written (not one written again over it since: its time differs)."""
    return all(mark.get(field) == written.get(field) for field in ("reason", "message", "lastTransitionTime"))


def _stamped(why: dict[str, Any]) -> dict[str, Any]:
    """The status patch `why` with its condition's `lastTransitionTime` now: how long it is trusted counts from its
    write."""
    (condition,) = why["status"]["conditions"]
    return {"status": {"conditions": [{**condition, "lastTransitionTime": now_rfc3339()}]}}


def _gone(exc: ApiError) -> bool:
    """Whether a write guarded by a pod's UID found the pod gone: deleted (404), or another pod in its place (the
    API server answers a patch naming another UID 422, `metadata.uid ... field is immutable`)."""
    return exc.status == 404 or (exc.status == 422 and "metadata.uid" in str(exc))


def _not_written(what: str, error: ApiError, key: str) -> None:
    """A report that could not be written: a warning, or a debug line when it was refused unsent because this
    replica stopped leading (the process is on its way out, and a backlog may hold thousands)."""
    level = logging.DEBUG if isinstance(error, Fenced) else logging.WARNING
    log.log(level, "could not %s: %s", what, error, extra={"pod": key})
