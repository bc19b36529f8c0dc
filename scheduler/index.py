"""A capacity index: nodes bucketed by how much of a resource they can still offer one container.

The engine keeps one `CapacityIndex` per resource (each plugin-owned device resource, plus `cpu`). Finding the nodes
that could take a request of `n` is a bisect into the sorted bucket keys, not a scan of every node, so a decision stays
fast at thousands of nodes. Iterating upward from `n` visits the tightest nodes first (binpack); downward from the
largest visits the emptiest first (spread).

Within a bucket, nodes are grouped by their equivalence class (nodes alike in all but name), so the engine can pass
over a whole class at once once one of its nodes has answered that a request can never fit there.

A `NodeTree` keeps the other order kube-scheduler reads nodes in: zone by zone in turn (its node tree), the order
its sample of feasible nodes is taken from when a cluster is larger than the sample (`Engine.schedule`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping

__all__ = ["CapacityIndex", "NodeTree", "zone_key"]


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

    def least(self) -> int | None:
        """The smallest amount any node offers (None: no node)."""
        return self._keys[0] if self._keys else None

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


ZONE_LABELS = ("failure-domain.beta.kubernetes.io/zone", "topology.kubernetes.io/zone")  # first found wins
REGION_LABELS = ("failure-domain.beta.kubernetes.io/region", "topology.kubernetes.io/region")


def zone_key(labels: Mapping[str, str]) -> str:
    """The node's zone as kube-scheduler 1.20 groups nodes (`GetZoneKey`): region and zone, the beta labels before
    the stable ones; "" for a node with neither."""
    zone = next((labels[key] for key in ZONE_LABELS if key in labels), "")
    region = next((labels[key] for key in REGION_LABELS if key in labels), "")
    return f"{region}:\x00:{zone}" if region or zone else ""


class NodeTree:
    """Node names by zone, listed zone by zone in turn: the first node of each zone, then the second of each, and so
    on (kube-scheduler's node tree). Zones keep the order they first appeared in, nodes the order they joined their
    zone; a node that moves to another zone joins it last."""

    __slots__ = ("_order", "_where", "_zones")

    def __init__(self) -> None:
        self._zones: dict[str, list[str]] = {}
        self._where: dict[str, str] = {}
        self._order: list[str] | None = []

    def __len__(self) -> int:
        return len(self._where)

    def set(self, node: str, zone: str) -> None:
        old = self._where.get(node)
        if old == zone:
            return
        if old is not None:
            self.discard(node)
        self._zones.setdefault(zone, []).append(node)
        self._where[node] = zone
        self._order = None

    def discard(self, node: str) -> None:
        zone = self._where.pop(node, None)
        if zone is None:
            return
        members = self._zones[zone]
        members.remove(node)
        if not members:
            del self._zones[zone]
        self._order = None

    def order(self) -> list[str]:
        """Every node, zone by zone in turn. Made again only after a node joined, left or changed zone; the caller
        must not change the list."""
        if self._order is None:
            order: list[str] = []
            zones = list(self._zones.values())
            depth = max(map(len, zones), default=0)
            for position in range(depth):
                order.extend(members[position] for members in zones if position < len(members))
            self._order = order
        return self._order
