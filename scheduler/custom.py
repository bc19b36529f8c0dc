"""`kubegpu scheduler`: the custom scheduler binary, for pods whose `spec.schedulerName` names it.

A thin front-end around the same `Engine` the simulator uses, wired from the parts it shares with the extender:
the cluster mirror (`mirror.py`: informers into the engine, the ledger rebuilt from bound pods' allocations), the
binder (`binder.py`: Bindings, Events, conditions, evictions) and the health and metrics server (`health.py`), plus
its own queue (`queue.py`, after kube-scheduler's). One thread owns the engine and runs the loop:

1. apply informer events (nodes first at start-up, then pods) and binding results;
2. take pending pods by priority, then arrival, and run the engine's cycle;
3. for a placement, reserve it in the engine at once and hand the Binding (which carries the signed allocation and
   the plugins' annotations) to the binder; a failure rolls the reservation back and retries the pod with backoff
   (1 s doubling to 10 s);
4. when nothing fits, a Warning Event `FailedScheduling` with kube-scheduler's `0/N nodes are available: ...` message
   and the pod condition `PodScheduled=False/Unschedulable`; the pod waits until the cluster changes in a way that
   can help it instead of being retried in a loop;
5. when nothing fits and the pod may preempt, the engine's device-aware preemption (`Engine.preempt`) names a node and
   the pods of lower priority to evict there, with PodDisruptionBudgets from their own informer: the node is held
   for it (`Engine.nominate`), the victims are deleted gracefully, all at once, then each gets a `Preempted` Event and
   the pod's `status.nominatedNodeName` is set, and the pod binds once they are gone (a victim already being deleted
   is waited for but not deleted or told again: `_not_deleted_yet`). While its victims terminate it
   does not preempt again, nor is it reported unschedulable again; a victim whose deletion failed stays and no
   longer counts as terminating, so the pod's next try preempts it again;
6. a member of a gang (a PodGroup's label, or Kueue's pod-group labels; docs/gangs.md) is tried with every pending
   member of its gang at once (`Engine.place_gang`): either every one of them gets a place in the domain the gang
   asks for and passes Permit, and all are bound, or none holds anything and each is told why. A gang with fewer
   members than its `minMember` so far holds places for those it has and waits at Permit (one such gang at a time,
   so that two gangs never both hold part) until the rest arrive or its `scheduleTimeoutSeconds` pass, when its
   places are given back. A gang that fits nowhere may evict pods of lower priority from one domain
   (`Engine.preempt_gang`). The PodGroup's `status` and Events say where it stands (`gangstatus`). After a restart,
   members already bound count towards `minMember` and the rest go beside them.

With leader election (the default) informers run on every replica, keeping a standby warm, but only the holder of the
Lease schedules: first it lists the pods and claims afresh and applies the lists (`ClusterMirror.caught_up`), since its
watches may lag behind the Bindings the previous leader made; then it decides, and only until its `Leadership` deadline
(`kube/leader.py`): the loop checks it before each pod and the writer before sending each write, so the leader stops
deciding and binding at the renew deadline whatever its renewals and its backlog of writes do; queued writes are then
refused unsent, and the process exits. Renewals use a client of their own, so they never wait behind the writer's rate
limiter. On SIGTERM the leader stops deciding and sending at once, waits for the writes it sent, and releases the
Lease so that a standby leads without waiting out the lease duration (`hand_over`). `/metrics`, `/healthz` and
`/readyz` are served on `--metrics-address`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import time
from typing import Any

from kubegpu.core.errors import shorten
from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.process import add_verify_key_argument, configure_logging, read_key, read_verify_keys
from kubegpu.kube.client import ApiError, AsyncKubeClient, Fenced, KubeClient
from kubegpu.kube.leader import LeaderElector, Leadership, timing_problem
from kubegpu.scheduler import liveness
from kubegpu.scheduler.binder import Binder, add_disruption_conditions_argument, marks_victims
from kubegpu.scheduler.dra import HeldClaim
from kubegpu.scheduler.draclaims import ClaimError, ClaimWriter
from kubegpu.scheduler.engine import POLICIES, Decision, Engine, PermitCode, Policy, rule_names
from kubegpu.scheduler.gangstatus import GroupStatus
from kubegpu.scheduler.health import HealthServer, Metrics
from kubegpu.scheduler.mirror import PODGROUPS, ClusterMirror
from kubegpu.scheduler.podgroups import POD_GROUP_LABEL, PodGroup, gang_key
from kubegpu.scheduler.queue import Entry, SchedulingQueue

__all__ = ["CustomScheduler", "add_scheduler_parser"]

log = logging.getLogger("kubegpu.scheduler")

BATCH = 64  # pods scheduled between two looks at the informer events
GANG_TICK = 1.0  # seconds between two looks at the gangs waiting at Permit and the PodGroups' counts
# From this release kube-scheduler appends its preemption's account to FailedScheduling's message (`... preemption:
# 0/3 nodes are available: 3 No preemption victims found for incoming pod.`); 1.20 and 1.21 write none.
TELLS_PREEMPTION_FROM = (1, 22)


class CustomScheduler:
    """The loop of `kubegpu scheduler`: the mirror's events, then the queue's pods through the engine's cycle."""

    def __init__(
        self,
        client: KubeClient,
        writer: AsyncKubeClient,
        engine: Engine,
        *,
        name: str,
        leases: liveness.NodeLeases | None = None,
        leadership: Leadership | None = None,
        leader_elect: bool = False,
        disruption_conditions: str = "auto",
    ) -> None:
        self.engine = engine
        self.name = name
        self.metrics = Metrics()
        marks = marks_victims(disruption_conditions, lambda: self.mirror.server_version)
        self.binder = Binder(writer, self.metrics, component=name, marks=marks)
        self.queue = SchedulingQueue(
            name,
            self.metrics,
            spread_of=engine.spread_constraints,
            sort=engine.queue_sort,
            namespace_labels=engine.placed.namespace_labels,
        )
        self.mirror = ClusterMirror(
            client,
            engine,
            self.binder,
            self.queue,
            leases=leases,
            watch_budgets=True,
            watch_volumes=True,
            watch_owners=True,
            watch_podgroups=True,
            needs_leases=leader_elect,
            watch_dra=True,
            claims_released=self._claims_released,
        )
        self.metrics.count_pods_on_verify_keys(self.mirror.pods_on_verify_keys)
        self.claims = ClaimWriter(writer, lambda namespace, name: self.mirror.claim_templates.get((namespace, name)))
        self.groups = GroupStatus(self.binder, self.mirror.podgroup, self.mirror.podgroup_uid)
        self._gang_victims: dict[str, tuple[str, ...]] = {}  # gang -> the victims of its last preemption
        self._at_permit: dict[str, Decision] = {}  # gang members waiting at Permit: the decision to bind, once let go
        self._blocked: set[str] = set()  # gangs refused at Permit while another was partly held
        self._next_gang_tick = 0.0
        self.stop = self.mirror.stop
        # Until when this replica may decide and bind (the elector's; held for good without leader election).
        self.leadership = leadership or Leadership.unconditional()
        # Whether the replica took a Lease: its informers' lists may predate its leadership (`_may_decide`).
        self.leader_elect = leader_elect
        self.exit_code = 0

    def run_loop(self) -> None:
        mirror, queue = self.mirror, self.queue
        while not self.stop.is_set():
            mirror.beat()
            ready = self._may_decide()
            mirror.apply_events(0.0 if ready and queue.active else 0.2)
            with mirror.lock:
                queue.promote()
                mirror.judge_nodes()
                mirror.recheck_digests()
                if ready:
                    self.tend_gangs()
                    self.schedule_active(BATCH)

    def _may_decide(self) -> bool:
        """While this replica leads, once its mirror holds the cluster: every informer's first list, and with leader
        election a list of pods made after the Lease was taken (kube-scheduler waits for its caches to sync; a
        standby's caches synced long ago, and its pod watch may lag behind the previous leader's Bindings)."""
        if not (self.leadership.holds() and self.mirror.ready()):
            return False
        return not self.leader_elect or self.mirror.caught_up()

    def schedule_active(self, limit: int) -> None:
        """Run the cycle for up to `limit` active pods, by priority then arrival, while this replica leads; a pod whose
        cycle raises costs only itself."""
        batch = self.queue.pop_batch(limit)
        gangs: dict[str, list[Entry]] = {}  # the batch's gang members by gang: a gang is tried once, as one
        for entry in batch:
            if (gang := gang_key(entry.request)) is not None:
                gangs.setdefault(gang, []).append(entry)
        tried: set[str] = set()
        for done, entry in enumerate(batch):
            gang = gang_key(entry.request) if gangs else None
            if gang in tried:
                continue
            if not self.leadership.holds():
                self.queue.put_back([e for e in batch[done:] if gang_key(e.request) not in tried])
                return
            try:
                if gang is None:
                    self._schedule(entry)
                else:
                    tried.add(gang)
                    self._schedule_gang(gang, gangs[gang])
            except Exception as exc:
                request = entry.request
                meta = {"name": request.name, "namespace": request.namespace, "uid": request.uid}
                self.mirror.internal_error("schedule", meta, exc)
                self.queue.retry_later(entry)

    # -- one cycle ------------------------------------------------------------------------------------------------

    def _schedule(self, entry: Entry) -> None:
        problem = self.mirror.dra_problem
        if problem is not None and entry.request.resource_claims:
            # Without the DRA collections the claims can be neither read nor written: the pod waits, told why.
            self.metrics.attempts.labels("unschedulable").inc()
            self._refused(entry, f"the pod's resource claims cannot be allocated: {problem}")
            return
        # A pod whose nominated node still has victims terminating waits for them instead of preempting again, and
        # is not reported again (`_refused`): its cycle need not explain a refusal nobody reads.
        awaits_victims = self.engine.awaits_victims(entry.key, self.mirror.evicting)
        started = time.perf_counter()
        decision = self.engine.schedule(entry.request, explain=not awaits_victims)
        self.metrics.latency.observe(time.perf_counter() - started)
        if decision.scheduled:
            self.metrics.attempts.labels("scheduled").inc()
            self._bind_decided(entry, decision)
            return
        result = "error" if decision.code.name == "ERROR" else "unschedulable"
        self.metrics.attempts.labels(result).inc()
        message = decision.reason or "no node fits"
        waiting = result == "unschedulable" and awaits_victims
        freed = False
        if result == "unschedulable" and not waiting:
            freed, outcome = self._preempt(entry)
            if outcome is not None:  # kube-scheduler 1.22+ appends its preemption's account
                message = f"{message} preemption: {outcome}"
        self._refused(entry, message, decision.node, waiting=waiting)
        if freed:  # places given back at Permit, not deleted pods: nothing else will say the room is there
            self.queue.wake()

    def _refused(self, entry: Entry, message: str, node: str | None = None, *, waiting: bool = False) -> None:
        log.info("unschedulable", extra={"pod": entry.key, "node": node, "reason": message})
        if waiting:
            # Its Event and condition already say it fits nowhere, its nominated node where it waits: written again
            # for each try while the victims leave, the reports would queue the victims' deletions behind them.
            self.queue.wait_for_victims(entry)
        else:
            self.queue.park(entry)
        told = entry.message
        if message != told and not (waiting and told is not None) and self.binder.report(entry.request, message):
            entry.message = message

    def _preempt(self, entry: Entry) -> tuple[bool, str | None]:
        """DefaultPreemption's PostFilter: evict pods of lower priority where that lets the pod fit. Whether victims
        waiting at Permit gave their places back (`_let_go_preempted`): the room is free at once; and where no node
        was chosen, on an API server whose kube-scheduler tells it (1.22 and later; an unknown version counts as
        older), the preemption's account of the nodes (`Preemption.outcome`), for the FailedScheduling message."""
        pod, mirror = entry.request, self.mirror
        version = mirror.server_version
        explain = version is not None and version >= TELLS_PREEMPTION_FROM
        preemption = self.engine.preempt(pod, list(mirror.budgets.values()), explain=explain)
        if preemption.node is None:
            if self.engine.nominated_node(entry.key) is not None:
                # Its node is let go, and so is its `status.nominatedNodeName`, as kube-scheduler (1.22+) clears the
                # nomination of a pod whose preemption finds nothing: else its owner (and a cluster autoscaler, which
                # counts a nominated pod as placed) reads that it will run on a node no longer held for it.
                log.info("nomination cleared", extra={"pod": entry.key, "reason": "no preemption victims"})
                self.binder.submit(self.binder.clear_nomination(pod))
            self.engine.unnominate(entry.key)
            return False, preemption.outcome
        self.engine.nominate(pod, preemption.node)
        log.info("preempting", extra={"pod": entry.key, "node": preemption.node, "victims": list(preemption.victims)})
        self._displace(pod.priority, preemption.node)
        bound = self._let_go_preempted(preemption.victims, f"pod {pod.key} on node {preemption.node}")
        victims = self._not_deleted_yet(bound)
        mirror.evicting_started(bound)
        if bound:
            self.binder.submit(self._evict(pod, preemption.node, victims))
        return len(bound) < len(preemption.victims), None

    def _displace(self, priority: int, node: str) -> None:
        """A pod or a gang of `priority` preempts on `node`: the pods of lower priority nominated there lose it
        (kube-scheduler clears their nominatedNodeName), each tried again now instead of waiting there for victims
        that free room the preemptor may take."""
        for displaced in self.engine.displace_nominees(priority, node):
            log.info("nomination cleared", extra={"pod": displaced.key, "node": node})
            self.binder.submit(self.binder.clear_nomination(displaced))
            self.queue.wake_pod(displaced.key)

    def _let_go_preempted(self, victims: tuple[str, ...], by: str) -> tuple[str, ...]:
        """Victims waiting at Permit are let go instead of deleted, as kube-scheduler rejects a waiting victim rather
        than deleting it: bound nowhere, such a pod loses nothing but its place, and deleted, a pod no controller
        recreates was lost to its job. Their gangs' other waiting members give their places back with them (a gang
        waits as one, as coscheduling's Unreserve rejects the whole group), instead of holding them, useless, until
        the gang's timeout; each member is told why and placed again, whole, once there is room. Returns the
        victims left to delete (bound, or binding)."""
        engine = self.engine
        gangs: dict[str | None, list[str]] = {}
        for key in victims:
            if (waiting := engine.waiting_pod(key)) is not None:
                gangs.setdefault(gang_key(waiting), []).append(key)
        if not gangs:
            return victims
        for gang, keys in gangs.items():
            if gang is None:  # waiting for an embedder's Permit rule, of no gang: it alone is let go
                entries = [e for key in keys if (e := self._let_go_one(key)) is not None]
            else:
                entries = self._let_go_waiting(gang)
            reason = f"preempted by {by} while waiting at Permit: " + (
                "the pod gave its place back and waits to be placed again"
                if gang is None
                else f"gang {gang} gave back every place its members held and waits to be placed again, whole"
            )
            log.info("let go at Permit: preempted", extra={"pod": gang or keys[0], "reason": reason})
            if gang is None:
                for entry in entries:
                    self._refused(entry, reason)
            elif entries:
                self._gang_refused(gang, entries, reason)
        let_go = {key for keys in gangs.values() for key in keys}
        return tuple(key for key in victims if key not in let_go)

    def _not_deleted_yet(self, bound: tuple[str, ...]) -> list[PodRequest]:
        """The victims of `bound` to delete: not those being deleted already, by an earlier preemption (its
        deletion sent, or seen) or by any other hand (their deletionTimestamp is set). Such a victim still counts
        as leaving for the preemptor, which waits for it, but it gets no second deletion and no second `Preempted`
        Event, as kube-scheduler 1.31+ skips a victim whose deletion has started (1.20.2 deletes it again)."""
        deleting = self.engine.being_deleted(bound) | self.mirror.evicting
        return [placed.request for placed in self.engine.placements(key for key in bound if key not in deleting)]

    def _let_go_one(self, key: str) -> Entry | None:
        """One pod waiting at Permit gives its place back: its entry, to be placed again."""
        entry = self.queue.unhold(key)
        self._at_permit.pop(key, None)
        self.engine.reject_waiting(key)
        return entry

    async def _evict(self, pod: PodRequest, node: str, victims: list[PodRequest]) -> None:
        """The victims' deletions; those that failed stay, and no longer count as leaving (`evicting_failed`): the
        preemptor, which waits for the victims it counts as leaving, would otherwise wait as long as they run."""
        failed = await self.binder.evict(pod, node, victims)
        if failed:
            self.mirror.post(self.mirror.evicting_failed, failed)

    async def _evict_for(self, gang: str, where: str, victims: list[PodRequest]) -> None:
        """A gang's victims' deletions, as `_evict`: the gang waits for those it counts as leaving."""
        why = f"{self.name}: preempting to accommodate a higher priority podgroup"
        failed = await self.binder.evict_for(gang, where, victims, why)
        if failed:
            self.mirror.post(self.mirror.evicting_failed, failed)

    # -- gangs -----------------------------------------------------------------------------------------------------

    def _schedule_gang(self, gang: str, batch: list[Entry]) -> None:
        """One cycle for a gang: its pending members (these, and the others the queue holds) placed whole, then
        Permit for each; or nothing held and every member told why."""
        entries = [*batch, *self.queue.take_gang(gang)]
        group, problem = self._gang_of(gang, entries[0])
        if group is None:
            if problem is None:  # a PodGroup label naming no PodGroup: its members go alone, as with coscheduling
                for entry in entries:
                    if entry.message is None:  # its first try: a typo in the label would otherwise go unnoticed
                        self._no_podgroup(gang, entry)
                    self._schedule(entry)
                return
            self._gang_refused(gang, entries, problem)
            return
        engine = self.engine
        self.groups.tried(gang)
        present = len(engine.gang_holders(group)) + len(entries)
        # Fewer members than minMember so far: those here go where the whole gang has room, and wait at Permit.
        started = time.perf_counter()
        placement = engine.place_gang([entry.request for entry in entries], group, partial=True)
        if not placement.placed and (parted := self._let_go_waiting(gang)):
            # Members waiting at Permit were placed before these existed, where only their own shape was known (a
            # 1-GPU driver before its 8-GPU workers): no room beside them need not mean no room for the gang. They
            # give their places back and the gang is placed afresh, whole, or holds nothing.
            entries.extend(parted)
            placement = engine.place_gang([entry.request for entry in entries], group, partial=True)
        self.metrics.latency.observe(time.perf_counter() - started)
        if not placement.placed:
            self.metrics.attempts.labels("unschedulable").inc(len(entries))
            reason = placement.reason or f"gang {gang} cannot be placed"
            freed = present >= group.min_member and self._preempt_gang(group, entries)
            self._gang_refused(gang, entries, reason)
            if freed:  # places given back at Permit, not deleted pods: nothing else will say the room is there
                self.queue.wake()
            return
        decisions = {decision.pod: decision for decision in placement.decisions}
        now = time.monotonic()
        for number, entry in enumerate(entries):
            decision = decisions.get(entry.key)
            if decision is None or not decision.scheduled:
                self._gang_refused(gang, [entry], (decision and decision.reason) or f"gang {gang}: no place left")
                continue
            answer = engine.permit(entry.request, now=now)
            if answer.code is PermitCode.REJECT:
                # Another gang is partly held: this one holds nothing either (two never both hold part).
                for other in entries[number + 1 :]:
                    held = decisions.get(other.key)
                    if held is not None and held.scheduled:
                        engine.unreserve(other.request, held.node)
                self._gang_refused(gang, entries[number:], answer.reason or f"gang {gang}: refused at Permit")
                self._blocked.add(gang)
                return
            self.metrics.attempts.labels("scheduled").inc()
            if answer.code is PermitCode.WAIT:
                self.queue.hold(entry)
                self._at_permit[entry.key] = decision
                message = f"waiting at Permit: {answer.reason} (up to {group.timeout_seconds}s)"
                if message != entry.message:
                    entry.message = message
                    self.binder.submit(self.binder.post_event(entry.request, "WaitingForGang", message, "Normal"))
                continue
            self._bind_decided(entry, decision)
            for key in answer.approved:
                waiting, held = self.queue.unhold(key), self._at_permit.pop(key, None)
                if waiting is not None and held is not None:
                    self._bind_decided(waiting, held)
        if placement.domain is not None:
            log.info("gang placed", extra={"pod": gang, "node": f"{placement.level}={placement.domain}"})

    def _let_go_waiting(self, gang: str) -> list[Entry]:
        """The gang's members waiting at Permit give their places back: their entries, to be placed again."""
        return [entry for key in self.engine.waiting_gangs().get(gang, ()) if (entry := self._let_go_one(key))]

    def _no_podgroup(self, gang: str, entry: Entry) -> None:
        """Tell a pod whose PodGroup label names no PodGroup that it is scheduled alone: with a typo in one
        worker's label, that worker runs alone while the others wait at Permit for it, and nothing else says why."""
        if self.mirror.versions.get(PODGROUPS, "") is None:
            why = "PodGroups cannot be read (the API server serves none, or this scheduler may not list them)"
        else:
            why = f"PodGroup {shorten(gang)} does not exist"
        message = (
            f"{why}: the pod is scheduled alone, not as a member of a gang "
            f"(check its {POD_GROUP_LABEL} label, or create the PodGroup before its pods)"
        )
        self.binder.submit(self.binder.post_event(entry.request, "PodGroupNotFound", message))

    def _gang_of(self, gang: str, entry: Entry) -> tuple[PodGroup | None, str | None]:
        """The gang's spec, or why its members cannot be placed (a PodGroup kubegpu cannot read, a malformed Kueue
        label); (None, None): a PodGroup label naming no PodGroup."""
        known = self.mirror.podgroups.get(gang)
        if isinstance(known, str):
            return None, known
        try:
            return self.engine.gang_of(entry.request), None
        except ManifestError as exc:
            return None, str(exc)

    def _gang_refused(self, gang: str, entries: list[Entry], reason: str) -> None:
        """Every one of these members waits, holding nothing, told why (once per distinct reason)."""
        for entry in entries:
            self.queue.park(entry)
            if reason != entry.message and self.binder.report(entry.request, reason):
                entry.message = reason
        log.info("gang unschedulable", extra={"pod": gang, "reason": reason})
        self.groups.event(gang, "FailedScheduling", reason)

    def _preempt_gang(self, group: PodGroup, entries: list[Entry]) -> bool:
        """PostFilter for a gang that fits nowhere: evict the pods of lower priority that keep one domain from it,
        unless the victims of an earlier preemption for it are still leaving. Whether victims waiting at Permit
        gave their places back (`_let_go_preempted`): the room is free at once."""
        mirror = self.mirror
        leaving = self._gang_victims.get(group.key)
        if leaving and any(key in mirror.evicting for key in leaving):
            return False
        preemption = self.engine.preempt_gang(
            [entry.request for entry in entries], group, list(mirror.budgets.values())
        )
        if not preemption.victims:
            self._gang_victims.pop(group.key, None)
            self.engine.unnominate_gang(group.key)
            return False
        self._gang_victims[group.key] = preemption.victims
        # The domain is held for the gang while its victims leave, so that pods of lower priority do not take the
        # room they free one by one (kube-scheduler nominates a preemptor's node the same way).
        priority = min(entry.request.priority for entry in entries)
        held = self.engine.nominate_gang(group.key, priority, preemption.level, preemption.domain, preemption.victims)
        for node in held:  # the pods of lower priority nominated there wait for room the gang takes no more
            self._displace(priority, node)
        where = f"{preemption.level}={preemption.domain}" if preemption.level else "the cluster"
        log.info("preempting for a gang", extra={"pod": group.key, "node": where, "victims": list(preemption.victims)})
        bound = self._let_go_preempted(preemption.victims, f"gang {group.key} in {where}")
        victims = self._not_deleted_yet(bound)
        mirror.evicting_started(bound)
        if victims:
            self.binder.submit(self._evict_for(f"gang {group.key}", where, victims))
        let_go = len(preemption.victims) - len(bound)
        what = ", ".join(
            part
            for part in (
                f"evicting {len(victims)} pods of lower priority" if victims else "",
                f"letting go {let_go} waiting at Permit" if let_go else "",
            )
            if part
        )
        self.groups.event(group.key, "Preempting", f"{what} in {where}", "Normal")
        return let_go > 0

    def tend_gangs(self) -> None:
        """Once a tick: the members waiting at Permit past their gang's timeout give their places back (and wait
        for a change in the cluster before they try again); the PodGroups whose counts changed get their status."""
        now = time.monotonic()
        if now < self._next_gang_tick:
            return
        self._next_gang_tick = now + GANG_TICK
        expired = self.engine.expire(now)
        if expired:
            self.mirror.pending.wake()  # their places are free for others, before they park
        by_gang: dict[str, list[Entry]] = {}
        for waiting in expired:
            entry = self.queue.unhold(waiting.pod.key)
            self._at_permit.pop(waiting.pod.key, None)
            gang = gang_key(waiting.pod)
            if entry is not None and gang is not None:
                by_gang.setdefault(gang, []).append(entry)
        for gang, entries in by_gang.items():
            try:
                group = self.engine.gang_of(entries[0].request)
            except ManifestError:
                group = None
            timeout = f"{group.timeout_seconds}s" if group else "its timeout"
            minimum = f" of minMember {group.min_member}" if group else ""
            reason = (
                f"gang {gang} timed out after {timeout} waiting at Permit: {len(entries)}{minimum} members held "
                "places; they are given back"
            )
            self._gang_refused(gang, entries, reason)
        self._let_go_lost()
        self._recheck_waiting()
        if self._blocked and not self.engine.waiting_gangs():
            # No gang is partly held any more: those refused for that are tried again (else their members kept
            # "gang ml/blue is partly held" after blue was bound, until a member of theirs came or the cluster changed).
            for gang in self._blocked:
                self.queue.wake_group(gang)
            self._blocked.clear()
        members = self.mirror.gang_members
        if members is not None:
            for gang in members.take_changed():
                counts = members.counts(gang)
                self.groups.update(gang, counts)
                if counts.members == counts.scheduled:  # none left to place: a domain held for it is let go
                    self.engine.unnominate_gang(gang)
                    self._gang_victims.pop(gang, None)
                if not counts.members:  # its last member is gone: what was remembered of it goes too
                    self.groups.forget(gang)
                    # Else a gang refused while another is partly held (up to that one's timeout, a week at most)
                    # stayed remembered after its members went: one name per gang a tenant created and deleted.
                    self._blocked.discard(gang)

    def _let_go_lost(self) -> None:
        """The members the engine no longer holds at Permit, though they were left waiting there: deleted, nothing of
        them stays (their bind decisions were kept until their gang's timeout, up to a week, one per deletion); their
        node deleted, they are tried again at once, beside their gang's other members, instead of being held, their
        place gone, until the timeout while the member that completes the gang finds one too few."""
        for key in [key for key in self._at_permit if not self.engine.is_waiting(key)]:
            del self._at_permit[key]
            entry = self.queue.unhold(key)
            if entry is not None:  # still pending: its node went
                log.info("gang member let go at Permit: its node is gone", extra={"pod": key})
                self.queue.put_back([entry])

    def _recheck_waiting(self) -> None:
        """The members waiting at Permit whose PodGroup changed under them: deleted (or made unreadable), they give
        their places back at once and are tried again (alone, as a pod of no PodGroup is, or told why), instead of
        holding them, and keeping every other gang from holding part, until a deleted group's timeout (up to a
        week); its `minMember` lowered to what they are, they are bound. Cheap: at most one gang waits at a time."""
        engine = self.engine
        for gang, keys in engine.waiting_gangs().items():
            entries = [entry for key in keys if (entry := self.queue.unhold(key)) is not None]
            for entry in entries:  # back as they were unless they are let go below
                self.queue.hold(entry)
            if not entries:
                continue
            try:
                group = engine.gang_of(entries[0].request)
            except ManifestError:
                group = None
            if group is not None and isinstance(self.mirror.podgroups.get(gang), PodGroup | None):
                if len(engine.gang_holders(group)) < group.min_member:
                    continue
                for entry in entries:  # minMember lowered to what holds places: Permit lets them all go
                    self.queue.unhold(entry.key)
                    held = self._at_permit.pop(entry.key, None)
                    if engine.allow(entry.key) is not None and held is not None:
                        self._bind_decided(entry, held)
                    else:
                        self.queue.put_back([entry])
                continue
            for entry in self._let_go_waiting(gang):
                entry.message = None  # told afresh: alone (`_no_podgroup`), or why its PodGroup cannot be read
                self.queue.put_back([entry])
            log.info("gang let go at Permit: its PodGroup is gone", extra={"pod": gang})

    def _bind_decided(self, entry: Entry, decision: Decision) -> None:
        self.queue.binding_started(entry)
        self.queue.wake_for(entry.request)
        self.binder.submit(self._bind(entry, decision, self.engine.held_claims(entry.key)))

    # -- the Binding, and what its result does to the queue ---------------------------------------------------------

    async def _bind(self, entry: Entry, decision: Decision, claims: list[HeldClaim]) -> None:
        """PreBind (the pod's DRA claims made, allocated and reserved), then the Binding."""
        error: ApiError | None = None
        if claims:
            try:
                await self.claims.reserve(entry.request, claims)
            except ClaimError as exc:
                error = exc
        if error is None:
            error = await self.binder.bind(entry.request, decision)
        self.mirror.post(self._bound, entry, decision, error)

    def _claims_released(self, pod: PodRequest, claims: list[HeldClaim]) -> None:
        """The engine gave the pod's claims back (the pod is gone, or its Binding failed): write it."""
        self.binder.submit(self.claims.release(pod, claims))

    def _bound(self, entry: Entry, decision: Decision, error: ApiError | None) -> None:
        """A Binding's result, on the loop thread; anything unexpected costs only this pod."""
        try:
            self.queue.binding_done(entry.key)
            if error is not None:
                self._bind_failed(entry, decision, error)
        except Exception as exc:
            request = entry.request
            self.mirror.internal_error("bind", {"name": request.name, "namespace": request.namespace}, exc)

    def _bind_failed(self, entry: Entry, decision: Decision, error: ApiError) -> None:
        self.mirror.roll_back(entry.request, decision.node, error)
        if isinstance(error, ClaimError):  # its claims could not be written: told why, and tried again
            message = f"the pod's resource claims could not be written: {error}"
            self.binder.event(entry.request, "FailedScheduling", message)
            self.queue.retry_later(entry)
            return
        if error.status == 404:
            return  # the pod is gone
        if error.status == 409 and "resourceVersion" not in str(error) and "modified" not in str(error):
            # Already bound (by another scheduler or an earlier attempt): the pod watch will count it.
            return
        if not isinstance(error, Fenced):
            # The API server refused it (an admission webhook, RBAC, a 429 storm, a timeout): the pod's owner reads
            # why, as kube-scheduler's "binding rejected", once per distinct reason rather than at every retry. A
            # Binding never sent because this replica stopped leading says nothing about the pod.
            message = f"binding rejected: {error}"
            if message != entry.message and self.binder.report(entry.request, message, "SchedulerError"):
                entry.message = message
        self.queue.retry_later(entry)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    problem = timing_problem(args.lease_duration, args.renew_deadline, args.retry_period) if args.leader_elect else None
    if problem:
        log.error("%s", problem)
        return 2
    plugins = make_plugin_manager("scheduler")
    for failure in plugins.failures:
        log.error("%s", failure)
    config = None
    policy: Policy = args.policy or "binpack"
    if args.config:
        from kubegpu.scheduler.config import ConfigError, RuleNames, load_config  # pydantic and YAML: for a --config

        try:
            config, policy = load_config(args.config, args.policy, RuleNames(*rule_names(plugins)))
        except ConfigError as exc:
            log.error("--config: %s", exc)
            return 2
    levels = None
    if args.topology:
        from kubegpu.scheduler.config import ConfigError, load_topology

        try:
            levels = load_topology(args.topology)
        except ConfigError as exc:
            log.error("--topology: %s", exc)
            return 2
    args.scheduler_name = args.scheduler_name or (config and config.scheduler_name) or "kubegpu-scheduler"
    key = read_key(args.allocation_key_file)
    verify_keys = read_verify_keys(args.allocation_verify_key_file, key)
    leadership = Leadership() if args.leader_elect else Leadership.unconditional()
    client = KubeClient.from_kubeconfig(args.kubeconfig, qps=args.kube_api_qps, burst=args.kube_api_burst)
    fence = leadership.remaining if args.leader_elect else None
    writer = AsyncKubeClient(client.credentials, client.limiter, connections=args.binders, fence=fence)
    writer.warm(args.binders)  # the TLS handshakes happen while the informers list
    engine = Engine(
        plugins, policy=policy, signing_key=key, verify_keys=verify_keys, scoring=config.profile if config else None
    )
    engine.set_topology(levels)
    scheduler = CustomScheduler(
        client,
        writer,
        engine,
        name=args.scheduler_name,
        leases=liveness.from_args(args),
        leadership=leadership,
        leader_elect=args.leader_elect,
        disruption_conditions=args.disruption_conditions,
    )
    if config is not None:
        scheduler.queue.initial_backoff, scheduler.queue.max_backoff = config.initial_backoff, config.max_backoff
    scheduler.mirror.start_informers()  # on every replica: a standby keeps its mirror warm
    server = HealthServer(scheduler.mirror, scheduler.metrics, args.metrics_address, writer.loop)
    log.info("kubegpu scheduler %s starting; metrics on %s:%d", args.scheduler_name, *server.address)

    def terminate(signum: int, _frame: Any) -> None:
        log.info("received signal %d, shutting down", signum)
        if args.leader_elect:
            leadership.give_up()  # before anything else: no pod decided, no write sent from here on
        scheduler.stop.set()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)

    def lost() -> None:
        log.error("leadership lost; exiting so that a fresh process can stand by")
        scheduler.metrics.leader.set(0)
        scheduler.stop.set()
        scheduler.exit_code = 1

    elector = None
    if args.leader_elect:
        # The Lease's own client: its own connection and no rate limiter, so a renewal never waits behind the
        # writer's backlog (a burst of Bindings and Events can owe the shared limiter tens of seconds).
        elector_client = KubeClient(client.credentials, connections=1)
        elector = LeaderElector(
            elector_client,
            namespace=args.lease_namespace,
            name=args.lease_name or args.scheduler_name,
            identity=args.identity or f"{socket.gethostname()}_{os.getpid()}",
            on_started=lambda: scheduler.metrics.leader.set(1),
            on_stopped=lost,
            stop=scheduler.stop,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
            leadership=leadership,
        )
        elector.start()
    else:
        scheduler.metrics.leader.set(1)
    scheduler.run_loop()
    if elector is not None and scheduler.exit_code == 0:
        hand_over(elector, writer)
    server.shutdown()
    writer.close()
    return 2 if scheduler.mirror.refusal is not None else scheduler.exit_code


def hand_over(elector: LeaderElector, writer: AsyncKubeClient) -> None:
    """After a SIGTERM, give the Lease up so that a standby leads at once instead of after the lease duration, but only
    when nothing this replica sent can land after it: its leadership already given up (no decision, no write sent
    since), the elector's thread ended (no renewal in flight), every write it sent answered, and one that went
    unanswered given the margin a standby would have left it (`--lease-duration` minus `--renew-deadline`). Whatever
    fails leaves the Lease as it is, to be waited out. Bounded by the lease duration, within Kubernetes' default 30 s
    grace period."""
    deadline = time.monotonic() + elector.lease_duration
    elector.leadership.give_up()
    elector.join(max(0.0, deadline - time.monotonic()))
    if elector.is_alive() or not elector.holds_record:
        return
    lost = writer.drain(max(0.0, deadline - time.monotonic()))
    if lost is None:
        log.warning("leader election: writes still unanswered at shutdown; the lease is left to expire")
        return
    land_by = lost + elector.lease_duration - elector.renew_deadline
    if land_by > time.monotonic():
        if land_by > deadline:
            log.warning("leader election: a write went unanswered at shutdown; the lease is left to expire")
            return
        time.sleep(land_by - time.monotonic())
    elector.release(max(0.0, deadline - time.monotonic()))


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
    parser.add_argument(
        "--allocation-key-file", required=True, help="HMAC key shared with the CRI shim: signs every allocation"
    )
    add_verify_key_argument(parser)
    parser.add_argument("--policy", choices=POLICIES, help="node preference (default binpack)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a KubeSchedulerConfiguration, one profile (kubescheduler.config.k8s.io v1beta1, v1beta2, v1beta3 or v1): "
        "score weights, plugins on and off",
    )
    parser.add_argument(
        "--topology",
        metavar="FILE",
        help="a Kueue Topology document: the node labels gangs are placed by, widest first (default: AWS's network "
        "layers and nvidia.com/gpu.clique where nodes carry them; docs/gangs.md)",
    )
    parser.add_argument(
        "--no-leader-elect", dest="leader_elect", action="store_false", help="schedule without taking the Lease"
    )
    parser.add_argument("--lease-namespace", default="kube-system", help="namespace of the leader-election Lease")
    parser.add_argument("--lease-name", help="name of the Lease (default: the scheduler name)")
    parser.add_argument(
        "--lease-duration", type=float, default=15.0, help="seconds a standby waits for a silent leader (default 15)"
    )
    parser.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        help="seconds after its last renewal began at which a leader stops binding; shorter than --lease-duration "
        "(default 10)",
    )
    parser.add_argument("--retry-period", type=float, default=2.0, help="seconds between renewals (default 2)")
    parser.add_argument("--identity", help="leader-election identity (default: hostname_pid)")
    parser.add_argument(
        "--metrics-address", default="0.0.0.0:10261", help="HOST:PORT for /metrics, /healthz, /readyz (port 0: any)"
    )
    parser.add_argument(
        "--binders",
        type=int,
        default=32,
        help="writes (Bindings, Events, pod conditions) in flight at once (default 32)",
    )
    parser.add_argument(
        "--kube-api-qps", type=float, default=50.0, help="API requests a second, as kube-scheduler's (default 50)"
    )
    parser.add_argument("--kube-api-burst", type=int, default=100, help="API request burst (default 100)")
    liveness.add_node_lease_options(parser)
    add_disruption_conditions_argument(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)
    return parser
