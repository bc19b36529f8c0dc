"""A capacity index: nodes bucketed by how much of a resource they can still offer one container.

The engine keeps one `CapacityIndex` per resource (each plugin-owned device resource, plus `cpu`). Finding the nodes
that could take a request of `n` is a bisect into the sorted bucket keys, not a scan of every node, so a decision stays
fast at thousands of nodes. Iterating upward from `n` visits the tightest nodes first (binpack); downward from the
largest visits the emptiest first (spread).

Within a bucket, nodes are grouped by their equivalence class (nodes alike in all but name), so the engine can pass
over a whole class at once once one of its nodes has answered that a request can never fit there.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

__all__ = ["CapacityIndex"]


class CapacityIndex:
    __slots__ = ("_buckets", "_keys", "_where")

    def __init__(self) -> None:
        self._buckets: dict[int, dict[int, dict[str, None]]] = {}
        self._keys: list[int] = []
        self._where: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, node: str) -> bool:
        return node in self._where

    def get(self, node: str) -> int | None:
        where = self._where.get(node)
        return where[0] if where is not None else None

    def set(self, node: str, free: int, group: int = 0) -> None:
        old = self._where.get(node)
        if old == (free, group):
            return
        if old is not None:
            self._drop(node, *old)
        bucket = self._buckets.get(free)
        if bucket is None:
            bucket = self._buckets[free] = {}
            insort(self._keys, free)
        members = bucket.get(group)
        if members is None:
            members = bucket[group] = {}
        members[node] = None
        self._where[node] = (free, group)

    def discard(self, node: str) -> None:
        old = self._where.pop(node, None)
        if old is not None:
            self._drop(node, *old)

    def _drop(self, node: str, key: int, group: int) -> None:
        bucket = self._buckets[key]
        members = bucket[group]
        del members[node]
        if not members:
            del bucket[group]
            if not bucket:
                del self._buckets[key]
                del self._keys[bisect_left(self._keys, key)]

    def groups_at_least(self, amount: int, *, ascending: bool = True) -> Iterator[tuple[int, dict[str, None]]]:
        """(group, nodes) for nodes offering at least `amount`, tightest first (emptiest first when not ascending).

        The caller must not change the index while it iterates (the engine filters first and reserves after).
        """
        start = bisect_left(self._keys, amount)
        keys = self._keys[start:] if ascending else reversed(self._keys[start:])
        for key in keys:
            yield from self._buckets[key].items()

    def at_least(self, amount: int, *, ascending: bool = True) -> Iterator[str]:
        """Nodes offering at least `amount`, in the same order as `groups_at_least`."""
        for _, members in self.groups_at_least(amount, ascending=ascending):
            yield from members

    def count_at_least(self, amount: int) -> int:
        start = bisect_left(self._keys, amount)
        return sum(len(members) for key in self._keys[start:] for members in self._buckets[key].values())
