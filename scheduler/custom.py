"""`kubegpu scheduler`: the custom scheduler binary, for pods whose `spec.schedulerName` names it.

A thin front-end around the same `Engine` the simulator uses. Informers list and watch Nodes and Pods into the engine;
on start the device ledger is rebuilt from the `kubegpu.io/allocation` annotations of bound, running pods, so a
restarted scheduler never hands out a device a live pod holds. One thread owns the engine and runs the loop:

1. apply informer events (nodes first at start-up, then pods) and binding results;
2. take pending pods by priority, then arrival (kube-scheduler's active queue), and run the engine's cycle;
3. for a placement, reserve it in the engine at once and hand the API calls to the asynchronous writer: a merge patch of
   the pod's annotations (the signed allocation and the plugins' annotations) guarded by the pod's resourceVersion,
   then the Binding. A failure of either rolls the reservation back and retries the pod with backoff (1 s doubling
   to 10 s);
4. when nothing fits, a Warning Event `FailedScheduling` with kube-scheduler's `0/N nodes are available: ...` message
   and the pod condition `PodScheduled=False/Unschedulable`; the pod waits until the cluster changes (a node added
   or changed, a pod deleted or finished) instead of being retried in a loop;
5. when nothing fits and the pod may preempt, the engine's device-aware preemption (`Engine.preempt`) names a node and
   the pods of lower priority to evict there, with PodDisruptionBudgets from their own informer: the pod's
   `status.nominatedNodeName` is set, the node is held for it (`Engine.nominate`), each victim gets a `Preempted`
   Event and is deleted gracefully, and the pod binds once they are gone. While its victims terminate it does not
   preempt again.

With leader election (the default) informers run on every replica, keeping a standby warm, but only the holder of the
Lease schedules. `/metrics`, `/healthz` and `/readyz` are served on `--metrics-address`.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import logging
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    FOREIGN_DEVICES_KEY,
    AnnotationError,
    decode_allocation,
    decode_foreign_devices,
)
from kubegpu.core.errors import InputError
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import NodeInfo, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.process import configure_logging, read_key
from kubegpu.kube.client import ApiError, AsyncKubeClient, Informer, KubeClient, now_rfc3339
from kubegpu.kube.leader import LeaderElector
from kubegpu.scheduler import liveness, objects
from kubegpu.scheduler.config import ConfigError, Policy, load_config
from kubegpu.scheduler.engine import POLICIES, Decision, Engine
from kubegpu.scheduler.filters import pod_matches_term, selector_matches
from kubegpu.scheduler.preemption import Budget, Preemption

__all__ = ["SchedulerService", "add_scheduler_parser", "write_placement"]

log = logging.getLogger("kubegpu.scheduler")

FINISHED = frozenset({"Succeeded", "Failed"})
INITIAL_BACKOFF, MAX_BACKOFF = 1.0, 10.0  # kube-scheduler's podInitialBackoffSeconds, podMaxBackoffSeconds
UNSCHEDULABLE_FLUSH = 60.0  # a pod unschedulable this long is tried again even if nothing changed
FLUSH_CHECK = 1.0


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.attempts = Counter(
            "kubegpu_scheduler_schedule_attempts_total",
            "Scheduling cycles by result (scheduled, unschedulable, error).",
            ["result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "kubegpu_scheduler_scheduling_duration_seconds",
            "Time the engine took to decide one pod (filter, score, reserve).",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.bind_latency = Histogram(
            "kubegpu_scheduler_binding_duration_seconds",
            "Time to write the annotations and create the Binding.",
            registry=self.registry,
        )
        self.bind_errors = Counter(
            "kubegpu_scheduler_bind_errors_total", "Annotation patches or Bindings that failed.", registry=self.registry
        )
        self.pending = Gauge(
            "kubegpu_scheduler_pending_pods",
            "Pods waiting to be scheduled, by queue.",
            ["queue"],
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "kubegpu_scheduler_internal_errors_total",
            "Objects that raised an unexpected error, by stage (node_event, pod_event, schedule, bind); each cost "
            "only that object an error log and an Event.",
            ["stage"],
            registry=self.registry,
        )
        self.plugin_failures = Counter(
            "kubegpu_scheduler_plugin_failures_total",
            "Plugin hook calls that raised or answered outside the hook's contract, by plugin and hook.",
            ["plugin", "hook"],
            registry=self.registry,
        )
        self.refused_allocations = Counter(
            "kubegpu_scheduler_refused_allocations_total",
            "Bound pods whose kubegpu.io/allocation holds no devices: malformed, unverified, copied or stale.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "kubegpu_scheduler_is_leader", "1 while this replica holds the lease.", registry=self.registry
        )


@dataclass(order=True)
class Entry:
    """A pending pod as the queues hold it."""

    ready_at: float
    key: str = field(compare=False)
    request: PodRequest = field(compare=False)
    version: str = field(compare=False)
    attempts: int = field(default=0, compare=False)
    message: str | None = field(default=None, compare=False)
    arrival: float = field(default_factory=time.monotonic, compare=False)
    since: float = field(default=0.0, compare=False)  # when it was last found unschedulable


def _drawn_to(pending: PodRequest, added: PodRequest) -> bool:
    """Whether a pod added to a node can help `pending`: one of its pod affinity terms (required or preferred) or
    its topology spread constraints select the added pod."""
    terms = [*pending.pod_affinity, *(term for _, term in pending.preferred_affinity)]
    if any(pod_matches_term(term, added) for term in terms):
        return True
    return any(
        added.namespace == pending.namespace and selector_matches(c.selector, added.labels) for c in pending.spread
    )


async def write_placement(writer: AsyncKubeClient, pod: PodRequest, decision: Decision) -> None:
    """Create the Binding, guarded by the pod's UID, carrying the placement's annotations in its metadata.

    The API server copies the Binding's annotations onto the pod in the same write that sets `spec.nodeName`. So an
    allocation is only ever seen on a pod bound where it says, and a Binding that fails leaves no allocation behind
    that the pod's owner could later put back (docs/security.md, "freshness").
    """
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


class SchedulerService:
    def __init__(
        self,
        client: KubeClient,
        writer: AsyncKubeClient,
        engine: Engine,
        *,
        name: str,
        key: bytes,
        queue_pods: bool = True,
        leases: liveness.NodeLeases | None = None,
    ) -> None:
        self.client = client
        self.writer = writer
        self.queue_pods = queue_pods
        # The engine belongs to the loop thread; other threads (the extender's HTTP handlers) take this lock.
        self.lock = threading.RLock()
        self.engine = engine
        self.name = name
        self.key = key
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.stop = threading.Event()
        self.metrics = Metrics()
        engine.plugins.on_hook_failure.append(lambda e: self.metrics.plugin_failures.labels(e.plugin, e.hook).inc())
        self.active: dict[str, Entry] = {}
        self.backoff: list[Entry] = []
        self.unschedulable: dict[str, Entry] = {}
        self.in_flight: dict[str, Entry] = {}
        self.latest_version: dict[str, str] = {}
        self.unbound: dict[str, tuple[str, PodRequest]] = {}  # extender mode: pending pods and their versions
        self.leading = threading.Event()
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()
        self.heartbeat = time.monotonic()
        self._last_flush = time.monotonic()
        self.initial_backoff, self.max_backoff = INITIAL_BACKOFF, MAX_BACKOFF
        self.exit_code = 0
        self._refused: dict[str, str] = {}  # pod key -> why its allocation holds no devices (one Event per reason)
        self.budgets: dict[str, Budget] = {}  # PodDisruptionBudgets by namespace/name
        self.evicting: set[str] = set()  # victims deleted by a preemption, until their pods are gone
        self.leases = leases  # the advertisers' node Leases (`kubegpu.scheduler.liveness`), None: not judged
        self._next_judgement = 0.0

    # -- node liveness (`kubegpu.scheduler.liveness`): the advertisers' Leases, judged on a one-second tick --------

    def _consume_leases(self, kind: str, payload: Any) -> None:
        self.events.put(("lease", kind, payload))

    def _judge_nodes(self) -> None:
        """Tell the engine which nodes may take new device pods. Leases expire with time, not with an event, so
        this runs on a tick (`liveness.TICK`); a node that comes back wakes the unschedulable pods."""
        if self.leases is None or not self.leases.synced:
            return
        now = time.monotonic()
        if now < self._next_judgement:
            return
        self._next_judgement = now + liveness.TICK
        revived = False
        for name, reason in self.leases.verdicts(self.engine.nodes).items():
            if self.engine.set_node_live(name, reason is None, reason):
                revived |= reason is None
        if revived:
            self._wake()

    # -- informer callbacks (other threads): only enqueue ----------------------------------------------------------

    def _consume_nodes(self, kind: str, payload: Any) -> None:
        self.events.put(("node", kind, payload))

    def _consume_pods(self, kind: str, payload: Any) -> None:
        self.events.put(("pod", kind, payload))

    def _consume_budgets(self, kind: str, payload: Any) -> None:
        self.events.put(("budget", kind, payload))

    def _on_budgets(self, kind: str, payload: Any) -> None:
        if kind == "SYNC":
            self.budgets.clear()
            for obj in payload:
                self._apply_budget("ADDED", obj)
            return
        self._apply_budget(kind, payload)

    def _apply_budget(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
        if kind == "DELETED":
            self.budgets.pop(key, None)
            return
        try:
            self.budgets[key] = objects.budget(obj)
        except InputError as exc:
            log.warning("PodDisruptionBudget %s ignored: %s", key, exc)

    # -- node events ------------------------------------------------------------------------------------------------

    def _node_info(self, obj: dict[str, Any]) -> NodeInfo | None:
        try:
            return node_info(obj)
        except InputError as exc:
            name = (obj.get("metadata") or {}).get("name")
            log.error("node ignored the advertised inventory: %s", exc, extra={"node": name})
            annotations = dict((obj.get("metadata") or {}).get("annotations") or {})
            annotations.pop("kubegpu.io/devices", None)
            try:
                return node_info({**obj, "metadata": {**obj["metadata"], "annotations": annotations}})
            except (InputError, KeyError):
                return None

    def _apply_node(self, kind: str, obj: dict[str, Any]) -> bool:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return False
        if kind == "DELETED":
            gone = self.engine.remove_node(name)
            for key in gone:
                log.info("node deleted; pod forgotten", extra={"pod": key, "node": name})
            return False
        info = self._node_info(obj)
        if info is None:
            return False
        record = self.engine.nodes.get(name)
        changed = record is None or record.info != info
        if changed:
            self.engine.add_node(info)
        self._apply_foreign_devices(name, obj)
        return changed

    def _apply_foreign_devices(self, name: str, obj: dict[str, Any]) -> None:
        """The device ids the node's kubelet gave pods kubegpu did not place, as its node side publishes them
        (`kubegpu.io/foreign-devices`, `kubegpu.crishim.podresources`): those pods hold exactly these ids."""
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(FOREIGN_DEVICES_KEY)
        held: dict[str, dict[str, dict[str, list[str]]]] = {}
        if raw is not None:
            try:
                held = decode_foreign_devices(raw).pods
            except AnnotationError as exc:
                log.warning("node's foreign devices ignored: %s", exc, extra={"node": name})
        for key in self.engine.set_held_devices(name, held):
            log.info("pod holds the devices its kubelet reports", extra={"pod": key, "node": name})

    def _on_nodes(self, kind: str, payload: Any) -> None:
        changed = False
        if kind == "SYNC":
            seen = set()
            for obj in payload:
                changed |= self._guarded("node_event", obj, self._apply_node, "ADDED") is True
                seen.add((obj.get("metadata") or {}).get("name"))
            for name in list(self.engine.nodes):
                if name not in seen:
                    self.engine.remove_node(name)
            self.nodes_synced.set()
        else:
            changed = self._guarded("node_event", payload, self._apply_node, kind) is True
        if changed:
            self._wake()

    # -- pod events -------------------------------------------------------------------------------------------------

    def _on_pods(self, kind: str, payload: Any) -> None:
        if kind == "SYNC":
            live = set()
            for obj in payload:
                self._guarded("pod_event", obj, self._apply_pod, "ADDED")
                meta = obj.get("metadata") or {}
                live.add(f"{meta.get('namespace', 'default')}/{meta.get('name')}")
            for key in [k for k in self.engine.pods if k not in live and k not in self.in_flight]:
                self._release(key)
            for table in (self.active, self.unschedulable):
                for key in [k for k in table if k not in live]:
                    del table[key]
            self.pods_synced.set()
            return
        self._guarded("pod_event", payload, self._apply_pod, kind)

    def _guarded(self, stage: str, obj: dict[str, Any], apply: Any, kind: str) -> Any:
        """Apply one informer object; an unexpected error costs that object an error log, a metric and an Event,
        never the loop (a tenant's pod must not be able to stop scheduling for everyone)."""
        try:
            return apply(kind, obj)
        except Exception as exc:
            meta = obj.get("metadata") or {}
            self._internal_error(stage, meta, exc)
            return None

    def _internal_error(self, stage: str, meta: dict[str, Any], exc: Exception) -> None:
        self.metrics.internal_errors.labels(stage).inc()
        name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
        what = {"pod": f"{namespace}/{name}"} if namespace else {"node": name}
        log.error("%s failed; the object is skipped: %r", stage, exc, exc_info=exc, extra=what)
        if namespace and name:
            pod = PodRequest(namespace=namespace, name=name, uid=str(meta.get("uid", "")), containers=())
            self._event(pod, "KubegpuInternalError", f"kubegpu could not handle this pod ({stage}): {exc!r}")

    def _release(self, key: str) -> None:
        self.evicting.discard(key)
        if self.engine.release(key) is not None:
            self._wake()

    def _apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
        if kind == "MODIFIED" and not meta.get("deletionTimestamp"):
            # Most events are our own writes (the annotation patch, the Binding) to pods we already account for:
            # settle them from the raw object without parsing the whole pod again.
            if key in self.in_flight and self.in_flight[key].request.uid == meta.get("uid"):
                self.latest_version[key] = str(meta.get("resourceVersion", ""))
                return
            held = self.engine.pods.get(key)
            phase = (obj.get("status") or {}).get("phase")
            if held is not None and held.request.uid == meta.get("uid") and phase not in FINISHED:
                return
        try:
            request, deleting = pod_request(obj)
        except InputError as exc:
            self._unreadable_pod(kind, key, obj, str(exc))
            return
        version = str(meta.get("resourceVersion", ""))
        held = self.engine.pods.get(key)
        if held is not None and held.request.uid != request.uid:
            self._release(key)  # a new pod took an old pod's name
            held = None
        if kind == "DELETED" or request.phase in FINISHED:
            self._refused.pop(key, None)
            self._drop_pending(key)
            if key not in self.in_flight:
                self._release(key)
            return
        if request.node_name:
            self._drop_pending(key)
            if held is None and key not in self.in_flight:
                self._assume(request)
            return
        if not self.queue_pods:
            # Extender mode: kube-scheduler queues the pods; remember the pending ones so that a bind needs no GET.
            if deleting:
                self.unbound.pop(key, None)
            else:
                self.unbound[key] = (version, request)
            return
        if deleting or request.scheduler_name != self.name:
            self._drop_pending(key)
            return
        if key in self.in_flight:
            self.latest_version[key] = version
            return
        if held is not None:
            return
        entry = self.active.get(key)
        if entry is not None:
            entry.request, entry.version = request, version
            return
        entry = self.unschedulable.get(key)
        if entry is not None:
            changed = entry.request != request
            entry.request, entry.version = request, version
            if changed:
                # Its owner changed it (labels, tolerations, affinity ...): it may fit now (kube-scheduler's
                # isPodUpdated), once its backoff has passed.
                self._requeue(self.unschedulable.pop(key), time.monotonic())
            return
        for waiting in self.backoff:
            if waiting.key == key:
                waiting.request, waiting.version = request, version
                return
        self.active[key] = Entry(time.monotonic(), key, request, version)

    def _unreadable_pod(self, kind: str, key: str, obj: dict[str, Any], problem: str) -> None:
        """A pod kubegpu cannot read (a tenant wrote it): it is left alone, and if it was waiting for this scheduler
        its owner is told why, once."""
        meta = obj.get("metadata") or {}
        held = self.engine.pods.get(key)
        if kind == "DELETED" or (held is not None and held.request.uid != meta.get("uid")):
            self._refused.pop(key, None)
            self._drop_pending(key)
            if held is not None and held.request.uid == meta.get("uid") and key not in self.in_flight:
                self._release(key)
            return
        log.error("pod ignored: %s", problem, extra={"pod": key})
        spec = obj.get("spec") or {}
        if spec.get("schedulerName") == self.name and not spec.get("nodeName") and self._refused.get(key) != problem:
            self._refused[key] = problem
            pod = PodRequest(
                namespace=str(meta.get("namespace", "default")),
                name=str(meta.get("name", "")),
                uid=str(meta.get("uid", "")),
                containers=(),
            )
            self._event(pod, "FailedScheduling", f"kubegpu cannot schedule this pod: {problem}")

    def _drop_pending(self, key: str) -> None:
        self.engine.unnominate(key)
        self.unbound.pop(key, None)
        self.active.pop(key, None)
        self.unschedulable.pop(key, None)
        if any(e.key == key for e in self.backoff):
            self.backoff = [e for e in self.backoff if e.key != key]
            heapq.heapify(self.backoff)

    def _assume(self, request: PodRequest) -> None:
        """Count a bound pod (ledger rebuild, or a pod bound by someone else) with the devices it holds.

        Only a verified allocation holds devices (`Engine.allocation_problem`). A bound pod whose allocation is
        missing, malformed, unverified, copied or stale is counted as a pod bound without one: the devices it
        requests are set aside on its node (the kubelet admits it by count), and the devices its annotation names are
        not, so they go to other pods while the CRI shim refuses to start it.
        """
        node = request.node_name or ""
        raw = request.annotations.get(ALLOCATION_KEY)
        extra = {"pod": request.key, "node": node}
        if raw is not None:
            try:
                record = decode_allocation(raw)
            except AnnotationError as exc:
                problem = str(exc)
            else:
                status = self.engine.assume(request, node, record)
                if status.ok:
                    self._refused.pop(request.key, None)
                    return
                problem = status.message
            self.metrics.refused_allocations.inc()
            log.warning("bound pod's allocation holds no devices: %s", problem, extra=extra)
            if self._refused.get(request.key) != problem:
                self._refused[request.key] = problem
                self._event(request, "AllocationRefused", f"kubegpu.io/allocation holds no devices: {problem}")
        if any(self.engine.plugins.owner_of(r) for r in request.requested_resources()):
            decision = self.engine.hold(request, node)
            if not decision.scheduled:
                log.error("bound pod without an allocation does not fit its node: %s", decision.reason, extra=extra)
            else:
                self._wake_for(request)
            return
        status = self.engine.assume(request, node, None)
        if not status.ok:
            log.error("bound pod could not be counted: %s", status.message, extra=extra)
        else:
            self._wake_for(request)

    # -- queues ---------------------------------------------------------------------------------------------------

    # kube-scheduler's scheduling queue: a pod that failed waits out its backoff (1 s doubling per attempt up to
    # 10 s); one that fits nowhere waits in `unschedulable` until a cluster event that can help it (a node added or
    # changed, a pod deleted or finished, a pod added that its pod affinity or spread selects) or 60 s, whichever
    # comes first, then goes back through the backoff heap.

    def _backoff(self, attempts: int) -> float:
        return min(self.max_backoff, self.initial_backoff * (1 << min(30, max(0, attempts - 1))))

    def _requeue(self, entry: Entry, now: float) -> None:
        entry.ready_at = max(now, entry.ready_at)
        heapq.heappush(self.backoff, entry)

    def _wake(self) -> None:
        """The cluster changed in a way that may help any pod: unschedulable pods get another try once their
        backoff has passed."""
        now = time.monotonic()
        for entry in self.unschedulable.values():
            self._requeue(entry, now)
        self.unschedulable.clear()

    def _wake_for(self, added: PodRequest) -> None:
        """A pod now counts on a node: the unschedulable pods whose pod affinity (or topology spread) selects it may
        fit now; no other pod can (kube-scheduler's AssignedPodAdd)."""
        if not self.unschedulable:
            return
        now = time.monotonic()
        for key in [k for k, e in self.unschedulable.items() if _drawn_to(e.request, added)]:
            self._requeue(self.unschedulable.pop(key), now)

    def _retry_later(self, entry: Entry) -> None:
        entry.attempts += 1
        entry.ready_at = time.monotonic() + self._backoff(entry.attempts)
        heapq.heappush(self.backoff, entry)

    def _promote(self) -> None:
        now = time.monotonic()
        while self.backoff and self.backoff[0].ready_at <= now:
            entry = heapq.heappop(self.backoff)
            self.active.setdefault(entry.key, entry)
        if now - self._last_flush >= FLUSH_CHECK:
            self._last_flush = now
            stale = [k for k, e in self.unschedulable.items() if now - e.since >= UNSCHEDULABLE_FLUSH]
            for key in stale:
                self._requeue(self.unschedulable.pop(key), now)
        self.metrics.pending.labels("active").set(len(self.active))
        self.metrics.pending.labels("backoff").set(len(self.backoff))
        self.metrics.pending.labels("unschedulable").set(len(self.unschedulable))

    # -- scheduling ------------------------------------------------------------------------------------------------

    def _schedule(self, entry: Entry) -> None:
        started = time.perf_counter()
        decision = self.engine.schedule(entry.request)
        self.metrics.latency.observe(time.perf_counter() - started)
        extra = {"pod": entry.key, "node": decision.node}
        if decision.scheduled:
            self.metrics.attempts.labels("scheduled").inc()
            self.in_flight[entry.key] = entry
            self._wake_for(entry.request)
            self.writer.submit(self._bind(entry, decision))
            return
        result = "error" if decision.code.name == "ERROR" else "unschedulable"
        self.metrics.attempts.labels(result).inc()
        message = decision.reason or "no node fits"
        if result == "unschedulable":
            self._preempt(entry)
        log.info("unschedulable", extra={**extra, "reason": message})
        entry.attempts += 1
        entry.since = time.monotonic()
        entry.ready_at = entry.since + self._backoff(entry.attempts)
        if message != entry.message:
            entry.message = message
            self.writer.submit(self._report_unschedulable(entry.request, message))
        self.unschedulable[entry.key] = entry

    def _preempt(self, entry: Entry) -> None:
        """DefaultPreemption's PostFilter: evict pods of lower priority where that lets the pod fit. A pod whose
        nominated node still has victims terminating waits for them instead of preempting again."""
        pod = entry.request
        nominated = self.engine.nominated.get(entry.key)
        if nominated is not None:
            record = self.engine.nodes.get(nominated)
            if record is not None and any(key in self.evicting for key in record.pods):
                return
        preemption = self.engine.preempt(pod, list(self.budgets.values()))
        if preemption.node is None:
            if nominated is not None:
                self.engine.unnominate(entry.key)
            return
        self.engine.nominate(pod, preemption.node)
        self.evicting.update(preemption.victims)
        log.info(
            "preempting",
            extra={"pod": entry.key, "node": preemption.node, "victims": list(preemption.victims)},
        )
        victims = [self.engine.pods[key].request for key in preemption.victims if key in self.engine.pods]
        self.writer.submit(self._evict(pod, preemption, victims))

    async def _evict(self, pod: PodRequest, preemption: Preemption, victims: list[PodRequest]) -> None:
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        try:
            await self.writer.patch(path, {"status": {"nominatedNodeName": preemption.node}})
        except ApiError as exc:
            log.warning("could not set nominatedNodeName: %s", exc, extra={"pod": pod.key})
        for victim in victims:
            message = f"Preempted by {pod.namespace}/{pod.name} on node {preemption.node}"
            await self._post_event(victim, "Preempted", message, kind="Normal")
            try:
                await self.writer.request(
                    "DELETE",
                    f"/api/v1/namespaces/{victim.namespace}/pods/{victim.name}",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": victim.uid}},
                )
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("could not delete a preemption victim: %s", exc, extra={"pod": victim.key})

    async def _bind(self, entry: Entry, decision: Decision) -> None:
        started = time.perf_counter()
        try:
            await write_placement(self.writer, entry.request, decision)
        except Exception as exc:
            error = exc if isinstance(exc, ApiError) else ApiError(0, "ClientError", repr(exc))
            # A Binding whose answer was lost may have been written: never roll back a placement the API server holds.
            if error.status != 0 or not await bound_as_decided(self.writer, entry.request, decision):
                self.events.put(("bind_failed", entry, decision, error))
                return
        self.metrics.bind_latency.observe(time.perf_counter() - started)
        self.events.put(("bound", entry, decision))

    def _on_bound(self, entry: Entry, decision: Decision) -> None:
        self.in_flight.pop(entry.key, None)
        self.latest_version.pop(entry.key, None)
        devices = (decision.allocation.containers if decision.allocation else None) or None
        log.info("bound", extra={"pod": entry.key, "node": decision.node, "devices": devices})

    def _on_bind_failed(self, entry: Entry, decision: Decision, error: ApiError) -> None:
        self.in_flight.pop(entry.key, None)
        self.metrics.bind_errors.inc()
        held = self.engine.pods.get(entry.key)
        if held is not None and held.request.uid == entry.request.uid:
            self._release(entry.key)
        log.warning(
            "binding failed; reservation rolled back", extra={"pod": entry.key, "node": decision.node, "error": error}
        )
        if error.status == 404:
            return  # the pod is gone
        entry.version = self.latest_version.pop(entry.key, entry.version)
        if error.status == 409 and "resourceVersion" not in str(error) and "modified" not in str(error):
            # Already bound (by another scheduler or an earlier attempt): the pod watch will count it.
            return
        self._retry_later(entry)

    async def _report_unschedulable(self, pod: PodRequest, message: str) -> None:
        await self._post_event(pod, "FailedScheduling", message)
        condition = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                        "lastTransitionTime": now_rfc3339(),
                    }
                ]
            }
        }
        try:
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
            await self.writer.patch(path, condition, strategic=True)
        except ApiError as exc:
            log.warning("could not set the PodScheduled condition: %s", exc, extra={"pod": pod.key})

    def _event(self, pod: PodRequest, reason: str, message: str) -> None:
        """A Warning Event on the pod, written by the asynchronous writer (never blocking the loop)."""
        self.writer.submit(self._post_event(pod, reason, message))

    async def _post_event(self, pod: PodRequest, reason: str, message: str, kind: str = "Warning") -> None:
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": self.name},
            "reportingComponent": self.name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.writer.post(f"/api/v1/namespaces/{pod.namespace}/events", event)
        except ApiError as exc:
            log.warning("could not write the %s event: %s", reason, exc, extra={"pod": pod.key})

    # -- the loop -------------------------------------------------------------------------------------------------

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "node":
            self._on_nodes(item[1], item[2])
        elif kind == "pod":
            self._on_pods(item[1], item[2])
        elif kind == "lease":
            if self.leases is not None:
                self.leases.observe(item[1], item[2])
        elif kind == "budget":
            self._on_budgets(item[1], item[2])
        elif kind in ("bound", "bind_failed"):
            entry: Entry = item[1]
            try:
                if kind == "bound":
                    self._on_bound(entry, item[2])
                else:
                    self._on_bind_failed(entry, item[2], item[3])
            except Exception as exc:
                request = entry.request
                self._internal_error("bind", {"name": request.name, "namespace": request.namespace}, exc)

    def run_loop(self) -> None:
        while not self.stop.is_set():
            self.heartbeat = time.monotonic()
            ready = self.leading.is_set() and self.pods_synced.is_set()
            timeout = 0.0 if ready and self.active else 0.2
            try:
                item = self.events.get(timeout=timeout) if timeout else self.events.get_nowait()
                with self.lock:
                    self._handle(item)
                    for _ in range(2000):
                        self._handle(self.events.get_nowait())
            except queue.Empty:
                pass
            with self.lock:
                self._promote()
                self._judge_nodes()
                if not ready:
                    continue
                self._schedule_active(64)

    def _schedule_active(self, limit: int) -> None:
        """Run the cycle for up to `limit` active pods, by priority then arrival; a pod whose cycle raises costs only
        itself."""
        if any(entry.request.priority for entry in self.active.values()):
            batch = heapq.nsmallest(limit, self.active.values(), key=lambda e: (-e.request.priority, e.arrival))
            keys = [entry.key for entry in batch]
        else:
            keys = list(itertools.islice(self.active, limit))
        for key in keys:
            entry = self.active.pop(key)
            try:
                self._schedule(entry)
            except Exception as exc:
                request = entry.request
                self._internal_error(
                    "schedule", {"name": request.name, "namespace": request.namespace, "uid": request.uid}, exc
                )
                self._retry_later(entry)

    # -- process ----------------------------------------------------------------------------------------------------

    def start_informers(self) -> None:
        nodes = Informer(self.client, "/api/v1/nodes", self._consume_nodes, self.stop, "nodes")
        pods = Informer(self.client, "/api/v1/pods", self._consume_pods, self.stop, "pods")
        if self.queue_pods:
            path = "/apis/policy/v1beta1/poddisruptionbudgets"
            Informer(self.client, path, self._consume_budgets, self.stop, "poddisruptionbudgets").start()
        if self.leases is not None:
            selector = self.leases.selector
            consume = self._consume_leases
            Informer(self.client, self.leases.path, consume, self.stop, "leases", label_selector=selector).start()
        nodes.start()
        # Nodes first, so that the ledger rebuild finds every bound pod's node.
        while not nodes.synced.wait(0.2):
            if self.stop.is_set():
                return
        pods.start()

    def ready(self) -> bool:
        return self.nodes_synced.is_set() and self.pods_synced.is_set()

    def healthy(self) -> bool:
        return time.monotonic() - self.heartbeat < 30.0


def serve_health(service: SchedulerService, address: str) -> ThreadingHTTPServer:
    host, _, port = address.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, status, kind = generate_latest(service.metrics.registry), 200, CONTENT_TYPE_LATEST
            elif self.path == "/healthz":
                ok = service.healthy()
                body, status, kind = (b"ok" if ok else b"scheduling loop stalled"), 200 if ok else 500, "text/plain"
            elif self.path == "/readyz":
                ok = service.ready()
                body, status, kind = (b"ok" if ok else b"informers not synced"), 200 if ok else 503, "text/plain"
            else:
                body, status, kind = b"not found", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    config = None
    policy: Policy = args.policy or "binpack"
    if args.config:
        try:
            config, policy = load_config(args.config, args.policy)
        except ConfigError as exc:
            log.error("--config: %s", exc)
            return 2
    args.scheduler_name = args.scheduler_name or (config and config.scheduler_name) or "kubegpu-scheduler"
    key = read_key(args.allocation_key_file)
    plugins = make_plugin_manager("scheduler")
    for failure in plugins.failures:
        log.error("%s", failure)
    client = KubeClient.from_kubeconfig(args.kubeconfig, qps=args.kube_api_qps, burst=args.kube_api_burst)
    writer = AsyncKubeClient(client.credentials, client.limiter, connections=args.binders)
    engine = Engine(plugins, policy=policy, signing_key=key, scoring=config.profile if config else None)
    service = SchedulerService(
        client, writer, engine, name=args.scheduler_name, key=key, leases=liveness.from_args(args)
    )
    if config is not None:
        service.initial_backoff, service.max_backoff = config.initial_backoff, config.max_backoff
    server = serve_health(service, args.metrics_address)
    log.info("kubegpu scheduler %s starting; metrics on %s:%d", args.scheduler_name, *server.server_address[:2])

    def terminate(signum: int, _frame: Any) -> None:
        log.info("received signal %d, shutting down", signum)
        service.stop.set()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)

    def lost() -> None:
        log.error("leadership lost; exiting so that a fresh process can stand by")
        service.leading.clear()
        service.metrics.leader.set(0)
        service.stop.set()
        service.exit_code = 1

    def started() -> None:
        service.metrics.leader.set(1)
        service.leading.set()

    if args.leader_elect:
        LeaderElector(
            client,
            namespace=args.lease_namespace,
            name=args.lease_name or args.scheduler_name,
            identity=args.identity or f"{socket.gethostname()}_{os.getpid()}",
            on_started=started,
            on_stopped=lost,
            stop=service.stop,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        ).start()
    else:
        started()
    threading.Thread(target=service.start_informers, name="informers", daemon=True).start()
    service.run_loop()
    writer.close()
    server.shutdown()
    return service.exit_code


def add_scheduler_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "scheduler",
        help="the custom scheduler for pods whose spec.schedulerName names it",
        description="Schedule pending pods whose spec.schedulerName equals --scheduler-name on a real cluster: "
        "concrete devices are chosen by the plugins and written as the signed kubegpu.io/allocation annotation "
        "before the Binding is created.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument(
        "--scheduler-name", help="spec.schedulerName to serve (default: the --config profile's, else kubegpu-scheduler)"
    )
    parser.add_argument("--allocation-key-file", required=True, help="HMAC key shared with the CRI shim")
    parser.add_argument("--policy", choices=POLICIES, help="node preference (default binpack)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1beta1): score weights, plugins on and off",
    )
    parser.add_argument(
        "--no-leader-elect", dest="leader_elect", action="store_false", help="schedule without taking the Lease"
    )
    parser.add_argument("--lease-namespace", default="kube-system", help="namespace of the leader-election Lease")
    parser.add_argument("--lease-name", help="name of the Lease (default: the scheduler name)")
    parser.add_argument("--lease-duration", type=float, default=15.0, help="seconds (default 15)")
    parser.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--retry-period", type=float, default=2.0, help="seconds (default 2)")
    parser.add_argument("--identity", help="leader-election identity (default: hostname_pid)")
    parser.add_argument(
        "--metrics-address", default="0.0.0.0:10261", help="HOST:PORT for /metrics, /healthz, /readyz (port 0: any)"
    )
    parser.add_argument(
        "--binders", type=int, default=32, help="annotation patches and Bindings in flight at once (default 32)"
    )
    parser.add_argument(
        "--kube-api-qps", type=float, default=50.0, help="API requests a second, as kube-scheduler's (default 50)"
    )
    parser.add_argument("--kube-api-burst", type=int, default=100, help="API request burst (default 100)")
    liveness.add_node_lease_options(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)
    return parser
