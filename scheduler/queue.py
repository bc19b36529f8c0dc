"""The custom scheduler's queue of pending pods, after kube-scheduler's scheduling queue.

Three places a pod waits:

* `active`: ready to be tried, in the profile's QueueSort order (PrioritySort: higher priority first, then arrival);
* `backoff`: by the time its backoff ends (1 s doubling per attempt to 10 s, `--config` can change both), first
  waiting first among equal ends (`Backoff`: a heap indexed by pod key, so a pod leaves it in O(1));
* `unschedulable`: it fits nowhere; it waits for a cluster event that can help it (a node added or changed, a pod
  deleted or finished, a pod added that its pod affinity or spread selects, a change to the pod itself) or 60 s,
  whichever comes first, then goes back through the backoff heap. Never a hot loop.

The pods whose Binding is being written wait in none of them (`binding_started`, `binding_done`), nor do gang
members that hold a reservation while they wait at Permit for the rest of their gang (`hold`, `unhold`). The queue
indexes the pending members of each gang, so that a gang's cycle takes all of them at once (`take_gang`). It is
the mirror's `PendingPods` (`mirror.py`): the mirror hands it every pod that waits for a node and tells it when the
cluster changed.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from kubegpu.core.models import PodRequest, SpreadConstraint
from kubegpu.scheduler.engine.enqueue import PrioritySort
from kubegpu.scheduler.engine.framework import QueueSortPlugin
from kubegpu.scheduler.filters import NamespaceLabels, namespace_named, pod_matches_term, selector_matches
from kubegpu.scheduler.health import Metrics
from kubegpu.scheduler.podgroups import gang_key

__all__ = ["Backoff", "Entry", "SchedulingQueue"]

INITIAL_BACKOFF, MAX_BACKOFF = 1.0, 10.0  # kube-scheduler's podInitialBackoffSeconds, podMaxBackoffSeconds
UNSCHEDULABLE_FLUSH = 60.0  # a pod unschedulable this long is tried again even if nothing changed
FLUSH_CHECK = 1.0
STALE_SLACK = 64  # heap items of pods gone from `Backoff` tolerated beyond one per waiting pod before a rebuild


@dataclass(order=True)
class Entry:
    """A pending pod as the queues hold it."""

    ready_at: float
    key: str = field(compare=False)
    request: PodRequest = field(compare=False)
    attempts: int = field(default=0, compare=False)
    message: str | None = field(default=None, compare=False)
    arrival: float = field(default_factory=time.monotonic, compare=False)
    since: float = field(default=0.0, compare=False)  # when it was last found unschedulable


def drawn_to(
    pending: PodRequest,
    added: PodRequest,
    spread_of: Callable[[PodRequest], Sequence[SpreadConstraint]] | None = None,
    namespace_labels: NamespaceLabels = namespace_named,
) -> bool:
    """Whether a pod added to a node can help `pending`: one of its pod affinity terms (required or preferred) or
    one of its `DoNotSchedule` topology spread constraints selects the added pod. `spread_of`: the constraints that
    apply to a pod (its own, or the profile's defaults for the owners that select it), asked only for a pod in the
    added pod's namespace; None: its own. A `ScheduleAnyway` constraint never refuses a node, so a pod matching it
    cannot help."""
    terms = [*pending.pod_affinity, *(term for _, term in pending.preferred_affinity)]
    if any(pod_matches_term(term, added, namespace_labels) for term in terms):
        return True
    if added.namespace != pending.namespace:
        return False
    return any(
        c.when_unsatisfiable == "DoNotSchedule" and selector_matches(c.selector, added.labels)
        for c in (spread_of(pending) if spread_of is not None else pending.spread)
    )


class Backoff:
    """The pods waiting out their backoff: a heap by the time it ends, indexed by pod key.

    A pod leaves early (bound, deleted, gone at a relist) by its key being forgotten; its heap item stays, stale, and
    is skipped when it comes to the top (lazy deletion). When stale items outnumber the waiting pods (plus
    `STALE_SLACK`) the heap is rebuilt from the waiting ones, so it holds at most about twice the pods, and adding,
    removing and taking the pods that are due cost O(log n) each, amortized: 10,000 deletions no longer rebuild the
    heap 10,000 times on the scheduling thread. Items carry a sequence number, so equal ends keep their order."""

    def __init__(self) -> None:
        # key -> its live heap item (ends, sequence, entry); an item in the heap that is not here is stale.
        self._live: dict[str, tuple[float, int, Entry]] = {}
        self._heap: list[tuple[float, int, Entry]] = []
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __iter__(self) -> Iterator[Entry]:
        """The waiting pods, in no particular order."""
        return (entry for _, _, entry in self._live.values())

    def get(self, key: str) -> Entry | None:
        item = self._live.get(key)
        return None if item is None else item[2]

    def push(self, entry: Entry) -> None:
        """The pod waits until `entry.ready_at` (in place of any wait it had)."""
        item = (entry.ready_at, next(self._sequence), entry)
        self._live[entry.key] = item
        heapq.heappush(self._heap, item)
        self._compact_if_stale()

    def remove(self, key: str) -> Entry | None:
        item = self._live.pop(key, None)
        if item is None:
            return None
        self._compact_if_stale()
        return item[2]

    def pop_due(self, now: float) -> Iterator[Entry]:
        """Take out the pods whose backoff ended by `now`, in the order it ended."""
        heap, live = self._heap, self._live
        while heap and heap[0][0] <= now:
            item = heapq.heappop(heap)
            key = item[2].key
            if live.get(key) is item:
                del live[key]
                yield item[2]

    def _compact_if_stale(self) -> None:
        if len(self._heap) > 2 * len(self._live) + STALE_SLACK:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)


class SchedulingQueue:
    """The pods that name scheduler `name` and wait for a node, taken in `sort`'s order (the profile's QueueSort
    plugin, `Engine.queue_sort`)."""

    def __init__(
        self,
        name: str,
        metrics: Metrics,
        *,
        spread_of: Callable[[PodRequest], Sequence[SpreadConstraint]] | None = None,
        sort: QueueSortPlugin | None = None,
        namespace_labels: NamespaceLabels = namespace_named,
    ) -> None:
        self.name = name
        self.metrics = metrics
        self.sort: QueueSortPlugin = sort if sort is not None else PrioritySort()
        # The spread constraints that apply to a pod (the engine's `spread_constraints`: its own or its owners'
        # defaults), for waking it when a pod they count is placed; by default the pod's own.
        self.spread_of = spread_of
        self.namespace_labels = namespace_labels  # what a pod affinity term's namespace selector reads
        self.active: dict[str, Entry] = {}
        self.backoff = Backoff()
        self.unschedulable: dict[str, Entry] = {}
        self._in_flight: dict[str, Entry] = {}  # pods whose Binding is being written
        self._held: dict[str, Entry] = {}  # gang members holding a reservation at Permit
        # gang (namespace/name) -> its members waiting in active, backoff or unschedulable, and each one's gang
        self._gangs: dict[str, dict[str, None]] = {}
        self._gang_of: dict[str, str] = {}
        self.initial_backoff, self.max_backoff = INITIAL_BACKOFF, MAX_BACKOFF
        self._last_flush = time.monotonic()

    # -- what the mirror hands over (`mirror.PendingPods`) ------------------------------------------------------------

    def observe(self, key: str, request: PodRequest, version: str, *, deleting: bool, held: bool) -> bool:
        """A pod without a node, as the informer reports it (`held`: the engine already counts it). False when the
        pod is not this scheduler's to place (it is being deleted, or names another scheduler): the mirror drops it."""
        if deleting or request.scheduler_name != self.name:
            return False
        if key in self._in_flight or held:
            return True
        known = self.active.get(key) or self.unschedulable.get(key) or self.backoff.get(key)
        if known is not None and known.request.uid != request.uid:
            # Another pod under its name (the older one deleted unseen, a relist): a new pod, whose owner has been
            # told nothing yet and whose attempts start again.
            self.drop(key)
        self._index_gang(key, request)
        entry = self.active.get(key)
        if entry is not None:
            entry.request = request
            return True
        entry = self.unschedulable.get(key)
        if entry is not None:
            changed = entry.request != request
            entry.request = request
            if changed:
                # Its owner changed it (labels, tolerations, affinity ...): it may fit now (kube-scheduler's
                # isPodUpdated), once its backoff has passed.
                self._requeue(self.unschedulable.pop(key), time.monotonic())
            return True
        waiting = self.backoff.get(key)
        if waiting is not None:
            waiting.request = request
            return True
        now = time.monotonic()
        self.active[key] = Entry(now, key, request, arrival=now)
        return True

    def binding_started(self, entry: Entry) -> None:
        """A cycle reserved a node for the pod and its Binding is being written: it waits nowhere meanwhile, and the
        informer's reports of it are the scheduler's own writes (`binding`)."""
        self._in_flight[entry.key] = entry

    def binding_done(self, key: str) -> None:
        """The pod's Binding was written or failed (a failure puts it back through `retry_later`)."""
        self._in_flight.pop(key, None)

    def binding(self, key: str) -> str | None:
        """The UID of the pod whose Binding is being written under this key (its events are our own writes)."""
        entry = self._in_flight.get(key)
        return None if entry is None else entry.request.uid

    def answers_for(self, scheduler_name: object) -> bool:
        return scheduler_name == self.name

    def drop(self, key: str) -> None:
        """The pod was bound, deleted, finished, or handed to another scheduler."""
        self.active.pop(key, None)
        self.unschedulable.pop(key, None)
        self.backoff.remove(key)
        self._held.pop(key, None)
        self._index_gang(key, None)

    # -- gangs ---------------------------------------------------------------------------------------------------

    def _index_gang(self, key: str, request: PodRequest | None) -> None:
        gang = None if request is None else gang_key(request)
        before = self._gang_of.get(key)
        if before == gang:
            return
        if before is not None:
            members = self._gangs[before]
            del members[key], self._gang_of[key]
            if not members:
                del self._gangs[before]
        if gang is not None:
            self._gangs.setdefault(gang, {})[key] = None
            self._gang_of[key] = gang

    def take_gang(self, gang: str) -> list[Entry]:
        """Take the gang's members out of the active queue, the backoff heap and the unschedulable pods, whatever
        their backoff: a gang is tried as one, when any member's turn comes."""
        taken = []
        for key in self._gangs.get(gang, ()):
            entry = self.active.pop(key, None) or self.unschedulable.pop(key, None) or self.backoff.remove(key)
            if entry is not None:
                taken.append(entry)
        return taken

    def wake_group(self, gang: str) -> None:
        """The gang's PodGroup changed: its unschedulable members are tried again once their backoff has passed."""
        now = time.monotonic()
        for key in self._gangs.get(gang, ()):
            entry = self.unschedulable.pop(key, None)
            if entry is not None:
                self._requeue(entry, now)

    def hold(self, entry: Entry) -> None:
        """The gang member holds a reservation and waits at Permit for the rest of its gang."""
        self._held[entry.key] = entry

    def unhold(self, key: str) -> Entry | None:
        """The member waits at Permit no more (approved, expired, rejected): its entry, if it was waiting."""
        return self._held.pop(key, None)

    def keep_only(self, live: set[str]) -> None:
        """After a relist: forget the waiting pods that are gone."""
        for table in (self.active, self.unschedulable, self._held):
            for key in [k for k in table if k not in live]:
                del table[key]
        for key in [entry.key for entry in self.backoff if entry.key not in live]:
            self.backoff.remove(key)
        for key in [k for k in self._gang_of if k not in live]:
            self._index_gang(key, None)

    def wake(self) -> None:
        """The cluster changed in a way that may help any pod: unschedulable pods get another try once their
        backoff has passed."""
        now = time.monotonic()
        for entry in self.unschedulable.values():
            self._requeue(entry, now)
        self.unschedulable.clear()

    def wake_pod(self, key: str) -> None:
        """Something that kept one unschedulable pod waiting is gone (its nominated node taken by a pod of higher
        priority): it gets another try once its backoff has passed."""
        entry = self.unschedulable.pop(key, None)
        if entry is not None:
            self._requeue(entry, time.monotonic())

    def wake_for(self, added: PodRequest) -> None:
        """A pod now counts on a node: the unschedulable pods whose pod affinity (or topology spread) selects it may
        fit now; no other pod can (kube-scheduler's AssignedPodAdd)."""
        if not self.unschedulable:
            return
        now = time.monotonic()
        labels = self.namespace_labels
        drawn = [
            key for key, entry in self.unschedulable.items() if drawn_to(entry.request, added, self.spread_of, labels)
        ]
        for key in drawn:
            self._requeue(self.unschedulable.pop(key), now)

    # -- what the scheduler does with it -----------------------------------------------------------------------------

    def pop_batch(self, limit: int) -> list[Entry]:
        """Up to `limit` active pods, in the QueueSort plugin's order, taken out of the active queue."""
        sort = self.sort
        if sort.arrival_order(self.active.values()):
            keys = list(itertools.islice(self.active, limit))
        else:
            keys = [entry.key for entry in heapq.nsmallest(limit, self.active.values(), key=sort.key)]
        return [self.active.pop(key) for key in keys]

    def put_back(self, entries: list[Entry]) -> None:
        """Popped pods that were not tried (the replica stopped leading mid-batch): active again, as they were."""
        for entry in entries:
            self.active.setdefault(entry.key, entry)

    def backoff_for(self, attempts: int) -> float:
        return min(self.max_backoff, self.initial_backoff * (1 << min(30, max(0, attempts - 1))))

    def retry_later(self, entry: Entry) -> None:
        """The pod's attempt failed (its cycle raised, its Binding failed): it waits out its backoff."""
        entry.attempts += 1
        entry.ready_at = time.monotonic() + self.backoff_for(entry.attempts)
        self.backoff.push(entry)

    def park(self, entry: Entry) -> None:
        """The pod fits nowhere: it waits for a cluster event that can help it, and its backoff."""
        entry.attempts += 1
        entry.since = time.monotonic()
        entry.ready_at = entry.since + self.backoff_for(entry.attempts)
        self.unschedulable[entry.key] = entry

    def wait_for_victims(self, entry: Entry) -> None:
        """The pod fits nowhere while the victims of its own preemption are still leaving: it waits like a parked
        pod, woken as they go, but this attempt does not count, so its backoff stays the first one's (a pod that
        preempted would otherwise wait 2, 4, 8 s for victims a slow API server took a moment to delete)."""
        entry.since = time.monotonic()
        entry.ready_at = entry.since + self.backoff_for(max(1, entry.attempts))
        self.unschedulable[entry.key] = entry

    def promote(self) -> None:
        """Move the pods whose backoff ended to the active queue, and the pods unschedulable for a minute back to
        the backoff heap; update the pending gauges."""
        now = time.monotonic()
        for entry in self.backoff.pop_due(now):
            self.active.setdefault(entry.key, entry)
        if now - self._last_flush >= FLUSH_CHECK:
            self._last_flush = now
            stale = [k for k, e in self.unschedulable.items() if now - e.since >= UNSCHEDULABLE_FLUSH]
            for key in stale:
                self._requeue(self.unschedulable.pop(key), now)
        self.metrics.pending.labels("active").set(len(self.active))
        self.metrics.pending.labels("backoff").set(len(self.backoff))
        self.metrics.pending.labels("unschedulable").set(len(self.unschedulable))
        self.metrics.pending.labels("permit").set(len(self._held))

    def _requeue(self, entry: Entry, now: float) -> None:
        entry.ready_at = max(now, entry.ready_at)
        self.backoff.push(entry)
