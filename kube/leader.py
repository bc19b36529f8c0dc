"""Leader election with a `coordination.k8s.io/v1` Lease, so that two scheduler replicas never both bind.

The rules follow client-go's leader election: a candidate takes the Lease when it is absent, already its own, or
when its record has not changed for `lease_duration` as observed on the candidate's own clock (so clock skew between
machines does not matter). Updates carry the Lease's resourceVersion, so two candidates racing for an expired Lease
cannot both win. Unlike client-go, a Lease deleted or with its holder cleared does not count as free, and a
leaseDurationSeconds shortened by hand does not shorten the wait: the holder last seen may be alive between two
renewals, and it stops acting only at its own renew deadline. A record naming this candidate's identity that this
process did not write (its previous incarnation's) is waited out too.

What the leader may do is bounded by time, not by what the election thread last managed to report. `Leadership`
holds a deadline on this process's monotonic clock: `renew_deadline` after the start of the last successful renewal.
The scheduling loop checks it before each pod and the writer before it hands each write to a connection
(`AsyncKubeClient`'s fence), so a renewal that hangs, or answers late, or a thread that is slow to notice, cannot
stretch it. When the deadline passes without a renewal the elector gives leadership up and the process exits, as
kube-scheduler does, rather than risk a second binder.

Why that is enough. The record another candidate watches was stored after the renewal that wrote it started, and
the candidate takes the Lease only once it has seen that record unchanged for `lease_duration`; so nobody else can
hold the Lease before `start + lease_duration`. The leader hands its last write to a connection before
`start + renew_deadline`. The difference (5 s with the defaults) is the time such a write has to reach the API server
and be stored: a write that takes longer (a network or API server that holds a request for seconds, a process
paused between its check and the socket write) could still land after a standby took over. Both clocks are assumed
to run at the same rate, as client-go assumes.

Renewals never wait behind other traffic: the elector is given a client of its own (its own connections, no rate
limiter shared with the writer), and each attempt is bounded by `renew_deadline / 2` and by the time left before the
deadline, so an attempt that hangs is abandoned and retried while there is time.

Handing over on SIGTERM (every rollout, every node drain). Waiting out a leader that is shutting down anyway would
pause scheduling for a whole lease duration, so a leader that stops cleanly gives the Lease up, as client-go's
`ReleaseOnCancel` does, but only once it can no longer act: its `Leadership` is given up for good (the loop decides
nothing more and the writer's fence refuses every write not yet sent), and every write already sent has been answered
(`AsyncKubeClient.drain`). Then `release` rewrites the record it last wrote, conditionally on its resourceVersion, with
no holder and the annotation `kubegpu.io/released-at` equal to the record's own renewTime. A candidate takes such a
Lease at once. A deleted Lease, or one whose holder was cleared by hand (T167), carries no such pair (every write of a
holder drops the annotation, and a hand edit leaves renewTime as it was), so it is still waited out (a cleared one
for a lease duration from its first look by a candidate that never saw its holder); so is the Lease of a leader
killed without SIGTERM, which writes nothing.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from kubegpu.kube.client import ApiError, KubeClient, now_rfc3339

__all__ = ["RELEASED_AT", "LeaderElector", "Leadership", "timing_problem"]

log = logging.getLogger("kubegpu.leader")

# On a Lease its holder gave up: the renewTime of that same write. Only the releasing holder writes both at once.
RELEASED_AT = "kubegpu.io/released-at"


class Leadership:
    """Until when this replica may act as the leader: decide placements and write about pods.

    Only the elector moves the deadline; anyone may read it. Reading is a clock read and a comparison, cheap enough
    for every pod and every write.
    """

    def __init__(self, until: float = -math.inf) -> None:
        self._until = until
        self._given_up = False

    @classmethod
    def unconditional(cls) -> Leadership:
        """Held for good: a replica that runs without leader election (`--no-leader-elect`)."""
        return cls(math.inf)

    @property
    def deadline(self) -> float:
        """The monotonic time at which this replica stops acting (-inf: not leading)."""
        return self._until

    def holds(self) -> bool:
        return time.monotonic() < self._until

    def remaining(self) -> float:
        """Seconds left to act; zero or less once the deadline has passed."""
        return self._until - time.monotonic()

    def extend(self, until: float) -> None:
        if not self._given_up:  # a renewal answered after a SIGTERM does not bring leadership back
            self._until = until

    def end(self) -> None:
        self._until = -math.inf

    def give_up(self) -> None:
        """Stop acting now and for good (shutting down): later renewals move nothing."""
        self._given_up = True
        self._until = -math.inf


def timing_problem(lease_duration: float, renew_deadline: float, retry_period: float) -> str | None:
    """Why these durations cannot keep two replicas from binding at once, or None when they can."""
    if min(lease_duration, renew_deadline, retry_period) <= 0:
        return "--lease-duration, --renew-deadline and --retry-period must be positive"
    if renew_deadline >= lease_duration:
        return (
            f"--renew-deadline ({renew_deadline:g}s) must be shorter than --lease-duration ({lease_duration:g}s): "
            "the difference is the time a Binding sent just before the deadline has to land before another replica "
            "may take the Lease"
        )
    if retry_period >= renew_deadline:
        return (
            f"--retry-period ({retry_period:g}s) must be shorter than --renew-deadline ({renew_deadline:g}s), "
            "or a failed renewal is never retried before the leader must stop"
        )
    return None


class LeaderElector(threading.Thread):
    """Takes the Lease, renews it while `stop` is unset, and moves `leadership`'s deadline on every renewal.

    `client` must be the elector's own (no rate limiter or connection pool shared with other traffic).
    `on_started` runs once the Lease is taken; `on_stopped` once it is lost or could not be renewed in time, unless
    `stop` was set first. By then `leadership` has already stopped holding.
    """

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
        leadership: Leadership | None = None,
    ) -> None:
        super().__init__(name="leader-election", daemon=True)
        problem = timing_problem(lease_duration, renew_deadline, retry_period)
        if problem:
            raise ValueError(problem)
        self.client = client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace, self.name, self.identity = namespace, name, identity
        self.on_started, self.on_stopped = on_started, on_stopped
        self.stop_event = stop
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.attempt_timeout = renew_deadline / 2  # a hung attempt leaves time for another before the deadline
        self.leadership = leadership or Leadership()
        self.is_leader = threading.Event()
        # The last record naming a holder, (holder, renewTime), when this candidate first saw it, and how long that
        # holder may stay silent (the record's leaseDurationSeconds, never less than ours). A Lease without a holder
        # (deleted, or holderIdentity cleared by hand) is not a newer record: the holder last seen may still be acting.
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._observed_for = lease_duration
        # Whether this process wrote the Lease as its holder. A record naming this identity that another process wrote
        # (this container's previous incarnation: the default identity is the pod's hostname and pid 1 each time) is
        # waited out like anyone else's, since that process's last writes may still be on their way.
        self._held = False
        # The Lease as this process last stored it (the answer to its last write): what `release` rewrites.
        self._written: dict[str, Any] | None = None

    def _spec(self, acquire_time: str | None, transitions: int) -> dict[str, Any]:
        now = now_rfc3339(micro=True)
        return {
            "holderIdentity": self.identity,
            # Rounded up: a candidate waits at least as long as this replica may lead and then some.
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "acquireTime": acquire_time or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _call(self, method: str, path: str, deadline: float, body: Any = None) -> Any:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ApiError(0, "Timeout", f"{method} {path}: no time left for this attempt")
        return self.client.request(method, path, body=body, timeout=left)

    def try_acquire_or_renew(self, deadline: float) -> bool:
        """One attempt at taking or renewing the Lease, every request of it answered before `deadline` (monotonic)
        or abandoned. False when another candidate holds it or won a race for it."""
        try:
            lease = self._call("GET", self.path, deadline)
        except ApiError as exc:
            if exc.status != 404:
                raise
            if self._waiting_for_another():  # deleted under a holder that may still be acting
                return False
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None, 0),
            }
            try:
                stored = self._call("POST", self.collection, deadline, body)
            except ApiError as create_error:
                if create_error.status == 409:
                    return False
                raise
            self._stored(stored)
            return True
        if not isinstance(lease, dict) or not isinstance(lease.get("spec") or {}, dict):
            raise ApiError(0, "InvalidAnswer", f"GET {self.path}: the answer is not a Lease")
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if not holder and self._released(lease):
            self._observed = None  # the holder last seen gave it up once it could no longer act: nothing to wait out
        elif not holder and self._observed is None:
            # Cleared by hand before this process saw who held it (it just started, or its first look came late):
            # whoever held it may still be acting, for up to a lease duration from now as far as this process knows.
            self._observed, self._observed_at = ("", str(spec.get("renewTime", ""))), time.monotonic()
            self._observed_for = self.lease_duration
        if holder:
            record = (holder, str(spec.get("renewTime", "")))
            if record != self._observed:
                self._observed, self._observed_at = record, time.monotonic()
            # A leaseDurationSeconds shortened by hand does not shorten the wait: the holder stops acting at its own
            # renew deadline, which only its own --lease-duration bounds.
            asked = spec.get("leaseDurationSeconds")
            asked = float(asked) if isinstance(asked, int | float) and not isinstance(asked, bool) else 0.0
            self._observed_for = max(self.lease_duration, asked)
        if self._waiting_for_another():
            return False
        mine = holder == self.identity and self._held
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        lease["spec"] = self._spec(spec.get("acquireTime") if mine else None, transitions)
        annotations = (lease.get("metadata") or {}).get("annotations")
        if isinstance(annotations, dict):
            annotations.pop(RELEASED_AT, None)  # held again: a later hand edit of the holder must not read as a release
        try:
            stored = self._call("PUT", self.path, deadline, lease)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        self._stored(stored)
        return True

    def _stored(self, lease: Any) -> None:
        self._held = True
        self._written = lease if isinstance(lease, dict) and isinstance(lease.get("spec"), dict) else None

    @property
    def holds_record(self) -> bool:
        """Whether the Lease this process last stored names it (what `release` would give up)."""
        return self._written is not None and self._held

    @staticmethod
    def _released(lease: dict[str, Any]) -> bool:
        """Whether a holderless Lease was given up by its holder (`release`) rather than deleted or cleared by hand."""
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        released_at = annotations.get(RELEASED_AT) if isinstance(annotations, dict) else None
        return bool(released_at) and released_at == (lease.get("spec") or {}).get("renewTime")

    def release(self, timeout: float) -> bool:
        """Give the Lease up so that a candidate takes it at once: call only once this process can act no more (its
        `Leadership` given up, this thread ended, every write it sent answered). The record this process last stored
        is rewritten on its resourceVersion, so a Lease someone else wrote since (a standby that took it, a hand edit)
        is left as it is. True when released."""
        lease = self._written
        if lease is None or not self._held or self.is_alive():
            return False
        spec = dict(lease["spec"])
        now = now_rfc3339(micro=True)
        spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=now)
        metadata = dict(lease.get("metadata") or {})
        annotations = metadata.get("annotations")
        metadata["annotations"] = {**(annotations if isinstance(annotations, dict) else {}), RELEASED_AT: now}
        try:
            self._call("PUT", self.path, time.monotonic() + timeout, {**lease, "metadata": metadata, "spec": spec})
        except ApiError as exc:
            log.warning(
                "leader election: %s did not release the lease (%s); a standby takes it after the lease duration",
                self.identity,
                exc,
            )
            return False
        self._held = False
        log.info("leader election: %s released the lease %s/%s", self.identity, self.namespace, self.name)
        return True

    def _waiting_for_another(self) -> bool:
        """Whether the holder last seen, not this process, may still be acting: its record was first seen less than
        its lease duration ago."""
        if self._observed is None or (self._observed[0] == self.identity and self._held):
            return False
        return time.monotonic() - self._observed_at < self._observed_for

    def run(self) -> None:
        if not self._acquire():
            return
        log.info("leader election: %s became the leader (lease %s/%s)", self.identity, self.namespace, self.name)
        self.is_leader.set()
        self.on_started()
        self._renew()
        self.leadership.end()
        self.is_leader.clear()
        if not self.stop_event.is_set():
            self.on_stopped()

    def _acquire(self) -> bool:
        """Try every `retry_period` until the Lease is ours (True) or `stop` is set (False)."""
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                if self.try_acquire_or_renew(started + self.attempt_timeout):
                    self.leadership.extend(started + self.renew_deadline)
                    return True
            except ApiError as exc:
                log.warning("leader election: %s", exc)
            self.stop_event.wait(self.retry_period)
        return False

    def _renew(self) -> None:
        """Renew every `retry_period` until the deadline passes without a renewal, the Lease is someone else's, or
        `stop` is set. An attempt never runs past the deadline, and one answered after it does not count."""
        leadership = self.leadership
        while not self.stop_event.wait(min(self.retry_period, max(0.0, leadership.remaining()))):
            started = time.monotonic()
            renewed = False
            if started < leadership.deadline:
                try:
                    renewed = self.try_acquire_or_renew(min(started + self.attempt_timeout, leadership.deadline))
                except ApiError as exc:
                    log.warning("leader election: renewing failed: %s", exc)
            if self.stop_event.is_set():  # shutting down: the renewal stands, `release` gives the record up
                return
            if not leadership.holds():
                log.error(
                    "leader election: %s could not renew the lease within the renew deadline (%gs); it stopped "
                    "acting at the deadline",
                    self.identity,
                    self.renew_deadline,
                )
                return
            if renewed:
                leadership.extend(started + self.renew_deadline)
                continue
            holder = self._observed[0] if self._observed else ""
            if holder != self.identity:
                log.error("leader election: %s lost the lease to %s", self.identity, holder or "another candidate")
                return
            # A conflict on our own record (a renewal whose answer was lost moved it on): read it again.
