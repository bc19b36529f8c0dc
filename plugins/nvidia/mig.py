"""MIG for the nvidia plugin: which slices each profile may take, and how a node's MIG devices are laid out.

A MIG-enabled A100, A30, H100 or H200 is cut into GPU instances. NVML places them in *slots* (memory slices: eight,
four on the A30; the seventh compute slice has no slot of its own): a profile takes `size` consecutive slots and may
start only at the slots its placement table lists. From NVIDIA's Multi-Instance GPU User Guide, "Supported MIG
Profiles" (the placements `nvidia-smi mig -lgipp` prints as `{starts}:size`), for the A100-SXM4-40GB:

    1g.5gb   {0,1,2,3,4,5,6}:1   1g.5gb+me {0..6}:1 (one per GPU)   1g.10gb {0,2,4,6}:2
    2g.10gb  {0,2,4}:2           3g.20gb   {0,4}:4                  4g.20gb {0}:4         7g.40gb {0}:8

and with the same placements, under the names of 80 GB, for the A100-SXM4-80GB and the H100 80GB (SXM5 and PCIe):
1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb; the H100 NVL (94 GB: 1g.12gb, 1g.12gb+me,
1g.24gb, 2g.24gb, 3g.47gb, 4g.47gb, 7g.94gb), the H100 96 GB of the GH200 (the same but 3g.48gb, 4g.48gb, 7g.96gb)
and the H200 141 GB (1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb) have the same placements too.
The A30 24 GB has four slots: 1g.6gb and 1g.6gb+me {0,1,2,3}:1, 2g.12gb and 2g.12gb+me {0,2}:2, 4g.24gb {0}:4.
So an 80 GB GPU with 1g.10gb at slots 4, 5 and 6 has three slots free but no start for a 3g.40gb (it starts at 0 or 4
only), and one 1g.10gb at slot 0 leaves room for a 3g.40gb at 4 but none for a 4g.40gb.

**Static layouts.** kubegpu does not partition GPUs: it schedules the MIG devices a node has, as NVIDIA's device plugin
advertises them under GPU Feature Discovery's *mixed* strategy (`nvidia.com/mig.strategy: mixed`): one resource per
profile, `nvidia.com/mig-3g.40gb: 2` (a `+me` profile's `+` written `.`: `nvidia.com/mig-1g.10gb.me`), with GFD's
labels `nvidia.com/mig-<profile>.count` and the layout chosen by the operator (`nvidia.com/mig.config`, applied by
NVIDIA's MIG manager). That is what a production user of the mixed strategy has: reconfiguring MIG needs the GPU
idle, so a layout is a node's configuration, not a per-pod decision. A node's layout comes from the advertised
inventory (`kubegpu advertise`: each MIG-enabled GPU's attribute `mig` lists its instances as `profile@start`, read
from NVML) or, from labels alone, is laid out here from GFD's counts
(`layout_from_counts`: the same number of MIG devices, legally placed; which GPU holds which is then nominal, as the
kubelet's device manager picks the device anyway). Every layout is checked against the placement table; a GPU whose
layout breaks it (an illegal start, overlapping instances) has no MIG devices in kubegpu's books.

A MIG-enabled GPU is never given out whole or shared: a container asking `nvidia.com/gpu` gets one of the node's
other GPUs. Among free devices of the asked profile, the one on the GPU with the fewest free slots is taken (ties:
lowest GPU, lowest start), so other GPUs keep their free devices together, and a GPU emptied of pods can be laid out
anew. A refusal names the MIG GPU with the most free slices: which are free, and whether the profile has a start
position among them at all (`GPU 0 has 2 free slices (0,3) but no start position for 3g.40gb`) or only the layout is
in the way.

Everything here is pure: GPUs are positions, a layout is a tuple of (profile, start) per GPU.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubegpu.core.models import DeviceInventory
from kubegpu.plugins.nvidia.sharing import CORES, MEMORY_PERCENT

__all__ = [
    "CATALOG",
    "LAYOUT_ATTRIBUTE",
    "MIG_PREFIX",
    "MIG_RESOURCES",
    "SLOTS",
    "STRATEGY_LABEL",
    "Instance",
    "LayoutError",
    "MigBooks",
    "Profile",
    "books_from_inventory",
    "books_from_labels",
    "check_layout",
    "choose",
    "family_of",
    "format_layout",
    "free_slots",
    "layout_from_counts",
    "pack",
    "parse_layout",
    "profile_of",
    "replicas",
    "resource_of",
    "shortage",
    "slots_of",
    "whole_gpus",
]

MIG_PREFIX = "nvidia.com/mig-"
STRATEGY_LABEL = "nvidia.com/mig.strategy"
LAYOUT_ATTRIBUTE = "mig"  # an inventory GPU's MIG instances, "3g.40gb@0,2g.20gb@4,1g.10gb@6"
SLOTS = 8
MAX_LAYOUT_CHARS = 256  # a layout of at most 7 instances is far shorter; anything longer is not read
MIB = 1024 * 1024
MAX_MIG_GPUS = 64
_INSTANCE = re.compile(r"([1-7]g\.[0-9]{1,3}gb(?:\+me)?)@([0-7])")


log = logging.getLogger(__name__)


class LayoutError(ValueError):
    """A MIG layout that breaks the placement rules; the message names the instance and the rule."""


@dataclass(frozen=True, slots=True)
class Profile:
    """A MIG profile: its name (`3g.40gb`), the slots it takes and the slots it may start at; `media` marks the
    `+me` profiles, of which a GPU holds at most one."""

    name: str
    size: int
    starts: tuple[int, ...]
    media: bool = False


def slots_of(table: Mapping[str, Profile]) -> int:
    """The memory slices of a GPU with this placement table: 8 (A100, H100, H200), 4 (A30)."""
    return max(start + profile.size for profile in table.values() for start in profile.starts)


def _table(*rows: tuple[str, int, Iterable[int]]) -> dict[str, Profile]:
    return {name: Profile(name, size, tuple(starts), name.endswith("+me")) for name, size, starts in rows}


_ONE = range(7)
CATALOG: dict[str, dict[str, Profile]] = {
    # NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles" (placements as `nvidia-smi mig -lgipp` prints
    # them). Every GPU of eight memory slices shares the A100's shape under names of its own memory; the A30 has four.
    # Checked for the Hoppers: the guide's H100 and H200 tables give each profile the A100 80GB's fraction of memory
    # and number of instances (1g 7 of 1/8, 1g.2x 4 of 1/4, 2g 3, 3g 2 of 4/8, 4g 1, 7g 1), which eight slices allow
    # only with these starts; `nvidia-smi mig -lgipp` on an H100 80GB and an H100 NVL prints the A100's placements
    # ({0..6}:1 twice, {0,2,4,6}:2, {0,2,4}:2, {0,4}:4, {0}:4, {0}:8). test_nvidia_mig.py holds the counts.
    "A100-40GB": _table(
        ("1g.5gb", 1, _ONE),
        ("1g.5gb+me", 1, _ONE),
        ("1g.10gb", 2, (0, 2, 4, 6)),
        ("2g.10gb", 2, (0, 2, 4)),
        ("3g.20gb", 4, (0, 4)),
        ("4g.20gb", 4, (0,)),
        ("7g.40gb", 8, (0,)),
    ),
    "80GB": _table(  # A100-SXM4-80GB, A100-PCIE-80GB, H100 80GB (SXM5 and PCIe)
        ("1g.10gb", 1, _ONE),
        ("1g.10gb+me", 1, _ONE),
        ("1g.20gb", 2, (0, 2, 4, 6)),
        ("2g.20gb", 2, (0, 2, 4)),
        ("3g.40gb", 4, (0, 4)),
        ("4g.40gb", 4, (0,)),
        ("7g.80gb", 8, (0,)),
    ),
    "A30-24GB": _table(  # four slices: the +me profiles share one set of media engines (at most one per GPU)
        ("1g.6gb", 1, (0, 1, 2, 3)),
        ("1g.6gb+me", 1, (0, 1, 2, 3)),
        ("2g.12gb", 2, (0, 2)),
        ("2g.12gb+me", 2, (0, 2)),
        ("4g.24gb", 4, (0,)),
    ),
    "H100-94GB": _table(  # H100 NVL
        ("1g.12gb", 1, _ONE),
        ("1g.12gb+me", 1, _ONE),
        ("1g.24gb", 2, (0, 2, 4, 6)),
        ("2g.24gb", 2, (0, 2, 4)),
        ("3g.47gb", 4, (0, 4)),
        ("4g.47gb", 4, (0,)),
        ("7g.94gb", 8, (0,)),
    ),
    "H100-96GB": _table(  # H100 96GB of the GH200 Grace Hopper Superchip
        ("1g.12gb", 1, _ONE),
        ("1g.12gb+me", 1, _ONE),
        ("1g.24gb", 2, (0, 2, 4, 6)),
        ("2g.24gb", 2, (0, 2, 4)),
        ("3g.48gb", 4, (0, 4)),
        ("4g.48gb", 4, (0,)),
        ("7g.96gb", 8, (0,)),
    ),
    "H200-141GB": _table(  # H200 SXM and H200 NVL
        ("1g.18gb", 1, _ONE),
        ("1g.18gb+me", 1, _ONE),
        ("1g.35gb", 2, (0, 2, 4, 6)),
        ("2g.35gb", 2, (0, 2, 4)),
        ("3g.71gb", 4, (0, 4)),
        ("4g.71gb", 4, (0,)),
        ("7g.141gb", 8, (0,)),
    ),
}
# The H100 variants by the memory in their name or as NVML reports it (MiB): the 94 GB NVL reports about 95,830, the
# 96 GB of a GH200 about 97,900. A GH200 of 144 GB HBM3e has profiles of its own, not in the catalog.
HOPPER_MEMORY = (
    ("80GB", "80GB", 70 * 1024, 82 * 1024),
    ("H100-94GB", "94GB", 90 * 1024, 96_500),
    ("H100-96GB", "96GB", 96_500, 100 * 1024),
)


def resource_of(profile: str) -> str:
    """The resource of a MIG profile as NVIDIA's device plugin advertises it (and GFD labels it): `nvidia.com/mig-`
    and the profile, its `+` written `.`, since a resource name (a qualified name) has no `+`: `1g.10gb+me` is
    `nvidia.com/mig-1g.10gb.me`. Under `nvidia.com/mig-1g.10gb+me` the API server refused the node's labels and
    capacity (so the advertiser's whole patch) and every pod asking it; a kubelet checks device plugins' names alike."""
    return MIG_PREFIX + profile.replace("+", ".")


# The memory (MiB, as NVML and GFD report it) of each table's GPUs, low (exclusive) to high: a GPU of a model the
# catalog does not name is matched by its profile names and then by this.
MEMORY_MIB = {
    "A100-40GB": (32 * 1024, 48 * 1024),
    "80GB": (70 * 1024, 82 * 1024),
    "A30-24GB": (16 * 1024, 32 * 1024),
    "H100-94GB": (90 * 1024, 96_500),
    "H100-96GB": (96_500, 100 * 1024),
    "H200-141GB": (130 * 1024, 150 * 1024),
}
MIG_RESOURCES = tuple(sorted({resource_of(name) for table in CATALOG.values() for name in table}))


@dataclass(frozen=True, slots=True)
class Instance:
    """One MIG device: its GPU (position in the node's GPU order), profile and start slot."""

    gpu: int
    profile: str
    start: int


def profile_of(resource: str) -> str | None:
    """`3g.40gb` for `nvidia.com/mig-3g.40gb`, `1g.10gb+me` for `nvidia.com/mig-1g.10gb.me` (`resource_of`), None
    for any other resource."""
    if not resource.startswith(MIG_PREFIX):
        return None
    name = resource[len(MIG_PREFIX) :]
    return name[: -len(".me")] + "+me" if name.endswith(".me") else name


def family_of(model: str | None, memory_mib: int | None, profiles: Iterable[str] = ()) -> str | None:
    """The placement table for a GPU: by model (`NVIDIA-A100-SXM4-80GB`, `NVIDIA H100 80GB HBM3`) and memory,
    else by the profile names a node lists (each table's names are its own). None when neither tells."""
    key = (model or "").upper()
    if "A100" in key:
        big = "80GB" in key or (memory_mib is not None and memory_mib > 48 * 1024)
        return "80GB" if big else "A100-40GB"
    if "A30" in key:
        return "A30-24GB"
    if "GH200" in key:  # its Hopper GPU: 96 GB HBM3 (the H100 96 GB tables) or 144 GB HBM3e (not in the catalog)
        big = "144G" in key or (memory_mib is not None and memory_mib > 100 * 1024)
        return None if big else "H100-96GB"
    if "H200" in key:
        return "H200-141GB"
    if "H100" in key:  # 80 GB (SXM5, PCIe), 94 GB (NVL), 96 GB (GH200)
        for family, size, low, high in HOPPER_MEMORY:
            if size in key or (memory_mib is not None and low < memory_mib <= high):
                return family
    names = set(profiles)
    # By the names, as a GPU the catalog does not name (an H800, an A800) lists them; `1g.10gb` is a name of the
    # A100 40GB (two slices) and of the 80 GB GPUs (one): the GPU's memory picks among the tables that have them.
    having = [family for family, table in CATALOG.items() if names and names <= table.keys()]
    fitting = [f for f in having if memory_mib is not None and MEMORY_MIB[f][0] < memory_mib <= MEMORY_MIB[f][1]]
    return next(iter(fitting or having), None)


def parse_layout(text: str) -> tuple[tuple[str, int], ...]:
    """`"3g.40gb@0,2g.20gb@4"` as ((profile, start), ...); raises `LayoutError` naming what is malformed."""
    if len(text) > MAX_LAYOUT_CHARS:
        raise LayoutError(f"a MIG layout of {len(text)} characters (at most {MAX_LAYOUT_CHARS})")
    found = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = _INSTANCE.fullmatch(part)
        if match is None:
            raise LayoutError(f"{part[:40]!r} is not a MIG instance (write profile@start: 3g.40gb@4)")
        found.append((match.group(1), int(match.group(2))))
    return tuple(found)


def format_layout(layout: Sequence[tuple[str, int]]) -> str:
    return ",".join(f"{profile}@{start}" for profile, start in layout)


def check_layout(table: Mapping[str, Profile], layout: Sequence[tuple[str, int]]) -> None:
    """Raise `LayoutError` unless every instance is a profile of the table at one of its starts, no two overlap,
    and at most one is a `+me` profile."""
    used = 0
    media = 0
    for name, start in layout:
        profile = table.get(name)
        if profile is None:
            raise LayoutError(f"{name} is not a MIG profile of this GPU (it has {', '.join(table)})")
        if start not in profile.starts:
            starts = ", ".join(map(str, profile.starts))
            raise LayoutError(f"{name} cannot start at slice {start} (it starts at {starts})")
        mask = ((1 << profile.size) - 1) << start
        if used & mask:
            raise LayoutError(f"{name}@{start} overlaps another instance")
        used |= mask
        media += profile.media
    if media > 1:
        raise LayoutError("more than one +me instance on one GPU (a GPU has one set of media engines)")


def most_instances(table: Mapping[str, Profile]) -> int:
    """The most MIG devices one GPU of this table holds: seven of eight slots (1g profiles start at 0-6 only), four
    on the A30. One-slot instances take a slot each, at their starts; any other takes two slots at least."""
    slots = slots_of(table)
    ones = len({start for profile in table.values() if profile.size == 1 for start in profile.starts})
    return max(k + (slots - k) // 2 for k in range(min(ones, slots) + 1))


def fewest_gpus(table: Mapping[str, Profile], counts: Mapping[str, int]) -> int:
    """A bound under the GPUs that hold `counts` MIG devices: by their number (`most_instances` a GPU) and by their
    slots (`slots_of` a GPU). Laying out fewer GPUs is never tried: each failed try costs a search per instance."""
    number = sum(counts.values())
    slots = sum((table[name].size if name in table else 1) * count for name, count in counts.items())
    return max(-(-number // most_instances(table)), -(-slots // slots_of(table)))


def free_slots(table: Mapping[str, Profile], layout: Sequence[tuple[str, int]]) -> int:
    """The slots of a (legal) layout that no instance takes."""
    used = sum(((1 << table[name].size) - 1) << start for name, start in layout)
    return slots_of(table) - used.bit_count()


def pack(table: Mapping[str, Profile], names: Sequence[str]) -> tuple[tuple[str, int], ...] | None:
    """A legal layout of one GPU holding the profiles `names`, or None when they cannot all be placed.

    Largest first, each at its lowest start that still lets the rest fit (a small search: at most seven instances
    over eight slots). For two 1g.10gb, a 2g.20gb and a 3g.40gb it finds 3g.40gb@4, 2g.20gb@0 and 1g.10gb@2 and @3.
    Instances of one profile are interchangeable, so each takes a start after the one before it: eight 1g.10gb on a
    GPU of seven starts fail at once rather than after every order of the first seven (5,040)."""
    order = sorted(names, key=lambda n: (-table[n].size, -len(table[n].starts), n))

    def place(i: int, used: int, after: int) -> list[tuple[str, int]] | None:
        if i == len(order):
            return []
        profile = table[order[i]]
        for start in profile.starts:
            mask = ((1 << profile.size) - 1) << start
            if start > after and not used & mask:
                same = i + 1 < len(order) and order[i + 1] == order[i]
                rest = place(i + 1, used | mask, start if same else -1)
                if rest is not None:
                    return [(profile.name, start), *rest]
        return None

    if sum(table[n].size for n in names) > slots_of(table) or sum(table[n].media for n in names) > 1:
        return None
    found = place(0, 0, -1)
    return None if found is None else tuple(sorted(found, key=lambda item: item[1]))


def layout_from_counts(
    table: Mapping[str, Profile], gpus: int, counts: Mapping[str, int]
) -> tuple[tuple[tuple[str, int], ...], ...]:
    """A legal layout of `gpus` GPUs holding `counts` MIG devices of each profile (GFD's `.count` labels).

    Instances go largest first, each to the GPU with the most free slots that can still hold it (ties: the lowest
    GPU), as a uniform configuration (`all-balanced`, `all-1g.10gb`) lays them out; raises `LayoutError` when the
    counts cannot be placed on that many GPUs."""
    wanted: list[str] = []
    for name in counts:
        if name not in table:
            raise LayoutError(f"{name} is not a MIG profile of this GPU (it has {', '.join(table)})")
    if fewest_gpus(table, counts) > gpus:  # more than that many GPUs ever hold: said at once
        raise LayoutError(f"{gpus} GPU(s) cannot hold the node's MIG devices ({format_counts(counts)})")
    for name, count in sorted(counts.items()):
        wanted.extend([name] * count)
    wanted.sort(key=lambda n: (-table[n].size, n))
    per_gpu: list[list[str]] = [[] for _ in range(gpus)]
    layouts: list[tuple[tuple[str, int], ...]] = [() for _ in range(gpus)]
    for name in wanted:
        room = sorted(range(gpus), key=lambda g: (-free_slots(table, layouts[g]), g))
        for gpu in room:
            trial = pack(table, [*per_gpu[gpu], name])
            if trial is not None:
                per_gpu[gpu].append(name)
                layouts[gpu] = trial
                break
        else:
            raise LayoutError(f"{gpus} GPU(s) cannot hold the node's MIG devices ({format_counts(counts)})")
    return tuple(layouts)


def format_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{count} {name}" for name, count in sorted(counts.items()) if count)


def choose(
    table_of: Sequence[Mapping[str, Profile] | None],
    layouts: Sequence[Sequence[tuple[str, int]]],
    free: Iterable[Instance],
    profile: str,
    count: int,
) -> list[Instance] | None:
    """`count` free devices of `profile`, each from the GPU with the fewest free slots (ties: lowest GPU, lowest
    start), or None when there are fewer. `free` lists the node's free MIG devices; a GPU's free slots count the
    slots its free devices take (what another pod could still get there)."""
    candidates = [i for i in free if i.profile == profile]
    if len(candidates) < count:
        return None
    room: dict[int, int] = {}
    for instance in free:
        table = table_of[instance.gpu]
        if table is not None:
            room[instance.gpu] = room.get(instance.gpu, 0) + table[instance.profile].size
    candidates.sort(key=lambda i: (room.get(i.gpu, 0), i.gpu, i.start))
    return candidates[:count]


def shortage(
    ids: Sequence[str],
    table_of: Sequence[Mapping[str, Profile] | None],
    layouts: Sequence[Sequence[tuple[str, int]]],
    free: Iterable[Instance],
    profile: str,
    count: int,
) -> str:
    """Why no `count` devices of `profile` are free, on the MIG GPU with the most free slices: which slices are
    free, and whether the profile has a start position in them at all (if it has, only the node's layout is in
    the way)."""
    instances = list(free)
    have = sum(1 for i in instances if i.profile == profile)
    if have:
        return f"{have} free {profile} MIG device(s), the pod asks {count}"
    free_set = {(i.gpu, i.profile, i.start) for i in instances}
    best: tuple[int, int, int] | None = None  # (free slices, -GPU, free mask)
    for gpu, table in enumerate(table_of):
        if table is None:
            continue
        held = sum(
            ((1 << table[name].size) - 1) << start for name, start in layouts[gpu] if (gpu, name, start) not in free_set
        )
        mask = ((1 << slots_of(table)) - 1) & ~held
        if best is None or (mask.bit_count(), -gpu) > best[:2]:
            best = (mask.bit_count(), -gpu, mask)
    if best is None or not best[0]:
        return f"no MIG slice is free; the pod asks {count} {profile}"
    slots, gpu, mask = best[0], -best[1], best[2]
    table = table_of[gpu]
    wanted = table.get(profile) if table is not None else None
    if wanted is None:
        return f"GPU {ids[gpu]} has no {profile} MIG profile"
    listed = ",".join(str(slot) for slot in range(SLOTS) if mask >> slot & 1)  # the mask holds the GPU's slices only
    fits = any(not ((((1 << wanted.size) - 1) << start) & ~mask) for start in wanted.starts)
    if not fits:
        return f"GPU {ids[gpu]} has {slots} free slices ({listed}) but no start position for {profile}"
    return (
        f"GPU {ids[gpu]} has free slices {listed}, room for {profile}, but its MIG layout cuts them into other "
        f"profiles (the node's nvidia.com/mig.config decides the layout)"
    )


# ---------------------------------------------------------------------------------------------------------------
# The books: one node's MIG devices and who holds each
# ---------------------------------------------------------------------------------------------------------------


class MigBooks:
    """The MIG devices of one node's MIG-enabled GPUs (`ids`, each with its placement table and legal layout) and
    the pod holding each. A device's id in allocations is `<GPU id>@<start slice>`: `"4@0"` is GPU 4's instance
    starting at slice 0; its resource names its profile."""

    def __init__(
        self,
        ids: Sequence[str],
        tables: Sequence[Mapping[str, Profile] | None],
        layouts: Sequence[Sequence[tuple[str, int]]],
        nominal: bool = False,
    ) -> None:
        self.ids = tuple(ids)
        # Laid out from GFD's counts (`books_from_labels`): a device id names one device of its profile, not a slice
        # (the kubelet picks which), and a change of the counts lays the node out anew under the pods holding them.
        self.nominal = nominal
        self.tables = tuple(tables)
        self.layouts = tuple(tuple(layout) for layout in layouts)
        self.devices: dict[str, Instance] = {}
        for gpu, layout in enumerate(self.layouts):
            for profile, start in layout:
                self.devices[f"{self.ids[gpu]}@{start}"] = Instance(gpu, profile, start)
        self.holders: dict[str, str] = {}
        self.profiles = frozenset(i.profile for i in self.devices.values())
        tables_by_value = tuple(None if table is None else tuple(sorted(table.items())) for table in self.tables)
        self._layout = (self.ids, tables_by_value, self.layouts)  # fixed for the books' life

    def content(self) -> tuple[object, ...]:
        """What deciding on these books reads of them, by value (`NvidiaNodeState.scoring_content`): the GPUs, their
        placement tables and layouts, and which devices are held (not by whom). Made anew at each call: the holders
        change in place (`NvidiaNodeState.take`), and the engine asks once per node version."""
        return (self._layout, frozenset(self.holders))

    def device_id(self, instance: Instance) -> str:
        return f"{self.ids[instance.gpu]}@{instance.start}"

    def free(self) -> list[Instance]:
        return [i for device, i in self.devices.items() if device not in self.holders]

    def free_counts(self) -> dict[str, int]:
        """Free devices per resource, every profile the node has listed (0 when none is free)."""
        counts = dict.fromkeys((resource_of(p) for p in self.profiles), 0)
        for instance in self.free():
            counts[resource_of(instance.profile)] += 1
        return counts

    def plan(self, wanted: Sequence[tuple[str, str, int]]) -> list[tuple[str, str, list[str]]] | None:
        """(container, resource, device ids) for each (container, profile, count) asked, or None when the free
        devices do not suffice; containers choose in order, each from what the previous ones left."""
        free = self.free()
        chosen: list[tuple[str, str, list[str]]] = []
        for container, profile, count in wanted:
            picked = choose(self.tables, self.layouts, free, profile, count)
            if picked is None:
                return None
            taken = set(picked)
            free = [i for i in free if i not in taken]
            chosen.append((container, resource_of(profile), [self.device_id(i) for i in picked]))
        return chosen

    def refusal(self, wanted: Sequence[tuple[str, str, int]]) -> tuple[bool, str] | None:
        """(whether it can never fit here, why) for the first ask the free devices cannot serve; None when all fit."""
        free = self.free()
        for _, profile, count in wanted:
            total = sum(1 for i in self.devices.values() if i.profile == profile)
            if total < count:
                if not total:
                    return True, f"Insufficient {resource_of(profile)}"
                return True, f"node(s) have {total} {profile} MIG device(s), the pod asks {count}"
            picked = choose(self.tables, self.layouts, free, profile, count)
            if picked is None:
                return False, shortage(self.ids, self.tables, self.layouts, free, profile, count)
            taken = set(picked)
            free = [i for i in free if i not in taken]
        return None

    def read(self, containers: Mapping[str, Mapping[str, Sequence[str]]]) -> list[str] | str:
        """The device ids an allocation's MIG resources name, or why they cannot be read on this node (an unknown
        device, one of another profile, one named twice)."""
        found: list[str] = []
        for container, resources in containers.items():
            for resource, devices in resources.items():
                profile = profile_of(resource)
                for device in devices:
                    instance = self.devices.get(device)
                    if self.nominal and (instance is None or instance.profile != profile or device in self.holders):
                        device = self._stand_in(device, profile, found)
                        instance = self.devices.get(device)
                    if instance is None:
                        return f"container {container}: MIG device {device[:40]!r} does not exist on this node"
                    if instance.profile != profile:
                        return f"container {container}: MIG device {device} is a {instance.profile}, not {profile}"
                    if device in found:
                        return f"MIG device {device} appears twice in the allocation"
                    found.append(device)
        return found

    def _stand_in(self, device: str, profile: str | None, found: Sequence[str]) -> str:
        """On nominal books, the device of `profile` that a held id stands for once the counts were laid out anew:
        the first free one the allocation does not name yet, else (more held than listed) the first held one, which
        `NvidiaNodeState.cannot_take` then refuses; `device` itself where the node lists none of the profile."""
        same = [d for d, i in self.devices.items() if i.profile == profile and d not in found]
        free = [d for d in same if d not in self.holders]
        return (free or same or [device])[0]


def books_from_inventory(node: str, inventory: DeviceInventory) -> tuple[DeviceInventory, MigBooks | None]:
    """The inventory without its MIG-enabled GPUs (those with a `mig` attribute), and the books of those.

    A GPU whose layout breaks the placement rules, whose model has no placement table, or that is unhealthy keeps
    none of its MIG devices in the books (logged); it is never given out whole either."""
    plain = [d for d in inventory.devices if LAYOUT_ATTRIBUTE not in d.attributes]
    enabled = [d for d in inventory.devices if LAYOUT_ATTRIBUTE in d.attributes]
    if not enabled:
        return inventory, None
    tables: list[Mapping[str, Profile] | None] = []
    layouts: list[tuple[tuple[str, int], ...]] = []
    for device in enabled:
        layout: tuple[tuple[str, int], ...] = ()
        text = str(device.attributes[LAYOUT_ATTRIBUTE])
        try:
            found = parse_layout(text)
            family = family_of(device.model, device.memory // MIB if device.memory else None, (p for p, _ in found))
            if family is None:
                raise LayoutError(f"no MIG placement table for a {str(device.model)[:64]!r}")
            check_layout(CATALOG[family], found)
            layout = found if device.healthy else ()
        except LayoutError as exc:
            log.warning("node %s: GPU %s has no usable MIG devices: %s", node, device.id[:40], exc)
            family = None
        tables.append(CATALOG[family] if family else None)
        layouts.append(layout)
    books = MigBooks([d.id for d in enabled], tables, layouts)
    return inventory.model_copy(update={"devices": plain}), books


def books_from_labels(node: str, labels: Mapping[str, str], allocatable: Mapping[str, int]) -> MigBooks | None:
    """The books of a node that GPU Feature Discovery labels under the mixed strategy: `nvidia.com/mig-<profile>`
    counts from allocatable (what the kubelet admits), else from the `.count` labels; the MIG-enabled GPUs are
    `nvidia.com/gpu.count` less the whole GPUs the device plugin advertises (GFD counts every GPU, the device plugin
    advertises only whole ones), named after the whole ones (nominal: the kubelet picks the device). None without MIG.

    A device plugin that shares devices (time-slicing, MPS) advertises each one `replicas` times, and GFD says how
    many in `<resource>.replicas`: allocatable is divided by it, so that a shared GPU counts once (each MIG device
    is then booked to one pod at a time, fewer than the kubelet would admit, never more)."""
    if not any(key.startswith(MIG_PREFIX) for key in (*allocatable, *labels)):
        return None  # every node the scheduler adds passes here: most have no MIG device, found without 35 lookups
    counts: dict[str, int] = {}
    for resource in MIG_RESOURCES:
        amount = allocatable.get(resource)
        if amount is not None:
            amount //= replicas(labels, resource)
        else:
            amount = _count(labels.get(f"{resource}.count"))
        if amount:
            counts[profile_of(resource) or resource] = amount
    if not counts:
        return None
    memory = _count(labels.get("nvidia.com/gpu.memory"))
    family = family_of(labels.get("nvidia.com/gpu.product"), memory, counts)
    if family is None:
        log.warning("node %s: MIG profiles %s fit no placement table", node, format_counts(counts)[:200])
        return None
    table = CATALOG[family]
    whole = whole_gpus(labels, allocatable) or 0
    gpus = (_count(labels.get("nvidia.com/gpu.count")) or 0) - whole
    tries = [gpus] if gpus > 0 else range(max(1, fewest_gpus(table, counts)), MAX_MIG_GPUS + 1)
    for n in tries:
        if n > MAX_MIG_GPUS:
            break
        try:
            layouts = layout_from_counts(table, n, counts)
        except LayoutError:
            continue
        return MigBooks([str(whole + i) for i in range(n)], [table] * n, layouts, nominal=True)
    log.warning("node %s: its MIG devices (%s) fit no layout of its GPUs", node, format_counts(counts)[:200])
    return None


def whole_gpus(labels: Mapping[str, str], allocatable: Mapping[str, int]) -> int | None:
    """The GPUs a node's device plugin offers whole (those not MIG-enabled), from its allocatable: `nvidia.com/gpu`
    over GFD's replicas, and on a node that lists GPU shares (kubegpu's advertiser on a node enforcing them), at most
    `nvidia.com/gpucores` (or `gpumem-percentage`) over 100: there `nvidia.com/gpu` counts share slots, each GPU its
    split count of times. None where the node does not list `nvidia.com/gpu`."""
    offered = allocatable.get("nvidia.com/gpu")
    if offered is None:
        return None
    whole = offered // replicas(labels, "nvidia.com/gpu")
    percent = allocatable.get(CORES) or allocatable.get(MEMORY_PERCENT)
    return min(whole, percent // 100) if percent else whole


def replicas(labels: Mapping[str, str], resource: str) -> int:
    """How many times the device plugin advertises each device of `resource`: GFD's `<resource>.replicas` label
    (`nvidia.com/gpu.replicas`) under a sharing strategy, 1 without one (or with a malformed label)."""
    return _count(labels.get(f"{resource}.replicas")) or 1


def _count(value: str | None) -> int | None:
    text = (value or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) < 7 else None
