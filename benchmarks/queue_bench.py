"""Benchmark: pods leaving the custom scheduler's queue, with its backoff heap as it was and as it is.

Every pod deletion (a Deployment scaled down, a namespace deleted, pods bound by another scheduler) reaches
`SchedulingQueue.drop` on the scheduling thread, which places nobody meanwhile; every informer event about a waiting
pod reaches `observe`. Both used to walk the backoff heap: `drop` rebuilt it for each removal, `observe` searched it.
`ListBackoff` below is that store (a list kept as a heap); `kubegpu.scheduler.queue.Backoff` is the store indexed by
pod key with lazy deletion. For each size, N pods wait out their backoff, each is seen again once (an informer
update) and then all are dropped, one by one, in random order; the same sizes run with either store side by side.
The old store is measured up to `--old-up-to` pods (it grows quadratically: 10,000 deletions take seconds).

    .venv/bin/python benchmarks/queue_bench.py [--sizes 5000,10000,20000,50000] [--old-up-to 10000]
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from collections.abc import Iterator

from kubegpu.core.models import PodRequest
from kubegpu.scheduler.health import Metrics
from kubegpu.scheduler.queue import Backoff, Entry, SchedulingQueue


class ListBackoff:
    """The backoff store before `Backoff`: a list kept as a heap, searched and rebuilt to remove one pod."""

    def __init__(self) -> None:
        self.heap: list[Entry] = []

    def __len__(self) -> int:
        return len(self.heap)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.heap)

    def get(self, key: str) -> Entry | None:
        return next((entry for entry in self.heap if entry.key == key), None)

    def push(self, entry: Entry) -> None:
        heapq.heappush(self.heap, entry)

    def remove(self, key: str) -> Entry | None:
        found = self.get(key)
        if found is not None:
            self.heap = [entry for entry in self.heap if entry.key != key]
            heapq.heapify(self.heap)
        return found

    def pop_due(self, now: float) -> Iterator[Entry]:
        while self.heap and self.heap[0].ready_at <= now:
            yield heapq.heappop(self.heap)


def pod(i: int) -> PodRequest:
    return PodRequest(namespace="bench", name=f"p{i}", uid=f"u{i}", containers=(), scheduler_name="kubegpu")


def run(pods: int, store: Backoff | ListBackoff) -> tuple[float, float]:
    """Seconds to see every waiting pod again once, and to drop them all (process time)."""
    queue = SchedulingQueue("kubegpu", Metrics())
    queue.backoff = store  # type: ignore[assignment]
    requests = [pod(i) for i in range(pods)]
    for request in requests:
        queue.observe(request.key, request, "1", deleting=False, held=False)
    for entry in queue.pop_batch(pods):
        queue.retry_later(entry)
    order = list(requests)
    random.Random(pods).shuffle(order)
    started = time.process_time()
    for request in order:
        queue.observe(request.key, request, "2", deleting=False, held=False)
    observed = time.process_time() - started
    started = time.process_time()
    for request in order:
        queue.drop(request.key)
    dropped = time.process_time() - started
    assert not len(queue.backoff)
    return observed, dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="5000,10000,20000,50000")
    parser.add_argument("--old-up-to", type=int, default=10_000)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"{'pods':>7}  {'drop old':>9}  {'drop new':>9}  {'ratio':>7}  {'seen old':>9}  {'seen new':>9}  new us/drop")
    per_pod: dict[int, float] = {}
    for size in sizes:
        seen_new, drop_new = run(size, Backoff())
        old = run(size, ListBackoff()) if size <= args.old_up_to else None
        drop_old = f"{old[1]:8.3f}s" if old else f"{'-':>9}"
        seen_old = f"{old[0]:8.3f}s" if old else f"{'-':>9}"
        ratio = f"{old[1] / max(drop_new, 1e-9):6.0f}x" if old else f"{'-':>7}"
        per_pod[size] = drop_new / size
        micros = per_pod[size] * 1e6
        print(f"{size:>7}  {drop_old}  {drop_new:8.3f}s  {ratio}  {seen_old}  {seen_new:8.3f}s  {micros:8.2f}")
    small, large = sizes[0], sizes[-1]
    if large > small:
        print(
            f"new: time per drop at {large} pods / at {small}: {per_pod[large] / max(per_pod[small], 1e-12):.1f}x "
            f"(linear removal: 1x; one pass over the waiting pods per removal, as before: {large / small:.0f}x)"
        )


if __name__ == "__main__":
    main()
