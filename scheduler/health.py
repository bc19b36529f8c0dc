"""What the live front-ends report about themselves: one metrics registry and the `/metrics`, `/healthz`, `/readyz`
routes, served by kubegpu's HTTP server (`http_server.py`) for both of them.

`kubegpu scheduler` serves these routes alone on `--metrics-address` (`HealthServer`); `kubegpu extender` serves them
beside its verbs on its one port, where the probes and `/metrics` answer without a client certificate (they name no
pod). Readiness: the informers have listed nodes and pods (and what else the front-end watches: budgets, claims,
volumes, owners); once ready, `/readyz` also shows the API versions chosen by discovery and names a collection the
API server does not serve at all (the front-end goes on without it). Health: the loop that consumes informer events
beat within the last `STALL` seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kubegpu.scheduler.http_server import Answer, HttpServer, Text

__all__ = ["HEALTH_PATHS", "HealthServer", "Metrics", "answer_health"]

HEALTH_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})


class Metrics:
    """Every metric either live front-end exports, in one registry. The queue's (attempts, latency, pending) and the
    leadership gauge stay at zero in the extender, whose queue is kube-scheduler's."""

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
            "Time to create the Binding (with the placement's annotations).",
            registry=self.registry,
        )
        self.bind_errors = Counter(
            "kubegpu_scheduler_bind_errors_total", "Bindings that failed.", registry=self.registry
        )
        self.pending = Gauge(
            "kubegpu_scheduler_pending_pods",
            "Pods waiting to be scheduled, by queue (active, backoff, unschedulable; gated: held by their scheduling "
            "gates, outside the queue).",
            ["queue"],
            registry=self.registry,
        )
        self.gated = Gauge(
            "kubegpu_scheduler_gated_pods",
            "This scheduler's pods held by scheduling gates, by gate name (a pod with two gates counts under each; "
            'past 32 names, the others count under gate="(other)").',
            ["gate"],
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
        self.plugin_slow_calls = Counter(
            "kubegpu_scheduler_plugin_slow_calls_total",
            "Plugin hook calls that took longer than a second (kubegpu.core.plugin_manager.SLOW_HOOK_SECONDS), by "
            "plugin and hook: the engine waits for each, so every pod waited meanwhile.",
            ["plugin", "hook"],
            registry=self.registry,
        )
        self.refused_allocations = Counter(
            "kubegpu_scheduler_refused_allocations_total",
            "Bound pods whose kubegpu.io/allocation holds no devices: malformed, unverified, copied or stale.",
            registry=self.registry,
        )
        self.verify_key_pods = Gauge(
            "kubegpu_scheduler_pods_on_verify_keys",
            "Bound pods holding devices by an allocation that only an --allocation-verify-key-file key verifies: a "
            "key being rotated out is needed until this is 0.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "kubegpu_scheduler_is_leader", "1 while this replica holds the lease.", registry=self.registry
        )

    def count_pods_on_verify_keys(self, count: Callable[[], int]) -> None:
        """`kubegpu_scheduler_pods_on_verify_keys` asks `count` (`Engine.pods_on_verify_keys`) when scraped."""
        self.verify_key_pods.set_function(count)


class Watched(Protocol):
    """What the probes ask: the cluster mirror (`mirror.ClusterMirror`) answers them."""

    def syncing(self) -> list[str]: ...

    def healthy(self) -> bool: ...

    def apis(self) -> dict[str, str | None]: ...

    def server(self) -> tuple[str | None, list[str], str | None]: ...


def answer_health(path: str, watched: Watched, metrics: Metrics) -> tuple[int, Any] | None:
    """The answer to `GET path` for the three paths this module serves, else None."""
    if path == "/metrics":
        return 200, Text(generate_latest(metrics.registry), CONTENT_TYPE_LATEST.encode())
    if path == "/healthz":  # the event loop answers and the informers' consumer keeps beating
        if watched.healthy():
            return 200, {"status": "ok"}
        return 503, {"status": "the loop consuming informer events is stuck"}
    if path == "/readyz":  # ready once every informer the engine reads has listed its collection
        version, warnings, refused = watched.server()
        if refused is not None:  # a server older than kubegpu supports: the process is exiting
            return 503, {"status": f"refused: {refused}"}
        waiting = watched.syncing()
        if waiting:
            return 503, {"status": f"syncing {', '.join(waiting)}"}
        answer: dict[str, Any] = {"status": "ready"}
        if version is not None:
            answer["kubernetes"] = version
        if warnings:
            answer["warnings"] = warnings
        apis = watched.apis()
        if apis:  # the versions discovery chose, and what the API server does not serve at all
            answer["apis"] = apis
            missing = [
                f"the API server serves no version of {name} that kubegpu reads"
                for name, v in apis.items()
                if v is None
            ]
            if missing:
                answer["missing"] = missing
        return 200, answer
    return None


class HealthServer(HttpServer):
    """`/metrics`, `/healthz` and `/readyz` alone, as `kubegpu scheduler` serves them on `--metrics-address`."""

    def __init__(
        self, watched: Watched, metrics: Metrics, listen: str, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.watched, self.metrics = watched, metrics
        super().__init__(self.answer, listen, None, loop)

    def answer(self, method: bytes, target: bytes, body: bytes, caller: str | None) -> Answer:
        if method != b"GET":
            return 405, {"error": f"method {method.decode(errors='replace')} is not allowed; use GET"}
        path = target.split(b"?", 1)[0].decode(errors="replace").rstrip("/") or "/"
        answer = answer_health(path, self.watched, self.metrics)
        if answer is None:
            return 404, {"error": f"unknown path {path!r}; use {', '.join(sorted(HEALTH_PATHS))}"}
        return answer
