"""The rest of a gang kube-scheduler's preemption cut below its `minMember`: the extender evicts it.

Behind kube-scheduler, the extender does not choose victims: kube-scheduler evicts pods of the one node it picks
(1.20.2 without even asking the extender's `/preempt`: kubernetes#103019; later releases take the extender's victims
but refuse any pod not on that node). Evicting one worker of a running training gang left the others running below
`minMember`, useless, holding their GPUs until their job failed. The custom scheduler's preemption takes such a gang
whole (`GangPreempting._gangs_kept_whole`, T182), and Kueue evicts a workload whole; the extender does the same
after the fact: once a bound gang member is being deleted on a node where a pod of higher priority is nominated
(`status.nominatedNodeName`, kube-scheduler's sign that it preempted there; in either order, as kube-scheduler's
asynchronous preemption nominates before it deletes), the gang's members still running are evicted too when, with
the members still waiting to be bound, fewer than `minMember` remain. None is evicted while the gang can still be
whole, nor when one of them is of the preemptor's priority or higher, nor for a member that finished or was deleted
with no preemptor of higher priority nominated on its node (its owner's doing, not a preemption).

Kubernetes 1.26+ (PodDisruptionConditions, GA in 1.31) says why it deletes a pod: its `DisruptionTarget`
condition, written before the deletion, has the reason `PreemptionByScheduler` for kube-scheduler's victims, and
another (`EvictionByEvictionAPI`, `DeletionByTaintManager`, `DeletionByPodGC`, `TerminationByKubelet`) for a drain,
a taint, the pod GC or the kubelet: such a member is no preemption's victim, whatever is nominated on its node. A
kube-scheduler that marks its victims marks every one, so on an API server of 1.31 or later (where the feature is
GA, locked on: `MARKS_FROM`), or once this process has seen one marked, an unmarked deletion is its owner's (a Job,
a StatefulSet's rolling restart, a user). kube-scheduler 1.20.2 marks none: there the nomination alone decides, within
`KEPT_SECONDS` of the member's first sign of leaving.

Each evicted member gets a `Preempted` Event naming the preemptor, the member it lost and why; the deletion is
guarded by the member's UID. Every replica of the extender (the extender-ha overlay runs two) follows the same cut;
each member is evicted by the one whose first write to it, guarded by the `resourceVersion` it read, lands first
(`Binder.evict_unless_taken`), and only that one tells it why. A hand that marked a member and then failed to
delete it does not keep it running: the winner retries its deletion, and a mark no deletion followed within
`Binder.mark_trusted_seconds` is taken over by whoever looks again first (each extender looks again at the members it
could not evict, `RECHECKS` times). What is remembered is bounded: a member's departure
is kept `KEPT_SECONDS` for a nomination to follow (from its first sign of leaving: its status reported again
meanwhile does not extend it), for `MAX_DEPARTURES` departures at most, and the members being deleted only while
they hold resources. Members are known by UID: a member restarted under its name (a StatefulSet) is another pod,
running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from threading import RLock

from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import PodRequest
from kubegpu.scheduler.binder import (
    DISRUPTION_TARGET,
    PREEMPTION_BY_SCHEDULER,
    Binder,
    Eviction,
    disruption_target,
)
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.podgroups import gang_key

__all__ = ["GangCuts"]

log = logging.getLogger("kubegpu.extender")

KEPT_SECONDS = 120.0  # how long a member's departure waits for a nomination on its node
MAX_DEPARTURES = 4096
RECHECKS = 3  # how many times a member not evicted yet is looked at again (`GangCuts._evict`)
RECHECK_MARGIN_SECONDS = 1.0  # past the time a mark stops being trusted, so that it has
# From this Kubernetes release on, PodDisruptionConditions is GA and cannot be turned off: every victim is marked.
# (1.26-1.30 have it on by default; there a first marked victim seen tells, `GangCuts._marked`.)
MARKS_FROM = (1, 31)
# How the `DisruptionTarget` message of a member the extender evicts begins (`GangCuts._evict`): any extender reading
# it (another replica of the extender-ha overlay, or this one restarted while its evictions still terminate) knows
# the mark for an extender's, not kube-scheduler's, so that it never infers from it that kube-scheduler marks.
EXTENDER_MARK = "kubegpu extender: evicting the rest of "


def preemption_mark(status: object) -> bool | None:
    """What a pod's `status` says of its deletion (Kubernetes 1.26+): True, kube-scheduler preempted it; False,
    another hand is deleting it (the Eviction API, the taint manager, the pod GC, the kubelet, or an extender
    evicting the rest of a cut gang: `EXTENDER_MARK`); None, it says nothing (kube-scheduler 1.20.2, or a pod
    deleted by its owner)."""
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if not isinstance(conditions, list):
        return None
    for condition in conditions:
        if (
            isinstance(condition, dict)
            and condition.get("type") == DISRUPTION_TARGET
            and condition.get("status") == "True"
        ):
            message = condition.get("message")
            if isinstance(message, str) and message.startswith(EXTENDER_MARK):
                return False
            return condition.get("reason") == PREEMPTION_BY_SCHEDULER
    return None


class GangCuts:
    """Follows the gang members leaving their nodes and the nominations kube-scheduler writes (called by the cluster
    mirror with its lock held), and evicts the rest of a gang a preemption cut below its minMember."""

    def __init__(
        self,
        engine: Engine,
        binder: Binder,
        waiting: Callable[[str], int],
        lock: RLock,
        clock: Callable[[], float] = time.monotonic,
        server: Callable[[], tuple[int, int] | None] = lambda: None,
    ) -> None:
        self.engine = engine
        self.server = server  # the API server's (major, minor), once known
        self.binder = binder
        self.waiting = waiting  # a gang's members waiting to be bound
        self.lock = lock
        self.clock = clock
        self._left: dict[tuple[str, str], tuple[PodRequest, float]] = {}  # (node, gang) -> member gone, when
        self._leaving: dict[str, str] = {}  # members being deleted, by anyone, until they are gone: UID -> key
        self._ours: dict[str, str] = {}  # those this evicts: UID -> key
        self._marked = False  # kube-scheduler was seen marking a victim `PreemptionByScheduler`

    def leaving(self, pod: PodRequest, node: str, gone: bool, preempted: bool | None = None) -> None:
        """The bound pod `pod` is being deleted from `node`, or is gone (`gone`: deleted, finished, or replaced by a
        pod of its name). `preempted`: what its deletion says of itself (`preemption_mark`; False for a pod that
        finished or that is known gone without having been seen leaving)."""
        ours = pod.uid in self._ours
        if preempted and not ours:  # this process marks its own evictions on every version (`Binder._delete`)
            self._marked = True
        gang = gang_key(pod)
        if gang is None:
            return
        seen = pod.uid in self._leaving  # its departure dates from its first sign of leaving
        if gone:
            self._leaving.pop(pod.uid, None)
            self._ours.pop(pod.uid, None)
        else:
            self._leaving[pod.uid] = pod.key
        if ours or seen or preempted is False or (preempted is None and self._marks()):
            return  # not a preemption's victim (another hand, its owner, or this), or known already
        now = self.clock()
        self._left.pop((node, gang), None)
        self._left[(node, gang)] = (pod, now)
        self._forget_old(now)
        self._settle(node)

    def _marks(self) -> bool:
        """Whether kube-scheduler marks its victims here (a deletion unmarked is then no preemption's)."""
        if self._marked:
            return True
        version = self.server()
        return version is not None and version >= MARKS_FROM

    def _forget_old(self, now: float) -> None:
        for where, (_, when) in list(self._left.items()):  # oldest first
            if now - when <= KEPT_SECONDS and len(self._left) <= MAX_DEPARTURES:
                break
            del self._left[where]

    def nominated(self, pod: PodRequest, node: str) -> None:
        """kube-scheduler nominated the preemptor `pod` on `node`."""
        self._settle(node)

    def _settle(self, node: str) -> None:
        nominees = self.engine.nominees(node)
        if not nominees:
            return
        preemptor, priority = max(nominees.items(), key=lambda item: item[1])
        for known in (self._leaving, self._ours):  # a relist may have dropped members without their events
            for uid, key in list(known.items()):
                if (held := self.engine.placement(key)) is None or held.request.uid != uid:
                    del known[uid]
        self._forget_old(self.clock())
        for where in [where for where in self._left if where[0] == node]:
            departed, _ = self._left[where]
            if departed.priority >= priority:
                continue  # not a victim of this preemptor
            del self._left[where]
            try:
                group = self.engine.gang_of(departed)
            except ManifestError:
                continue
            if group is None:
                continue
            rest = [
                held.request
                for key in self.engine.gang_holders(group)
                if (held := self.engine.placement(key)) is not None
                and held.request.uid != departed.uid
                and held.request.uid not in self._leaving
            ]
            if not rest or len(rest) + self.waiting(group.key) >= group.min_member:
                continue  # nothing left running, or the gang can still be whole
            if any(member.priority >= priority for member in rest):
                log.info(
                    "a preemption cut gang %s below its minMember; a member of the preemptor's priority or higher "
                    "keeps the rest running",
                    group.key,
                    extra={"pod": preemptor, "node": node},
                )
                continue
            self._ours.update((member.uid, member.key) for member in rest)
            self._leaving.update((member.uid, member.key) for member in rest)
            why = (
                f"gang {group.key}, which kube-scheduler cut below its minMember {group.min_member} when it "
                f"preempted member {departed.name} on node {node}"
            )
            log.info("evicting the rest of %s", why, extra={"pod": preemptor, "node": node})
            self.binder.submit(self._evict(preemptor, why, rest))

    async def _evict(self, preemptor: str, why: str, rest: list[PodRequest]) -> None:
        """Evict the rest of a cut gang, each member once whoever else follows the same cut: every replica of the
        extender-ha overlay sees it, and each member goes to the one whose guarded write wins
        (`Binder.evict_unless_taken`), which alone gives it its `Preempted` Event. A member another hand marked and
        has not deleted yet, or that could not be evicted, is looked at again once such a mark is no longer trusted
        (`Binder.mark_trusted_seconds`), `RECHECKS` times at most: a hand that marked a member and then failed to
        delete it (its deletion refused, its process gone) leaves it to the others, not running below minMember."""
        binder = self.binder
        mark = disruption_target(EXTENDER_MARK + why) if binder.marks() else None
        pending = rest
        for round_ in range(RECHECKS + 1):
            if round_:
                await asyncio.sleep(binder.mark_trusted_seconds + RECHECK_MARGIN_SECONDS)
            later = []
            for member in pending:
                outcome = await binder.evict_unless_taken(member, mark)
                if outcome is Eviction.EVICTED:
                    await binder.post_event(member, "Preempted", f"Preempted by {preemptor} in {why}", kind="Normal")
                elif outcome is Eviction.LEFT:
                    log.info("not evicted: gone, or already being deleted", extra={"pod": member.key})
                else:
                    later.append(member)
            if not later:
                return
            pending = later
            log.info(
                "%d member(s) of the cut %s not evicted yet (marked by another hand, or it failed): looking again "
                "in %.0f s",
                len(pending),
                why,
                binder.mark_trusted_seconds + RECHECK_MARGIN_SECONDS,
                extra={"pod": preemptor},
            )
        log.warning("gave up evicting %d member(s) of the cut %s", len(pending), why, extra={"pod": preemptor})
        with self.lock:
            for member in pending:
                self._ours.pop(member.uid, None)
                self._leaving.pop(member.uid, None)
