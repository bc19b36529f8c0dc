"""Leader election with a `coordination.k8s.io/v1` Lease, so that two scheduler replicas never both bind.

The rules follow client-go's leader election: a candidate takes the Lease when it is absent, already its own, or
when its record has not changed for `lease_duration` as observed on the candidate's own clock (so clock skew between
machines does not matter). The leader renews every `retry_period`; if it cannot renew within `renew_deadline` it
gives leadership up and the process exits, as kube-scheduler does, rather than risk a second binder. Updates carry the
Lease's resourceVersion, so two candidates racing for an expired Lease cannot both win.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubegpu.kube.client import ApiError, KubeClient, now_rfc3339

__all__ = ["LeaderElector"]

log = logging.getLogger("kubegpu.leader")


class LeaderElector(threading.Thread):
    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        stop: threading.Event,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        super().__init__(name="leader-election", daemon=True)
        self.client = client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace, self.name, self.identity = namespace, name, identity
        self.on_started, self.on_stopped = on_started, on_stopped
        self.stop_event = stop
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.is_leader = threading.Event()
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0

    def _spec(self, acquire_time: str | None, transitions: int) -> dict[str, Any]:
        now = now_rfc3339(micro=True)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": acquire_time or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        try:
            lease = self.client.get(self.path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None, 0),
            }
            try:
                self.client.post(self.collection, body)
            except ApiError as create_error:
                if create_error.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime", "")))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        mine = holder == self.identity
        if holder and not mine and now - self._observed_at < duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        lease["spec"] = self._spec(spec.get("acquireTime") if mine else None, transitions)
        try:
            self.client.put(self.path, lease)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                acquired = self.try_acquire_or_renew()
            except ApiError as exc:
                log.warning("leader election: %s", exc)
                acquired = False
            if acquired:
                break
            self.stop_event.wait(self.retry_period)
        if self.stop_event.is_set():
            return
        log.info("leader election: %s became the leader (lease %s/%s)", self.identity, self.namespace, self.name)
        self.is_leader.set()
        self.on_started()
        last_renewal = time.monotonic()
        while not self.stop_event.wait(self.retry_period):
            try:
                if self.try_acquire_or_renew():
                    last_renewal = time.monotonic()
                    continue
                log.error("leader election: %s lost the lease to another candidate", self.identity)
            except ApiError as exc:
                log.warning("leader election: renewing failed: %s", exc)
                if time.monotonic() - last_renewal < self.renew_deadline:
                    continue
                log.error("leader election: could not renew within %.0fs", self.renew_deadline)
            break
        self.is_leader.clear()
        if not self.stop_event.is_set():
            self.on_stopped()
