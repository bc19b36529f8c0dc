"""kube-scheduler's PreEnqueue and QueueSort plugins, as objects of `framework.py`'s shapes, by name.

* SchedulingGates (PreEnqueue): a pod with `spec.schedulingGates` waits outside the queue, tried by no cycle, until
  an update removes its last gate (`kubegpu.scheduler.gates` has the words and why).
* PrioritySort (QueueSort): higher `spec.priority` first, then the pod that entered the queue first.

A profile (`scores.Profile`) names them as kube-scheduler does: `pre_enqueue_off` turns SchedulingGates off (a
gated pod is then tried, and a 1.26+ API server refuses its Binding, as it does behind kube-scheduler), and
`queue_sort` names the one QueueSort plugin. The engine builds them once (`EngineState`); the front-ends ask
`Engine.pre_enqueue` and hand `Engine.queue_sort` to their queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kubegpu.core.models import PodRequest
from kubegpu.core.status import Status
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine.framework import PreEnqueuePlugin, QueuedPod, QueueSortPlugin
from kubegpu.scheduler.gates import gated_reason


class SchedulingGates:
    """A gated pod is not queued: "SchedulingGated: waiting for scheduling gates: [a b]" (names bounded, escaped)."""

    name = scores.SCHEDULING_GATES

    def pre_enqueue(self, pod: PodRequest) -> Status | None:
        gates = pod.scheduling_gates
        return None if not gates else Status.unresolvable(gated_reason(gates), plugin=self.name)


class PrioritySort:
    """Higher priority first, then earlier arrival (kube-scheduler's PrioritySort `Less`)."""

    name = scores.PRIORITY_SORT

    def key(self, queued: QueuedPod) -> tuple[int, float]:
        return -queued.request.priority, queued.arrival

    def arrival_order(self, queued: Iterable[QueuedPod]) -> bool:
        return not any(entry.request.priority for entry in queued)


PRE_ENQUEUE: tuple[PreEnqueuePlugin, ...] = (SchedulingGates(),)
QUEUE_SORTS: dict[str, QueueSortPlugin] = {scores.PRIORITY_SORT: PrioritySort()}


def enabled_pre_enqueue(added: Sequence[PreEnqueuePlugin], off: frozenset[str]) -> tuple[PreEnqueuePlugin, ...]:
    """The built-in PreEnqueue plugins, then `added`, less those the profile turns off; a name used twice is an
    error (a profile could not tell them apart)."""
    names = [plugin.name for plugin in (*PRE_ENQUEUE, *added)]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ValueError(f"two PreEnqueue plugins named {name!r}")
    return tuple(plugin for plugin in (*PRE_ENQUEUE, *added) if plugin.name not in off)


def queue_sort(name: str) -> QueueSortPlugin:
    """The QueueSort plugin a profile names."""
    plugin = QUEUE_SORTS.get(name)
    if plugin is None:
        raise ValueError(f"unknown queue sort plugin {name!r} (known: {', '.join(QUEUE_SORTS)})")
    return plugin
