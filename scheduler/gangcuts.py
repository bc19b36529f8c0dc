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

Each evicted member gets a `Preempted` Event naming the preemptor, the member it lost and why; the deletion is
guarded by the member's UID. What is remembered is bounded: a member's departure is kept `KEPT_SECONDS` for a
nomination to follow, for `MAX_DEPARTURES` departures at most, and the members being deleted only while they hold
resources.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from threading import RLock

from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import PodRequest
from kubegpu.scheduler.binder import Binder
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.podgroups import gang_key

__all__ = ["GangCuts"]

log = logging.getLogger("kubegpu.extender")

KEPT_SECONDS = 120.0  # how long a member's departure waits for a nomination on its node
MAX_DEPARTURES = 4096


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
    ) -> None:
        self.engine = engine
        self.binder = binder
        self.waiting = waiting  # a gang's members waiting to be bound
        self.lock = lock
        self.clock = clock
        self._left: dict[tuple[str, str], tuple[PodRequest, float]] = {}  # (node, gang) -> member gone, when
        self._leaving: set[str] = set()  # members being deleted, by anyone, until they are gone
        self._ours: set[str] = set()  # those this evicts

    def leaving(self, pod: PodRequest, node: str, gone: bool) -> None:
        """The bound pod `pod` is being deleted from `node`, or is gone (`gone`)."""
        gang = gang_key(pod)
        if gang is None:
            return
        ours = pod.key in self._ours
        if gone:
            self._leaving.discard(pod.key)
            self._ours.discard(pod.key)
        else:
            self._leaving.add(pod.key)
        if ours:
            return
        now = self.clock()
        self._left.pop((node, gang), None)
        self._left[(node, gang)] = (pod, now)
        for where, (_, when) in list(self._left.items()):  # oldest first
            if now - when <= KEPT_SECONDS and len(self._left) <= MAX_DEPARTURES:
                break
            del self._left[where]
        self._settle(node)

    def nominated(self, pod: PodRequest, node: str) -> None:
        """kube-scheduler nominated the preemptor `pod` on `node`."""
        self._settle(node)

    def _settle(self, node: str) -> None:
        nominees = self.engine.nominees(node)
        if not nominees:
            return
        preemptor, priority = max(nominees.items(), key=lambda item: item[1])
        held_now = self.engine.pod_keys()  # a relist may have dropped members without their events
        self._leaving.intersection_update(held_now)
        self._ours.intersection_update(held_now)
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
                if key != departed.key
                and key not in self._leaving
                and (held := self.engine.placement(key)) is not None
                and held.request.uid != departed.uid
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
            self._ours.update(member.key for member in rest)
            self._leaving.update(member.key for member in rest)
            why = (
                f"gang {group.key}, which kube-scheduler cut below its minMember {group.min_member} when it "
                f"preempted member {departed.name} on node {node}"
            )
            log.info("evicting the rest of %s", why, extra={"pod": preemptor, "node": node})
            self.binder.submit(self._evict(preemptor, why, rest))

    async def _evict(self, preemptor: str, why: str, rest: list[PodRequest]) -> None:
        failed = await self.binder.evict_for(preemptor, why, rest)
        if failed:
            with self.lock:
                self._ours.difference_update(failed)
                self._leaving.difference_update(failed)
