"""Neuron device topologies as pure functions over bitmasks: the catalog, the valid sets and the choice rule.

A Neuron node is a line of devices numbered 0..n-1, each with `k` NeuronCores numbered `device * k + i`, so
core `c` lives on device `c // k`. Two shapes link the devices:

* a **ring** (inf1, inf2, and every single-device type): a valid set of m devices is any m contiguous ids.
  Windows do not wrap around (11,0 is not a set): the runtime takes `AWS_NEURON_VISIBLE_DEVICES` as a
  contiguous range.
* a **torus** of rows x columns (trn1.32xlarge, trn1n.32xlarge, trn2.48xlarge, trn2u.48xlarge: 4x4): one device,
  whole rows in aligned power-of-two groups, or all devices. On 4x4 that is 1, 4 ({0-3} {4-7} {8-11} {12-15}), 8 ({0-7}
  {8-15}) or 16. Every valid set on either shape is an interval of ids, so a set is a (start, size) pair and a
  bitmask.

Cores: a request for m cores gets m contiguous core ids, and the devices those cores touch must form a valid
device set. On a ring that always holds; on a 4x4 torus with k cores per device it allows m <= k (one device)
or m between (s-2)k+2 and sk for s = 4, 8, 16 (the window starts on the block's first device and ends on its
last), i.e. 1-2, 6-8, 14-16 or 30-32 cores on trn1. One core and all cores are always valid.

The choice rule (least fragmentation). Among the free valid sets of the requested size, take the one whose
removal leaves the best *device key*, then the best *core key*, then the lowest ids:

* device key of the free devices left: on a torus, the number of fully free valid sets of each size, largest
  size first (so keeping a free 8-block beats keeping two free rows in different halves); on a ring, the
  lengths of the free runs sorted longest first. The ring key orders exactly like "free windows of each size,
  largest first": the number of free windows of size s is the sum over runs of max(0, L - s + 1), and
  comparing those counts from the largest s down compares the sorted run lengths.
* core key of the free cores left: the lengths of the free core runs, longest first.

Tuples compare lexicographically, larger is better. For a whole-device request the device key decides and the
core key only breaks ties (prefer leaving partly used devices next to free ones). For a core request the
device key comes first too, so cores go to devices already partly used before a whole free device is broken
into; then cores pack against the edge of a free run. Both choosers evaluate only candidates that can win: a
window strictly inside a free run can always slide toward the longer side without touching a new device, which
improves the keys, so only windows at run edges, or (for cores) at the bounds of the group of windows touching
the same devices, are scored.

Results are cached per (topology, cores per device, free devices, free cores, request), so the many nodes of
one instance type in one state share the work.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Literal

__all__ = [
    "CATALOG",
    "CORES_PER_DEVICE",
    "InstanceShape",
    "Topology",
    "bit_ids",
    "choose_cores",
    "choose_devices",
    "core_groups",
    "core_host",
    "core_key",
    "core_request_ranges",
    "core_request_supported",
    "cores_of_devices",
    "device_host",
    "device_key",
    "devices_of_cores",
    "fitting_sizes",
    "has_free_set",
    "interval",
    "largest_core_request",
    "largest_device_set",
    "links",
    "longest_run",
    "make_topology",
    "run_around",
    "runs",
    "valid_sets",
    "valid_sizes",
    "valid_starts",
    "window_starts",
]

TopologyKind = Literal["ring", "torus"]


# ------------------------------------------------------------------------------------------------------------
# Catalog
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceShape:
    """What an instance type has: devices, NeuronCores per device and how the devices are linked."""

    devices: int
    cores_per_device: int
    kind: TopologyKind = "ring"
    rows: int = 1
    columns: int = 0


# NeuronCores per device as the runtime numbers them. trn2 has 8 physical cores per device, shown as 4 logical
# cores with the default logical NeuronCore configuration (LNC=2): NEURON_RT_VISIBLE_CORES counts those.
CORES_PER_DEVICE: dict[str, int] = {"inf1": 4, "inf2": 2, "trn1": 2, "trn1n": 2, "trn2": 4}


def _ring(devices: int, family: str) -> InstanceShape:
    return InstanceShape(devices, CORES_PER_DEVICE[family], "ring", 1, devices)


def _torus(family: str) -> InstanceShape:
    return InstanceShape(16, CORES_PER_DEVICE[family], "torus", 4, 4)


CATALOG: dict[str, InstanceShape] = {
    "inf1.xlarge": _ring(1, "inf1"),
    "inf1.2xlarge": _ring(1, "inf1"),
    "inf1.6xlarge": _ring(4, "inf1"),
    "inf1.24xlarge": _ring(16, "inf1"),
    "inf2.xlarge": _ring(1, "inf2"),
    "inf2.8xlarge": _ring(1, "inf2"),
    "inf2.24xlarge": _ring(6, "inf2"),
    "inf2.48xlarge": _ring(12, "inf2"),
    "trn1.2xlarge": _ring(1, "trn1"),
    "trn1.32xlarge": _torus("trn1"),
    "trn1n.32xlarge": _torus("trn1n"),
    "trn2.3xlarge": _ring(1, "trn2"),
    "trn2.48xlarge": _torus("trn2"),
    "trn2u.48xlarge": _torus("trn2"),  # an UltraServer's instance: the same 4x4 torus inside (NeuronLink to the others)
}


# ------------------------------------------------------------------------------------------------------------
# Topologies and their valid sets
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Topology:
    """The shape of a node's devices; build it with `make_topology`, so equal shapes share one object."""

    kind: TopologyKind
    devices: int
    rows: int
    columns: int


@cache
def make_topology(kind: str, devices: int, rows: int = 0, columns: int = 0) -> Topology:
    """A ring of `devices`, or a rows x columns torus; a torus whose shape is not `devices` is a ring."""
    if kind == "torus" and rows > 0 and columns > 0 and rows * columns == devices:
        return Topology("torus", devices, rows, columns)
    return Topology("ring", devices, 1, devices)


@cache
def valid_sizes(topology: Topology) -> tuple[int, ...]:
    """The device counts a request may ask for, ascending."""
    n = topology.devices
    if topology.kind == "ring":
        return tuple(range(1, n + 1))
    sizes = {1, n}
    r = 1
    while topology.rows % r == 0 and r <= topology.rows:
        sizes.add(r * topology.columns)
        r *= 2
    return tuple(sorted(sizes))


@cache
def valid_starts(topology: Topology, size: int) -> tuple[int, ...]:
    """The first device id of every valid set of `size` devices, ascending (empty for an unsupported size)."""
    if size not in valid_sizes(topology):
        return ()
    if topology.kind == "ring":
        return tuple(range(topology.devices - size + 1))
    return tuple(range(0, topology.devices, size))


@cache
def valid_sets(topology: Topology, size: int) -> tuple[int, ...]:
    """Every valid set of `size` devices as a bitmask, lowest ids first."""
    return tuple(interval(start, size) for start in valid_starts(topology, size))


@cache
def links(topology: Topology) -> tuple[tuple[int, int], ...]:
    """The device pairs joined by a direct link, for pictures: ring neighbours (the last device back to the first
    on rings of three or more), and on a torus each device to its right and lower neighbour, wrapping around."""
    n = topology.devices
    if topology.kind == "ring":
        pairs = [(i, i + 1) for i in range(n - 1)]
        return tuple([*pairs, (n - 1, 0)] if n > 2 else pairs)
    rows, columns = topology.rows, topology.columns
    found: dict[frozenset[int], tuple[int, int]] = {}
    for device in range(n):
        row, column = divmod(device, columns)
        for other in (row * columns + (column + 1) % columns, ((row + 1) % rows) * columns + column):
            if other != device:
                found.setdefault(frozenset((device, other)), (device, other))
    return tuple(found.values())


def interval(start: int, size: int) -> int:
    """The bitmask of ids start..start+size-1."""
    return ((1 << size) - 1) << start


def bit_ids(mask: int) -> list[int]:
    """The ids set in a bitmask, ascending."""
    ids = []
    while mask:
        low = mask & -mask
        ids.append(low.bit_length() - 1)
        mask ^= low
    return ids


def runs(mask: int) -> list[tuple[int, int]]:
    """The maximal runs of set bits as (start, length), ascending."""
    found = []
    while mask:
        low = mask & -mask
        run = mask & ~(mask + low)
        found.append((low.bit_length() - 1, run.bit_count()))
        mask ^= run
    return found


def run_around(mask: int, position: int) -> int:
    """The length of the run of set bits that contains `position` (0 when that bit is clear)."""
    above = mask >> position
    if not above & 1:
        return 0
    up = (above ^ (above + 1)).bit_length() - 1
    gaps_below = ~mask & ((1 << position) - 1)
    return up + position - gaps_below.bit_length()


def longest_run(mask: int) -> int:
    """The length of the longest run of set bits (each pass shortens every run by one)."""
    length = 0
    while mask:
        mask &= mask >> 1
        length += 1
    return length


def window_starts(mask: int, size: int) -> int:
    """The bits c such that c..c+size-1 are all set in `mask` (log(size) shifts)."""
    starts, have = mask, 1
    while have < size:
        step = min(have, size - have)
        starts &= starts >> step
        have += step
    return starts


def devices_of_cores(cores: int, cores_per_device: int) -> int:
    """The devices that hold any of the given cores."""
    devices = 0
    for start, length in runs(cores):
        first, last = start // cores_per_device, (start + length - 1) // cores_per_device
        devices |= interval(first, last - first + 1)
    return devices


def cores_of_devices(devices: int, cores_per_device: int) -> int:
    """Every core of the given devices."""
    cores = 0
    for start, length in runs(devices):
        cores |= interval(start * cores_per_device, length * cores_per_device)
    return cores


# ------------------------------------------------------------------------------------------------------------
# Keys, largest sets, hosts
# ------------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1 << 17)
def device_key(topology: Topology, free: int) -> tuple[int, ...]:
    """How much whole-device capacity `free` keeps (larger is better); see the module docstring."""
    if topology.kind == "ring":
        return tuple(sorted((length for _, length in runs(free)), reverse=True))
    return tuple(
        sum(1 for block in valid_sets(topology, size) if free & block == block)
        for size in reversed(valid_sizes(topology))
    )


def core_key(free_cores: int) -> tuple[int, ...]:
    """The free core runs' lengths, longest first (larger is better)."""
    return tuple(sorted((length for _, length in runs(free_cores)), reverse=True))


def _cut_key(lengths: list[int], free: int, start: int, size: int) -> tuple[int, ...]:
    """`core_key(free & ~interval(start, size))`, given `lengths`, the ascending run lengths of `free`."""
    run_start = (~free & ((1 << start) - 1)).bit_length()
    above = free >> start
    length = start - run_start + (above ^ (above + 1)).bit_length() - 1
    left = start - run_start
    right = length - size - left
    cut = lengths.copy()
    del cut[bisect_left(cut, length)]
    if left:
        insort(cut, left)
    if right:
        insort(cut, right)
    cut.reverse()
    return tuple(cut)


@lru_cache(maxsize=1 << 16)
def largest_device_set(topology: Topology, free: int) -> int:
    """The largest valid whole-device request that `free` devices can serve."""
    if topology.kind == "ring":
        return longest_run(free)
    for size in reversed(valid_sizes(topology)):
        if any(free & block == block for block in valid_sets(topology, size)):
            return size
    return 0


class _LongestRuns(dict[int, tuple[int, ...]]):
    """cores per device -> the longest run of every k-bit pattern, built on first use."""

    def __missing__(self, k: int) -> tuple[int, ...]:
        table = tuple(longest_run(pattern) for pattern in range(1 << k))
        self[k] = table
        return table


_LONGEST_RUN_OF = _LongestRuns()


@lru_cache(maxsize=1 << 16)
def largest_core_request(topology: Topology, cores_per_device: int, free_cores: int) -> int:
    """The largest valid core request that `free_cores` can serve (exact)."""
    if topology.kind == "ring":
        return longest_run(free_cores)
    k = cores_per_device
    one_device = (1 << k) - 1
    best = max(_LONGEST_RUN_OF[k][free_cores >> (d * k) & one_device] for d in range(topology.devices))
    for size in valid_sizes(topology)[1:]:
        for start in valid_starts(topology, size):
            # A window touching exactly this block holds the last core of its first device, the first core of its
            # last device and every core between; the longest one is that run, clipped to the block.
            bridge_start = (start + 1) * k - 1
            bridge = interval(bridge_start, (size - 2) * k + 2)
            if free_cores & bridge == bridge:
                best = max(best, run_around(free_cores & interval(start * k, size * k), bridge_start))
    return best


def has_free_set(topology: Topology, free: int, size: int) -> bool:
    """Whether some valid set of `size` devices is all free (never for a size the topology does not take)."""
    return size > 0 and bool(fitting_sizes(topology, free) >> size & 1)


@lru_cache(maxsize=1 << 16)
def fitting_sizes(topology: Topology, free: int) -> int:
    """The sizes with a valid set all free, as a mask: bit s for a request of s devices."""
    found = 0
    for size in valid_sizes(topology):
        if topology.kind == "ring":
            if window_starts(free, size):
                found |= 1 << size
        elif any(free & block == block for block in valid_sets(topology, size)):
            found |= 1 << size
    return found


def device_host(topology: Topology, free: int, start: int) -> int:
    """The size of the largest free valid set holding device `start`: what a placement there breaks into."""
    if topology.kind == "ring":
        return run_around(free, start)
    for size in reversed(valid_sizes(topology)):
        block = interval(start - start % size, size)
        if free & block == block:
            return size
    return 0


def core_host(free_cores: int, start: int) -> int:
    """The length of the free core run holding core `start`."""
    return run_around(free_cores, start)


# ------------------------------------------------------------------------------------------------------------
# Core requests
# ------------------------------------------------------------------------------------------------------------


def _core_span(size: int, cores_per_device: int) -> tuple[int, int]:
    """The core counts whose contiguous windows can touch exactly `size` consecutive devices."""
    if size == 1:
        return 1, cores_per_device
    return (size - 2) * cores_per_device + 2, size * cores_per_device


@cache
def core_groups(topology: Topology, cores_per_device: int, count: int) -> tuple[tuple[int, int], ...]:
    """Windows of `count` cores grouped by the device set they touch: (devices, mask of the first cores)."""
    k = cores_per_device
    groups = []
    for size in valid_sizes(topology):
        low, high = _core_span(size, k)
        if not low <= count <= high:
            continue
        for start in valid_starts(topology, size):
            first, last = start * k, (start + size - 1) * k
            lo, hi = max(first, last - count + 1), min(first + k - 1, last + k - count)
            if lo <= hi:
                groups.append((interval(start, size), interval(lo, hi - lo + 1)))
    return tuple(groups)


def core_request_supported(topology: Topology, cores_per_device: int, count: int) -> bool:
    """Whether `count` cores can ever form a valid window on this topology."""
    return bool(core_groups(topology, cores_per_device, count))


@cache
def core_request_ranges(topology: Topology, cores_per_device: int) -> tuple[tuple[int, int], ...]:
    """The supported core counts as merged inclusive ranges, ascending (for the refusal sentence)."""
    spans = sorted(
        (low, min(high, topology.devices * cores_per_device))
        for low, high in (_core_span(size, cores_per_device) for size in valid_sizes(topology))
    )
    merged: list[tuple[int, int]] = []
    for low, high in spans:
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


# ------------------------------------------------------------------------------------------------------------
# The choice rule
# ------------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1 << 16)
def choose_devices(
    topology: Topology, cores_per_device: int, free_devices: int, free_cores: int, count: int
) -> int | None:
    """The valid set of `count` free devices that fragments least (a bitmask), or None when none is free."""
    if topology.kind == "ring":
        starts = []
        for run_start, length in runs(free_devices):
            if length >= count:
                starts.append(run_start)
                if length > count:
                    starts.append(run_start + length - count)
    else:
        starts = [
            start
            for start, block in zip(valid_starts(topology, count), valid_sets(topology, count), strict=True)
            if free_devices & block == block
        ]
    if not starts:
        return None
    k = cores_per_device
    lengths = sorted(length for _, length in runs(free_cores))
    best_start = -1
    best_key: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    for start in starts:
        key = (
            device_key(topology, free_devices & ~interval(start, count)),
            _cut_key(lengths, free_cores, start * k, count * k),
        )
        if best_key is None or key > best_key:
            best_start, best_key = start, key
    return interval(best_start, count)


@lru_cache(maxsize=1 << 16)
def choose_cores(
    topology: Topology, cores_per_device: int, free_devices: int, free_cores: int, count: int
) -> int | None:
    """The valid window of `count` free cores that fragments least (a bitmask), or None when none is free."""
    starts = window_starts(free_cores, count)
    if not starts:
        return None
    lengths = sorted(length for _, length in runs(free_cores))
    best_start = -1
    best_key: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    for devices, span in core_groups(topology, cores_per_device, count):
        group_starts = starts & span
        if not group_starts:
            continue
        devices_left = device_key(topology, free_devices & ~devices)
        if best_key is not None and devices_left < best_key[0]:
            continue
        # Each run of free starts is one free core run; only its two ends can win (module docstring).
        for first, length in runs(group_starts):
            for start in (first, first + length - 1) if length > 1 else (first,):
                key = (devices_left, _cut_key(lengths, free_cores, start, count))
                if best_key is None or key > best_key or (key == best_key and start < best_start):
                    best_start, best_key = start, key
    return None if best_key is None else interval(best_start, count)
