"""The scheduling queue held against a plain model of it, and its cost when many pods leave it.

`Model` is the queue as a reader of `kubegpu.scheduler.queue` would describe it, with lists and no heap: pods tried
by priority then arrival (in the order they became active when no pod has a priority), a pod whose attempt failed
waiting out its backoff (1 s doubling to 10 s), the pods whose backoff ended becoming active in the order it ended
(first waiting first among equal ends), an unschedulable pod back after a wake, a change to it, or a minute. Random
sequences of what the mirror and the scheduler do must leave the queue where the model says, and pop pods in the
model's order. The clock is the queue's `time.monotonic`, moved by the test.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kubegpu.core.models import PodRequest
from kubegpu.scheduler import queue
from kubegpu.scheduler.health import Metrics
from kubegpu.scheduler.queue import SchedulingQueue

NAMES = [f"p{i}" for i in range(8)]


def request(name: str, priority: int, version: int = 0) -> PodRequest:
    return PodRequest(
        namespace="default",
        name=name,
        uid=f"uid-{name}",
        containers=(),
        labels={"version": str(version)},
        scheduler_name="kubegpu",
        priority=priority,
    )


class Model:
    """The queue's contract, written the slow and obvious way."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.active: list[str] = []  # in the order the pods became active
        self.backoff: list[tuple[float, int, str]] = []  # (when its backoff ends, when it started waiting, key)
        self.unschedulable: dict[str, float] = {}  # key -> when it was found unschedulable
        self.priority: dict[str, int] = {}
        self.arrival: dict[str, float] = {}
        self.attempts: dict[str, int] = {}
        self.ready_at: dict[str, float] = {}
        self.version: dict[str, int] = {}
        self.pushes = 0
        self.last_flush = now

    def known(self) -> set[str]:
        return {*self.active, *(key for _, _, key in self.backoff), *self.unschedulable}

    def add(self, key: str, priority: int) -> None:
        self.active.append(key)
        self.priority[key], self.arrival[key], self.attempts[key] = priority, self.now, 0
        self.ready_at[key], self.version[key] = self.now, 0

    def pop(self, limit: int) -> list[str]:
        order = self.active
        if any(self.priority[key] for key in self.active):
            order = sorted(self.active, key=lambda k: (-self.priority[k], self.arrival[k]))
        batch = order[:limit]
        self.active = [key for key in self.active if key not in batch]
        return batch

    def backoff_for(self, attempts: int) -> float:
        return min(queue.MAX_BACKOFF, queue.INITIAL_BACKOFF * 2.0 ** (attempts - 1))

    def push(self, key: str) -> None:
        self.pushes += 1
        self.backoff.append((self.ready_at[key], self.pushes, key))

    def retry_later(self, key: str) -> None:
        self.attempts[key] += 1
        self.ready_at[key] = self.now + self.backoff_for(self.attempts[key])
        self.push(key)

    def park(self, key: str) -> None:
        self.attempts[key] += 1
        self.unschedulable[key] = self.now
        self.ready_at[key] = self.now + self.backoff_for(self.attempts[key])

    def requeue(self, key: str) -> None:
        del self.unschedulable[key]
        self.ready_at[key] = max(self.now, self.ready_at[key])
        self.push(key)

    def forget(self, key: str) -> None:
        if key in self.active:
            self.active.remove(key)
        self.backoff = [item for item in self.backoff if item[2] != key]
        self.unschedulable.pop(key, None)

    def promote(self) -> None:
        due = sorted(item for item in self.backoff if item[0] <= self.now)
        self.backoff = [item for item in self.backoff if item[0] > self.now]
        self.active += [key for _, _, key in due if key not in self.active]
        if self.now - self.last_flush >= queue.FLUSH_CHECK:
            self.last_flush = self.now
            for key in [k for k, since in self.unschedulable.items() if self.now - since >= queue.UNSCHEDULABLE_FLUSH]:
                self.requeue(key)


class QueueAgainstModel(RuleBasedStateMachine):
    clock: list[float]

    @initialize()
    def start(self) -> None:
        self.clock = [1000.0]
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(time, "monotonic", lambda: self.clock[0])  # the queue's clock (`queue.time` is this module)
        self.queue = SchedulingQueue("kubegpu", Metrics())
        self.model = Model(self.clock[0])

    def teardown(self) -> None:
        if hasattr(self, "patch"):
            self.patch.undo()

    def observe(self, name: str) -> None:
        key = f"default/{name}"
        kept = self.queue.observe(
            key,
            request(name, self.model.priority[key], self.model.version[key]),
            "1",
            deleting=False,
            held=False,
        )
        assert kept

    @rule(name=st.sampled_from(NAMES), priority=st.sampled_from([0, 0, 0, 5, 10]))
    def a_pod_arrives_or_is_seen_again(self, name: str, priority: int) -> None:
        key = f"default/{name}"
        if key not in self.model.known():
            self.model.add(key, priority)
        self.observe(name)

    @rule(data=st.data(), limit=st.integers(1, 4))
    def the_scheduler_takes_a_batch(self, data: st.DataObject, limit: int) -> None:
        batch = self.queue.pop_batch(limit)
        assert [entry.key for entry in batch] == self.model.pop(limit)
        for entry in batch:
            fate = data.draw(st.sampled_from(["retry", "park", "bound"]))
            if fate == "retry":
                self.queue.retry_later(entry)
                self.model.retry_later(entry.key)
            elif fate == "park":
                self.queue.park(entry)
                self.model.park(entry.key)
            else:
                self.queue.drop(entry.key)

    @rule(name=st.sampled_from(NAMES))
    def a_pod_leaves(self, name: str) -> None:
        key = f"default/{name}"
        self.queue.drop(key)
        self.model.forget(key)

    @rule(step=st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 11.0, 61.0]))
    def time_passes(self, step: float) -> None:
        self.clock[0] += step
        self.model.now = self.clock[0]
        self.queue.promote()
        self.model.promote()

    @rule()
    def the_cluster_changes(self) -> None:
        self.queue.wake()
        for key in list(self.model.unschedulable):
            self.model.requeue(key)

    @rule(data=st.data())
    def an_unschedulable_pod_is_changed(self, data: st.DataObject) -> None:
        if not self.model.unschedulable:
            return
        key = data.draw(st.sampled_from(sorted(self.model.unschedulable)))
        self.model.version[key] += 1
        self.observe(key.split("/", 1)[1])
        self.model.requeue(key)

    @rule(live=st.sets(st.sampled_from(NAMES)))
    def a_relist_finds_only(self, live: set[str]) -> None:
        keys = {f"default/{name}" for name in live}
        self.queue.keep_only(keys)
        for key in self.model.known() - keys:
            self.model.forget(key)

    @invariant()
    def every_pod_waits_where_the_model_says(self) -> None:
        if not hasattr(self, "model"):
            return
        assert list(self.queue.active) == self.model.active
        assert sorted(entry.key for entry in self.queue.backoff) == sorted(key for _, _, key in self.model.backoff)
        assert list(self.queue.unschedulable) == list(self.model.unschedulable)
        assert len(self.queue.backoff) == len(self.model.backoff)


QueueAgainstModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestQueueAgainstModel = QueueAgainstModel.TestCase


@pytest.mark.parametrize("place", ["backoff", "unschedulable", "active"])
def test_ten_thousand_pods_leave_the_queue_in_a_fraction_of_a_second(place: str) -> None:
    # A Deployment scaled down, a namespace deleted: every pod's deletion reaches the queue on the scheduling thread,
    # which schedules nobody meanwhile. Removal must not cost in proportion to the pods still waiting.
    waiting = SchedulingQueue("kubegpu", Metrics())
    keys = [f"default/p{i}" for i in range(10_000)]
    for i, key in enumerate(keys):
        waiting.observe(key, request(f"p{i}", 0), "1", deleting=False, held=False)
    for entry in waiting.pop_batch(len(keys)) if place != "active" else []:
        (waiting.retry_later if place == "backoff" else waiting.park)(entry)
    started = time.process_time()
    for key in keys:
        waiting.drop(key)
    elapsed = time.process_time() - started
    assert len(waiting.active) + len(waiting.backoff) + len(waiting.unschedulable) == 0
    assert elapsed < 0.5, f"dropping 10,000 pods from {place} took {elapsed:.2f} s"
