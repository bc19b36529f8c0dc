"""The plugin kit: base classes that carry the bookkeeping every whole-device plugin used to copy.

Most accelerator families hand out whole devices: one device to one container (GPUs, FPGA cards, ASICs). Their
plugins differ only in where the devices of a node come from and which free devices a container should get; the rest
(free, healthy and holder bitmaps, take, release, headroom, describe, parsing the request once, refusing with
kube-scheduler's wording) is the same. `WholeDevicePlugin` (scheduler side) and `DeviceFilesPlugin` (node side) do
that part, so a plugin writes

* `WholeDevicePlugin`: `resources`, `devices(node)` (the node's devices, or None) and, when devices are not
  interchangeable, `choose(state, free, count, request)` (a bitmask of `count` devices from `free`, or None). Optional:
  `read(pod)` (the plugin's own part of the request, e.g. an annotation; raise `Refused` for a malformed one),
  `eligible(state, request)` (the devices this request may use, or the reason none qualify), `score(...)`,
  `fields(...)`, `largest(state, free)`, `fits(state, free, count)` (whether `count` devices of `free` form a
  valid set, for the fragmentation measure) and `picture(state)`;
* `DeviceFilesPlugin`: `resource`, `pattern` (the device file names under `/dev`) and `env`; optional `cdi_kind`,
  `model`, `count_label`.

Both are plain classes whose hook methods carry the `hookimpl` markers; register an instance
(`[project.entry-points."kubegpu.scheduler"] acme = "kubegpu_acme.scheduler:plugin"`). The plugin manager tells the
instance its entry-point name (`bind_plugin_name`), which is the name of its allocations and inventories.

State is bitmasks: device i of a node (in the order `devices` lists them) is bit i of `healthy` and `free`; `holders[i]`
is the pod holding it (`WholeDeviceNodeState`). Devices that may also be shared, each share taking an amount of every
dimension (compute, memory) up to the device's capacity and at most `split` shares per device, keep
`SharedDeviceNodeState` (`cannot_share`, `share`, `unshare`); devices made of parts a pod may hold one by one
(Neuron's cores) keep `PartedDeviceNodeState`. Every answer is deterministic: ties go to the lowest device.

A plugin that decides in hooks of its own (its topology, its shares, its refusals) subclasses `DevicePlugin`, the
base of `WholeDevicePlugin` too: it implements the hooks that only keep books (`take`, `release`, `headroom`,
`describe`), reading an allocation once into a `Claim` (`claimed`), which the state checks (`cannot_take`), records
(`take`) and gives back idempotently (`give_back`). The built-in plugins are written that way: `NvidiaPlugin` on
`SharedDeviceNodeState` (GPUs, shares of compute and memory; MIG devices in books of its own beside them),
`NeuronPlugin` on `PartedDeviceNodeState` (devices of NeuronCores), `IntelGasPlugin` on `SharedDeviceNodeState`
(every `gpu.intel.com/*` resource a dimension of each card).

Expected fragmentation (`kubegpu_scheduler_fragmentation`, the engine's KubegpuFragmentation score) comes with the
kit: the states of one engine learn how often each request size comes (`SizeMix`), and a placement is measured by
how much more likely it makes the node turn away the next request of that mix (`turned_away`,
`fragmentation_growth`). docs/hooks.md says why that measure and what it does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

from kubegpu.core import device_hooks, scheduler_hooks
from kubegpu.core.limits import bounded_count, check_device_count
from kubegpu.core.models import (
    Advertisement,
    ContainerAllocation,
    ContainerEdit,
    DeviceCell,
    DeviceInfo,
    DeviceInventory,
    DeviceNode,
    DeviceOwnership,
    NodeInfo,
    Occupancy,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom
from kubegpu.core.status import Status

__all__ = [
    "MIX_DRIFT",
    "MIX_KEY",
    "Claim",
    "DeviceFilesPlugin",
    "DevicePlugin",
    "DeviceShare",
    "PartedDeviceNodeState",
    "Refused",
    "SharedDeviceNodeState",
    "SizeMix",
    "WholeDeviceNodeState",
    "WholeDevicePlugin",
    "WholeDevicePodState",
    "WholeDeviceState",
    "WholeRequest",
    "bit_indices",
    "fragmentation_growth",
    "label_devices",
    "lowest_bits",
    "turned_away",
    "turned_away_growth",
]


class Refused(ValueError):
    """Raised by `WholeDevicePlugin.read` for a request that can never be scheduled; the message says what to change."""


def lowest_bits(free: int, count: int) -> int | None:
    """The `count` lowest set bits of `free` as a mask, or None when fewer are set."""
    if free.bit_count() < count:
        return None
    bits = 0
    for _ in range(count):
        low = free & -free
        bits |= low
        free ^= low
    return bits


def bit_indices(bits: int) -> list[int]:
    """The positions of the set bits, lowest first."""
    return [i for i in range(bits.bit_length()) if bits >> i & 1]


# ---------------------------------------------------------------------------------------------------------------
# Expected fragmentation of whole devices
# ---------------------------------------------------------------------------------------------------------------

MIX_KEY = "kit.size-mix"  # in the engine's `shared` dict of a plugin: the `SizeMix` its states learn together
# How far an engine's learned mix moves before the measure follows it (`SizeMix.drift`), when every node's
# fragmentation answers are asked again: at 2 % benchmarks/placement_bench.py places the same pods as when every pod
# republishes, and a 300-node Neuron replay takes 0.68x the engine time per pod.
MIX_DRIFT = 0.02
MAX_SIZES = 64  # request sizes a `SizeMix` keeps: its memory and the cost of the measure stay bounded
# How many of the mix's mean requests one request turned away weighs in the engine's fragmentation score: twice
# (measured with the neuron plugin on benchmarks/placement_bench.py: 1x places as many pods with departures but
# fewer in the static mixes, 175 against 177; 3x no more).
TURNED_AWAY_WEIGHT = 2.0
_RESCALE = 1e100  # where `SizeMix` brings its growing weights back down
# `SizeMix._slack`'s allowances for floating point: per addition, as a share of the total (each rounds each weight
# and the total by under 1.2e-16 of it), and for the distance `_moved` computes (under 64 + 64 terms, each off by
# under 2.3e-16), so that a skipped computation could never have published.
_ROUNDING = 1e-15
_MARGIN = 1e-12


class SizeMix:
    """How often each size of whole-device request comes: the mix the fragmentation measure expects.

    Learned from the containers the engine's states take, each counting `1 + 1/memory` times the one before, so a
    container `memory` placements old counts 1/e of a new one and the mix follows the recent workload (the FGD
    paper takes its mix from the cluster's recent history). One per engine and plugin (in the engine's `shared`
    dict), so two engines in one process learn apart. Past `most` sizes, a new size pushes out the rarest.

    `mix()` and `mean()` answer from the mix last published, which `add` replaces once the learned one has moved
    more than `drift` away from it (total variation distance: half the summed differences of the probabilities);
    `version` counts the publications. The engine remembers each node's fragmentation answers until its plugins'
    `version` moves (`kubegpu_scheduler_fragmentation_epoch`), so a drift above 0 spares it rescoring every node
    after every pod once the mix has settled, while the first pods, each of which moves the mix a lot, still
    publish at once. `drift` 0 publishes every change.
    """

    def __init__(self, memory: float = 1000.0, most: int = MAX_SIZES, drift: float = 0.0) -> None:
        self.growth = 1.0 + 1.0 / memory
        self.most = most
        self.drift = drift
        self.weights: dict[int, float] = {}
        self.total = 0.0
        self.version = 0
        self._next = 1.0
        self._mix: tuple[tuple[int, float], ...] = ()
        self._published: dict[int, float] = {}  # `_mix` as a dict, for `_moved`
        self._mean = 0.0
        # An upper bound of `total` times `_moved()`, kept as containers come, so that `add` computes the distance
        # only once the bound may pass `drift` (a settled mix: about one add in 20 of a mix of sizes, never while
        # every container asks the one size published). Taking `n` more of a size the published mix gives `q`
        # moves the summed differences by at most `2n(1 - q)`: the bound grows by `n(1 - q)`, and by
        # `_ROUNDING x total` for the additions' rounding. Set from the distance at each computation and at each
        # publication; unknown (infinite) after a size is pushed out or the weights are scaled down.
        self._slack = math.inf

    def add(self, size: int) -> None:
        """Count one container of `size` devices (sizes below 1 are not requests and are ignored)."""
        if size < 1:
            return
        if size not in self.weights and len(self.weights) >= self.most:
            rarest = min(self.weights, key=self.weights.__getitem__)
            self.total -= self.weights.pop(rarest)
            self._slack = math.inf
        added = self._next
        self.weights[size] = self.weights.get(size, 0.0) + added
        total = self.total = self.total + added
        self._slack += added * (1.0 - self._published.get(size, 0.0)) + _ROUNDING * total
        self._next *= self.growth
        if self._next > _RESCALE:  # only ratios matter: scale every weight down alike
            for known in self.weights:
                self.weights[known] /= _RESCALE
            self.total /= _RESCALE
            self._next /= _RESCALE
            self._slack = math.inf
        if not self._mix or self.drift <= 0:
            self._publish()
        elif self._slack >= (self.drift - _MARGIN) * self.total:  # else the distance is surely within `drift`
            moved = self._moved()
            if moved > self.drift:
                self._publish()
            else:
                self._slack = (moved + _MARGIN) * self.total

    def mix(self) -> tuple[tuple[int, float], ...]:
        """(size, probability) of each size in the published mix, by size; empty before any container."""
        return self._mix

    def mean(self) -> float:
        """The mean request of the published mix, in devices (0 before any container)."""
        return self._mean

    def _moved(self) -> float:
        """The total variation distance between the learned mix and the published one."""
        total, published = self.total, self._published
        moved = math.fsum(abs(weight / total - published.get(size, 0.0)) for size, weight in self.weights.items())
        gone = math.fsum(p for size, p in self._mix if size not in self.weights)  # sizes pushed out since
        return (moved + gone) / 2

    def _publish(self) -> None:
        total = self.total
        self._mix = tuple((size, weight / total) for size, weight in sorted(self.weights.items())) if total else ()
        self._published = dict(self._mix)
        self._mean = math.fsum(size * p for size, p in self._mix)
        self._slack = _MARGIN * total  # the probabilities' rounding
        self.version += 1


def turned_away(free: int, mix: Sequence[tuple[int, float]], fits: Callable[[int, int], bool]) -> float:
    """The chance that the next container, its size drawn from `mix`, finds no valid set of that size among the free
    devices `free` (`fits(free, size)` says whether it does): the sum of the probabilities of the sizes that do not
    fit. 0 on an empty node that takes every size; 1 on a full one."""
    return math.fsum(p for size, p in mix if not fits(free, size))


def turned_away_growth(
    before: int, after: int, mix: Sequence[tuple[int, float]], fits: Callable[[int, int], bool]
) -> float:
    """How much more likely the next container is turned away once only `after` of the free devices `before` are
    left: `turned_away(after) - turned_away(before)`, the probabilities of the sizes that fit before and no longer
    do. Never negative: taking devices never makes a size fit that did not."""
    return math.fsum(p for size, p in mix if fits(before, size) and not fits(after, size))


def fragmentation_growth(
    before: int, after: int, mix: SizeMix, fits: Callable[[int, int], bool], weight: float = TURNED_AWAY_WEIGHT
) -> float:
    """What leaving `after` of the free devices `before` costs the coming pods, in devices, as the engine's
    KubegpuFragmentation score reads it: `turned_away_growth` times `weight` of the mix's mean request. 0 before
    the mix knows any pod."""
    return turned_away_growth(before, after, mix.mix(), fits) * weight * mix.mean()


# ---------------------------------------------------------------------------------------------------------------
# Scheduler side
# ---------------------------------------------------------------------------------------------------------------


class WholeDeviceNodeState(DeviceNodeState):
    """One node's whole devices: bit i of `healthy` and `free` stands for `ids[i]`; `holders[i]` holds it.

    The books every whole-device plugin keeps, for the kit's own hooks and for a plugin that decides in hooks of its
    own (the built-ins): `read_whole` reads the devices an allocation names, `cannot_hold` says why a pod may not
    take them, `hold` and `unhold` change the books. `extra` is the plugin's own per-node information (a topology,
    a loaded bitstream), from `devices(node)`. `version` grows on every take and release (the hooks bump it); it
    keys the per-request placement kept in `_placed`. `mix` is the mix of request sizes the engine's states of this
    plugin learn together (a state built alone learns alone). `ids` and `healthy` stand for `devices` where a plugin
    keeps no `DeviceInfo` per device (nvidia's GPUs from labels). `noun` names a device in reasons.
    """

    noun = "device"

    def __init__(
        self,
        plugin: str,
        node: str,
        devices: Sequence[DeviceInfo],
        extra: Any = None,
        mix: SizeMix | None = None,
        *,
        ids: Sequence[str] | None = None,
        healthy: Sequence[bool] | None = None,
    ) -> None:
        super().__init__(node)
        self.plugin = plugin
        self.devices = tuple(devices)
        self.ids = tuple(ids) if ids is not None else tuple(d.id for d in self.devices)
        flags = healthy if healthy is not None else [d.healthy for d in self.devices]
        self.index = {device: i for i, device in enumerate(self.ids)}
        self.healthy = sum(1 << i for i, ok in enumerate(flags) if ok)
        self.free = self.healthy
        self.holders: list[str | None] = [None] * len(self.ids)
        self.extra = extra
        self.mix = mix if mix is not None else SizeMix()
        self.version = 0
        self._placed: tuple[int, WholeDevicePodState, tuple[int, ...] | None] | None = None
        self._fixed_content: tuple[object, ...] | None = None  # `scoring_content`'s part that never changes

    def ids_of(self, mask: int) -> list[str]:
        return [self.ids[i] for i in bit_indices(mask)]

    def scoring_content(self) -> tuple[object, ...]:
        """What the engine's local scores read of this state (`Scoring.scoring_content`), so that nodes alike share
        one computation of their scores: the kit's hooks and a plugin's `eligible`, `choose`, `score` and `fits`
        read the devices (`ids`, `devices`, `extra`), the `healthy` and `free` bits and the learned mix, whose
        `version` stands for it (one mix per engine and plugin; the version grows with every publication). A
        plugin whose methods read more of the state (its node's name, its holders) overrides this. Devices or
        `extra` that cannot be hashed make the state itself the content: such a node is scored alone. Not
        remembered: the engine keeps it per node version; the devices' part, which never changes, per state."""
        fixed = self._fixed_content
        if fixed is None:
            # Each device's fields, its attributes (a dict) as sorted pairs: a DeviceInfo itself cannot be hashed.
            devices = tuple(
                tuple((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in device)
                for device in self.devices
            )
            fixed = (self.plugin, self.ids, devices, self.extra)
            try:
                hash(fixed)
            except TypeError:
                fixed = (self,)
            self._fixed_content = fixed
        if fixed[0] is self:
            return fixed
        return (*fixed, self.healthy, self.free, self.mix.version)

    def read_whole(
        self, allocation: PluginAllocation, owns: Callable[[str], bool] | Collection[str]
    ) -> tuple[list[int], str | None]:
        """The device positions an allocation names, or why it cannot be read on this node (a decoded annotation
        may hold anything): shares, another plugin's resource (`owns`), an unknown id, an id named twice."""
        owned = owns if callable(owns) else owns.__contains__
        if allocation.shares:
            return [], f"{self.plugin} devices are whole devices; the allocation must not carry shares"
        bits: list[int] = []
        for container, resources in allocation.containers.items():
            for resource, ids in resources.items():
                if not owned(resource):
                    return [], f"container {container}: resource {resource} is not scheduled by plugin {self.plugin}"
                for device in ids:
                    i = self.index.get(device)
                    if i is None:
                        return [], f"device {device} does not exist on this node"
                    if i in bits:
                        return [], f"device {device} appears twice in the allocation"
                    bits.append(i)
        return bits, None

    def cannot_hold(self, bits: Iterable[int]) -> str | None:
        """Why a pod may not hold the devices `bits` whole (another pod holds one), or None. An unhealthy device is
        never allocated (it is not free), but a pod that already holds one keeps it: the engine re-takes running
        pods when a node's inventory changes, and refusing would free their other devices."""
        for i in bits:
            if self.lacks(i):
                return f"device {i} does not exist on this node"
            if self.holders[i] is not None:
                return f"device {self.ids[i]} is already held by {self.holders[i]}"
        return None

    def lacks(self, i: int) -> bool:
        """Whether the node has no device of bit i (an allocation read from a stale or hand-written record may name
        one past the last, or below 0, which a list index would wrap to the last)."""
        return not 0 <= i < len(self.holders)

    def hold(self, bits: Iterable[int], pod_key: str) -> None:
        """Record `pod_key` as the holder of `bits` (after `cannot_hold` found nothing)."""
        for i in bits:
            self.holders[i] = pod_key
            self.free &= ~(1 << i)

    def unhold(self, bits: Iterable[int], pod_key: str) -> None:
        """Give back what `pod_key` holds of `bits`; idempotent (Unreserve may run twice): what the pod no longer
        holds is left alone."""
        holders = self.holders
        for i in bits:
            if not self.lacks(i) and holders[i] == pod_key:  # a device the node lacks: nothing to give back
                holders[i] = None
                if self._unused(i):
                    self.free |= (1 << i) & self.healthy

    def _unused(self, i: int) -> bool:
        """Whether device i, held by nobody, is free again (a subclass's shares may still use it)."""
        return True

    # -- one allocation's claim on the books: what the kit's take and release hooks change ---------------------

    def cannot_take(self, claim: Claim) -> str | None:
        """Why the books cannot take `claim` (`cannot_hold` here; a subclass adds its shares or parts), or None."""
        return self.cannot_hold(claim.whole)

    def take(self, pod_key: str, claim: Claim) -> None:
        """Record `claim` for `pod_key` (after `cannot_take` found nothing)."""
        self.hold(claim.whole, pod_key)

    def give_back(self, pod_key: str, claim: Claim) -> None:
        """Give back what `pod_key` holds of `claim`; idempotent (Unreserve may run twice)."""
        self.unhold(claim.whole, pod_key)

    # -- what reports and the engine's capacity index read -----------------------------------------------------

    def utilization(self) -> float:
        """The held fraction of the node's devices (the headroom's `utilization`)."""
        held = sum(1 for holder in self.holders if holder is not None)
        return held / len(self.ids) if self.ids else 0.0

    def cells(self) -> list[DeviceCell]:
        """One `DeviceCell` per device, in bit order: its holder, how much of it is used, its health."""
        return [
            DeviceCell(
                id=device,
                holders=[holder] if (holder := self.holders[i]) else [],
                used=1.0 if holder else 0.0,
                healthy=bool(self.healthy >> i & 1),
            )
            for i, device in enumerate(self.ids)
        ]


class Claim(NamedTuple):
    """What one allocation takes of a node's books, read once by the plugin (`DevicePlugin.claimed`): the device
    positions it holds whole, its shares (`SharedDeviceNodeState`), the parts of devices it holds
    (`PartedDeviceNodeState`: Neuron's cores), and the plugin's own part (`extra`: nvidia's MIG devices)."""

    whole: Sequence[int] = ()
    shares: Sequence[DeviceShare] = ()
    parts: Sequence[int] = ()
    extra: Any = None


DeviceShare = tuple[int, tuple[int, ...]]
"""One share of a device: (its position, the amount taken of each dimension)."""


class SharedDeviceNodeState(WholeDeviceNodeState):
    """Whole devices that may also be shared: each device hosts at most `split` shares, each taking an amount of
    every dimension (`dimensions`: name, capacity per device, unit per device; NVIDIA's compute in percent and memory
    in MiB) without going over the device's capacity. A device held whole takes no share, a shared device is never
    held whole, and `free` holds only devices nobody holds or shares.

    `used[d][i]` is what the shares use of dimension d on device i, `tasks[i]` how many shares it runs, `shared`
    what each pod took, so `unshare` gives back exactly that, once.
    """

    def __init__(
        self,
        plugin: str,
        node: str,
        ids: Sequence[str],
        healthy: Sequence[bool],
        dimensions: Sequence[tuple[str, Sequence[int], Sequence[str]]],
        split: int = 1,
        extra: Any = None,
        devices: Sequence[DeviceInfo] = (),
    ) -> None:
        super().__init__(plugin, node, devices, extra, ids=ids, healthy=healthy)
        self.split = max(1, split)
        self.dimensions = tuple(name for name, _, _ in dimensions)
        self.capacity = tuple(tuple(capacity) for _, capacity, _ in dimensions)
        self.units = tuple(tuple(units) for _, _, units in dimensions)
        self.used: tuple[list[int], ...] = tuple([0] * len(self.ids) for _ in dimensions)
        self.tasks = [0] * len(self.ids)
        self.shared: dict[str, list[DeviceShare]] = {}
        sizes = set(self.capacity[0]) if self.capacity else set()
        self._uniform = max(1, sizes.pop()) if len(sizes) == 1 else 0  # the first dimension's one capacity, if one

    def shareable(self, i: int) -> bool:
        """Whether device i may take another share: healthy, nobody holds it whole, fewer than `split` shares."""
        return bool(self.healthy >> i & 1) and self.holders[i] is None and self.tasks[i] < self.split

    def cannot_hold(self, bits: Iterable[int]) -> str | None:
        for i in bits:
            if self.lacks(i):
                return f"{self.noun} {i} does not exist on this node"
            if self.holders[i] is not None:
                return f"device {self.ids[i]} is already held by {self.holders[i]}"
            if self.tasks[i]:
                noun = self.noun
                return f"{noun} {self.ids[i]} is shared ({self.tasks[i]} share(s)); a whole-{noun} pod never shares"
        return None

    def cannot_share(self, shares: Sequence[DeviceShare]) -> str | None:
        """Why taking `shares` would break a device's books (held whole, over a capacity, over `split`), or None."""
        added: dict[int, list[int]] = {}
        for i, amounts in shares:
            totals = added.setdefault(i, [0] * (len(self.dimensions) + 1))
            for d, amount in enumerate(amounts):
                totals[d] += amount
            totals[-1] += 1
        for i, totals in added.items():
            if self.lacks(i):
                return f"{self.noun} {i} does not exist on this node"
            device = f"{self.noun} {self.ids[i]}"
            if self.holders[i] is not None:
                return f"{device} is held whole by {self.holders[i]}; a share never lands on it"
            for d in range(len(self.dimensions)):
                if self.used[d][i] + totals[d] > self.capacity[d][i]:
                    return self.shortage(i, d, self.capacity[d][i] - self.used[d][i], totals[d])
            if self.tasks[i] + totals[-1] > self.split:
                return f"{device} already runs {self.tasks[i]} of at most {self.split} shares"
        return None

    def shortage(self, i: int, d: int, free: int, taken: int) -> str:
        """The reason `cannot_share` gives when a claim takes `taken` of dimension d on device i, which has only
        `free` of it: "GPU 0 has 40% compute free, the allocation takes 60%"."""
        unit = _unit(self.units[d][i])
        return (
            f"{self.noun} {self.ids[i]} has {free}{unit} {self.dimensions[d]} free, the allocation takes {taken}{unit}"
        )

    def share(self, pod_key: str, shares: Sequence[DeviceShare]) -> None:
        """Record `shares` for `pod_key` (after `cannot_share` found nothing)."""
        if not shares:
            return
        held = self.shared.setdefault(pod_key, [])
        for i, amounts in shares:
            for d, amount in enumerate(amounts):
                self.used[d][i] += amount
            self.tasks[i] += 1
            self.free &= ~(1 << i)
            held.append((i, tuple(amounts)))

    def unshare(self, pod_key: str) -> None:
        """Give back exactly the shares `pod_key` took, once."""
        for i, amounts in self.shared.pop(pod_key, ()):
            for d, amount in enumerate(amounts):
                self.used[d][i] -= amount
            self.tasks[i] -= 1
            if not self.tasks[i] and self.holders[i] is None:
                self.free |= (1 << i) & self.healthy

    def sharers(self) -> list[list[str]]:
        """The pods sharing each device."""
        found: list[list[str]] = [[] for _ in self.ids]
        for key, shares in self.shared.items():
            for i, _ in shares:
                found[i].append(key)
        return found

    def _unused(self, i: int) -> bool:
        return not self.tasks[i]

    def cannot_take(self, claim: Claim) -> str | None:
        return self.cannot_hold(claim.whole) or self.cannot_share(claim.shares)

    def take(self, pod_key: str, claim: Claim) -> None:
        self.hold(claim.whole, pod_key)
        self.share(pod_key, claim.shares)

    def give_back(self, pod_key: str, claim: Claim) -> None:
        self.unhold(claim.whole, pod_key)  # what the pod no longer holds is left alone
        self.unshare(pod_key)  # exactly what the pod took, once

    def free_milli(self, i: int) -> int:
        """What another share could still get of device i, in thousandths of its tightest dimension; 0 when it
        takes no more shares (held whole, unhealthy, `split` shares). Hot (nvidia's fgd policy reads every GPU's):
        a plain loop."""
        if not (self.healthy >> i & 1 and self.holders[i] is None and self.tasks[i] < self.split):
            return 0
        least = 1000
        for capacity, used in zip(self.capacity, self.used, strict=True):
            size = capacity[i]
            left = (size - used[i]) * 1000 // (size or 1)
            if left < least:
                least = left
        return least

    def most_free(self, d: int, devices: Iterable[int], *, percent: bool = False) -> int:
        """The most of dimension `d` free on any of `devices` (in its unit, or in percent of the device), 0 when
        none: what one share could get at most (the headroom)."""
        capacity, used = self.capacity[d], self.used[d]
        if percent:
            return max(((capacity[i] - used[i]) * 100 // max(1, capacity[i]) for i in devices), default=0)
        return max((capacity[i] - used[i] for i in devices), default=0)

    def utilization(self) -> float:
        """Devices held whole, plus the shares' use of the first dimension (compute), over the healthy devices."""
        healthy = self.healthy
        count = healthy.bit_count()
        if not count:
            return 0.0
        held = sum(1 for i, holder in enumerate(self.holders) if holder is not None and healthy >> i & 1)
        shared = 0.0
        if self.dimensions:
            capacity, used = self.capacity[0], self.used[0]
            if self._uniform:  # every device alike (the usual case): one division, as a reader would write it
                shared = sum(u for i, u in enumerate(used) if healthy >> i & 1) / self._uniform
            else:
                shared = sum(u / max(1, capacity[i]) for i, u in enumerate(used) if healthy >> i & 1)
        return min(1.0, (held + shared) / count)

    def share_used(self, i: int) -> float:
        """How much of shared device i is used, 0..1, for reports: its tightest dimension's (`free_milli`)."""
        return min(1.0, 1 - self.free_milli(i) / 1000)

    def cells(self) -> list[DeviceCell]:
        """A device held whole shows its holder and is used up; a shared one its sharers, `share_used` and each
        sharer's part of it (`share_parts`)."""
        sharers = self.sharers()
        cells = []
        for i, device in enumerate(self.ids):
            holder = self.holders[i]
            cells.append(
                DeviceCell(
                    id=device,
                    holders=[holder] if holder else sorted(set(sharers[i])),
                    used=1.0 if holder else self.share_used(i) if sharers[i] else 0.0,
                    healthy=bool(self.healthy >> i & 1),
                    shares=self.share_parts(i) if sharers[i] and not holder else {},
                )
            )
        return cells

    def share_parts(self, i: int) -> dict[str, float]:
        """Each sharer's part of shared device i, for reports (`DeviceCell.shares`): its amounts in the dimension
        whose capacity is most used, as a fraction of that capacity."""
        tightest = max(
            range(len(self.dimensions)),
            key=lambda d: self.used[d][i] / (self.capacity[d][i] or 1),
            default=None,
        )
        if tightest is None:
            return {}
        size = self.capacity[tightest][i] or 1
        parts: dict[str, float] = {}
        for key, shares in self.shared.items():
            for at, amounts in shares:
                if at == i:
                    parts[key] = parts.get(key, 0.0) + min(1.0, amounts[tightest] / size)
        return {key: round(part, 4) for key, part in sorted(parts.items())}

    def scoring_content(self) -> tuple[object, ...]:
        """The shares' books are read too (`used`, `tasks`) and carry no content of their own here: each node is
        scored alone (nvidia's state, which knows what its scores read, says more)."""
        return (self,)


class PartedDeviceNodeState(WholeDeviceNodeState):
    """Whole devices each made of `parts` equal parts that a pod may also hold one by one (Neuron's NeuronCores):
    part p is on device p // parts, bit p of `free_parts`; `part_holders[p]` holds it, `parts_held_on[d]` counts
    the held parts of device d. A device held whole offers no parts, a device with a held part is not free for
    whole-device requests, and `free` holds only healthy devices nobody holds in any way. `present` holds the
    devices the node has (device ids may skip numbers: the others are neither healthy nor present).
    `part_noun` names a part in reasons ("core 3 is already held by ns/a").
    """

    part_noun = "part"

    def __init__(
        self,
        plugin: str,
        node: str,
        ids: Sequence[str],
        healthy: Sequence[bool],
        parts: int,
        present: int | None = None,
        extra: Any = None,
        mix: SizeMix | None = None,
    ) -> None:
        super().__init__(plugin, node, (), extra, mix, ids=ids, healthy=healthy)
        self.parts = max(1, parts)
        self.present = present if present is not None else (1 << len(self.ids)) - 1
        self.healthy_parts = self.parts_of(self.healthy)
        self.free_parts = self.healthy_parts
        self.part_holders: dict[int, str] = {}
        self.parts_held_on: dict[int, int] = {}

    def parts_of(self, devices: int) -> int:
        """The parts of the devices `devices` (a mask), as a mask of parts."""
        k, block, found = self.parts, (1 << self.parts) - 1, 0
        while devices:
            low = devices & -devices
            found |= block << (low.bit_length() - 1) * k
            devices ^= low
        return found

    def holder(self, i: int) -> str | None:
        """Who keeps device i from being taken whole: its whole holder, or the first holder of its parts."""
        holder = self.holders[i]
        if holder is None and self.parts_held_on.get(i):
            k = self.parts
            holder = min(h for p in range(i * k, i * k + k) if (h := self.part_holders.get(p)))
        return holder

    def cannot_hold(self, bits: Iterable[int]) -> str | None:
        holders, parts_held_on = self.holders, self.parts_held_on
        for i in bits:
            if i < 0 or not self.present >> i & 1:
                return f"device {i} does not exist on this node"
            holder = holders[i] if holders[i] is not None or not parts_held_on.get(i) else self.holder(i)
            if holder is not None:
                return f"device {i} is already held by {holder}"
        return None

    def cannot_hold_parts(self, parts: Iterable[int], whole: Collection[int]) -> str | None:
        """Why a pod may not hold the parts `parts` beside the devices `whole` of the same claim, or None."""
        noun = self.part_noun
        for p in parts:
            i = p // self.parts
            if p < 0 or not self.present >> i & 1:
                return f"{noun} {p} does not exist on this node"
            holder = self.part_holders.get(p) or self.holders[i]
            if holder is not None:
                return f"{noun} {p} is already held by {holder}"
            if i in whole:
                return f"{noun} {p} is on device {i}, which the same allocation takes whole"
        return None

    def cannot_take(self, claim: Claim) -> str | None:
        error = self.cannot_hold(claim.whole)
        if error is None and claim.parts:
            error = self.cannot_hold_parts(claim.parts, claim.whole)
        return error

    def take(self, pod_key: str, claim: Claim) -> None:
        self.hold(claim.whole, pod_key)
        k = self.parts
        for i in claim.whole:
            self.free_parts &= ~(((1 << k) - 1) << i * k)  # device i's parts (`parts_of(1 << i)`)
        for p in claim.parts:
            i = p // self.parts
            self.part_holders[p] = pod_key
            self.parts_held_on[i] = self.parts_held_on.get(i, 0) + 1
            self.free_parts &= ~(1 << p)
            self.free &= ~(1 << i)

    def give_back(self, pod_key: str, claim: Claim) -> None:
        """Idempotent (Unreserve): what the pod no longer holds is left alone."""
        for i in claim.whole:
            if not self.lacks(i) and self.holders[i] == pod_key:
                self.unhold((i,), pod_key)
                self.free_parts |= self.parts_of(1 << i) & self.healthy_parts
        for p in claim.parts:
            if p < 0 or self.part_holders.get(p) != pod_key:  # parts are held by their own number: none below 0
                continue
            i = p // self.parts
            del self.part_holders[p]
            self.free_parts |= (1 << p) & self.healthy_parts
            left = self.parts_held_on[i] - 1
            if left:
                self.parts_held_on[i] = left
            else:
                del self.parts_held_on[i]
                if self.holders[i] is None:
                    self.free |= (1 << i) & self.healthy

    def _unused(self, i: int) -> bool:
        return not self.parts_held_on.get(i)

    def utilization(self) -> float:
        """The held fraction of the healthy parts (a device held whole holds all of its parts)."""
        healthy = self.healthy_parts.bit_count()
        return (healthy - self.free_parts.bit_count()) / healthy if healthy else 0.0

    def cells(self) -> list[DeviceCell]:
        """One cell per present device: its whole holder, else the holders of its parts and the share held."""
        k = self.parts
        cells = []
        for i in bit_indices(self.present):
            whole = self.holders[i]
            if whole is not None:
                holders, used = [whole], 1.0
            else:
                held = [h for p in range(i * k, i * k + k) if (h := self.part_holders.get(p)) is not None]
                holders, used = sorted(set(held)), len(held) / k
            cells.append(DeviceCell(id=self.ids[i], holders=holders, used=used, healthy=bool(self.healthy >> i & 1)))
        return cells


def shares_devices(state: object) -> bool:
    """Whether a node state's devices may be shared: the kit's shared books with more than one share per device. The
    engine ranks as many nodes as kube-scheduler would for a pod that may reach such a node, where placing a share by
    its fragmentation is worth the most."""
    return isinstance(state, SharedDeviceNodeState) and state.split > 1


def _unit(unit: str) -> str:
    """`%` follows its number, other units after a space: "40% compute", "512 MiB memory"."""
    return unit if unit == "%" else f" {unit}"


@dataclass(frozen=True, slots=True)
class WholeDevicePodState:
    """The plugin's part of one pod, read once per pod signature (`kubegpu_scheduler_prepare`).

    `containers`: (container, resource, count) for each container asking for the plugin's devices, in spec order;
    `extra`: what `read` returned; `error`: why the request can never be scheduled (from `Refused`).
    """

    containers: tuple[tuple[str, str, int], ...] = ()
    extra: Any = None
    error: str | None = None
    total: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", sum(count for _, _, count in self.containers))


# The names before the naming scheme of plugin state classes (docs/hooks.md): kept for plugins written against them.
WholeDeviceState = WholeDeviceNodeState
WholeRequest = WholeDevicePodState


S = TypeVar("S", bound=WholeDeviceNodeState)


class DevicePlugin(Generic[S]):
    """Base of every scheduler-side plugin on the kit's books (`S`: its node state, a `WholeDeviceNodeState`).

    It implements the hooks that only keep books, the same for every device family: `take` and `release` (an
    allocation read once into a `Claim`, checked against the books, recorded, given back idempotently),
    `headroom` and `describe`. A plugin decides where pods go in its own hooks (`build_node`, `prepare`, `fit`,
    `score`, `allocate`: `WholeDevicePlugin` writes them for whole devices; the nvidia, neuron and intel-gas
    plugins write their own) and says, where its books differ from whole devices:

    * `claimed(state, allocation)`: the `Claim` an allocation makes, or why it cannot be read on this node;
    * `learn(state, allocation, pod, claim)`: what a take teaches the plugin's mix (the default: whole-device sizes);
    * `headroom_free(state)`, `largest(state, free)`, `picture(state)`, `more_occupancy(state)`: what reports say.
    """

    name: str = ""  # the entry-point name, told at registration (`bind_plugin_name`); a class may fix it
    resources: tuple[str, ...] = ()  # resource names that all count these devices (usually one)
    noun: str = "devices"  # in reasons: "node(s) had fewer than 4 healthy example.com/fpga cards"
    family: str = ""  # `Occupancy.family` of the devices' picture; the first resource when empty
    unlisted: frozenset[str] = frozenset()  # `Headroom.unlisted`
    # Resources that are amounts of each device of another of `resources`, no device alone (`{"nvidia.com/gpucores":
    # "nvidia.com/gpu"}`): `kubegpu_scheduler_qualifiers`. Empty: every resource is a device.
    qualifiers: Mapping[str, str] = MappingProxyType({})

    def bind_plugin_name(self, name: str) -> None:
        """Take the entry-point name. A class that fixes its name (the built-ins: their node side and their
        annotations use it) refuses another, rather than answer under two names."""
        fixed = type(self).name
        if fixed and fixed != name:
            raise ValueError(f"plugin {fixed!r} must be registered as {fixed!r}, not {name!r}")
        self.name = name

    # -- what a subclass may write for its books -----------------------------------------------------------------

    def claimed(self, state: S, allocation: PluginAllocation) -> Claim | str:
        """The `Claim` an allocation makes on this node's books, or why it cannot be read here (a decoded
        annotation may hold anything). The default: whole devices of the plugin's resources (`read_whole`)."""
        bits, error = state.read_whole(allocation, self.resources)
        return error if error else Claim(bits)

    def learn(self, state: S, allocation: PluginAllocation, pod: PodRequest | None, claim: Claim) -> None:
        """What a take teaches the plugin (after the books took it). The default: each container's device count
        joins the mix the fragmentation measure expects."""
        for resources in allocation.containers.values():
            state.mix.add(sum(len(ids) for ids in resources.values()))

    def headroom_free(self, state: S) -> dict[str, int]:
        """The headroom's `free`: the largest amount of each resource one container could get now."""
        return dict.fromkeys(self.resources, self.largest(state, state.free))

    def largest(self, state: S, free: int) -> int:
        """The largest request one container could get from `free` (headroom and describe's `largest_fit`)."""
        return free.bit_count()

    def picture(self, state: S) -> dict[str, Any]:
        """Extra `Occupancy` fields for reports: `layout`, `columns`, `topology`, `links`."""
        return {}

    def more_occupancy(self, state: S) -> list[Occupancy]:
        """Pictures beside the devices' own (nvidia's MIG devices); none by default."""
        return []

    # -- hooks ---------------------------------------------------------------------------------------------------

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_resources(self) -> list[str]:
        return list(self.resources)

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_qualifiers(self) -> dict[str, str]:
        return dict(self.qualifiers)

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_headroom(self, state: S) -> Headroom:
        return Headroom(free=self.headroom_free(state), utilization=state.utilization(), unlisted=self.unlisted)

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_take(
        self, state: S, pod_key: str, allocation: PluginAllocation, pod: PodRequest | None
    ) -> Status:
        claim = self.claimed(state, allocation)
        if isinstance(claim, str):
            return Status.error(claim, plugin=self.name)
        error = state.cannot_take(claim)
        if error:
            return Status.error(error, plugin=self.name)
        state.take(pod_key, claim)
        state.version += 1
        if pod is not None:  # None: a what-if or a pod held again (the hook's docstring): nothing to learn
            self.learn(state, allocation, pod, claim)
        return Status.success()

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_release(self, state: S, pod_key: str, allocation: PluginAllocation) -> Status:
        claim = self.claimed(state, allocation)
        if isinstance(claim, str):
            return Status.error(claim, plugin=self.name)
        state.give_back(pod_key, claim)  # idempotent: what the pod no longer holds is left alone
        state.version += 1
        return Status.success()

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_describe(self, state: S) -> list[Occupancy]:
        more = self.more_occupancy(state)
        if not state.ids and more:
            return more
        cells = state.cells()
        family = self.family or (self.resources[0] if self.resources else self.name)
        devices = Occupancy(
            family=family,
            cells=cells,
            total=len(cells),
            free=state.free.bit_count(),
            largest_fit=self.largest(state, state.free),
            **self.picture(state),
        )
        return [devices, *more]


class WholeDevicePlugin(DevicePlugin[WholeDeviceNodeState]):
    """Base of a scheduler-side plugin of whole devices; see the module docstring for what a subclass writes."""

    # -- what a subclass writes ----------------------------------------------------------------------------------

    def devices(self, node: NodeInfo) -> tuple[Sequence[DeviceInfo], Any] | None:
        """The node's devices in bit order and the plugin's per-node `extra`, or None when it has none.

        The default reads the advertised inventory `node.inventories[name]`; override it to fall back to labels.
        """
        inventory = node.inventories.get(self.name)
        if inventory is None or not inventory.devices:
            return None
        return inventory.devices, None

    def read(self, pod: PodRequest) -> Any:
        """The plugin's own part of the request (annotations), handed to the other methods as `request.extra`.
        Raise `Refused` for a request that can never be scheduled. Must not depend on the pod's name or UID."""
        return None

    def eligible(self, state: WholeDeviceNodeState, request: WholeDevicePodState) -> tuple[int, str | None]:
        """The healthy devices this request may use, and the reason when the node can never serve it (a model the
        node lacks). The default: every healthy device."""
        return state.healthy, None

    def choose(self, state: WholeDeviceNodeState, free: int, count: int, request: WholeDevicePodState) -> int | None:
        """A mask of `count` devices out of `free` for one container, or None when none will do. The default takes
        the lowest free devices (devices are interchangeable)."""
        return lowest_bits(free, count)

    def score(self, state: WholeDeviceNodeState, request: WholeDevicePodState, chosen: Sequence[int]) -> float:
        """0..100 for a placement (`chosen`: one mask per container). The default: 100."""
        return 100.0

    def fields(
        self, state: WholeDeviceNodeState, request: WholeDevicePodState, chosen: Sequence[int]
    ) -> dict[str, Any]:
        """The allocation's fields, which the node side reads back (`ContainerAllocation.fields`)."""
        return {}

    def fits(self, state: WholeDeviceNodeState, free: int, count: int) -> bool:
        """Whether a container asking for `count` devices could get a valid set of them out of `free` (the
        fragmentation measure). The default: `free` holds `count` devices (devices are interchangeable); a plugin
        with a topology says whether one of its valid sets of that size is free."""
        return free.bit_count() >= count

    # -- the plan: one placement per (state version, request), shared by fit, score and allocate ----------------

    def _plan(self, state: WholeDeviceNodeState, request: WholeDevicePodState) -> tuple[int, ...] | None:
        placed = state._placed
        if placed is not None and placed[0] == state.version and placed[1] == request:
            return placed[2]
        eligible, reason = self.eligible(state, request)
        plan = None if reason else self._place(state, request, eligible & state.free)
        state._placed = (state.version, request, plan)
        return plan

    def _place(
        self, state: WholeDeviceNodeState, request: WholeDevicePodState, available: int
    ) -> tuple[int, ...] | None:
        chosen = []
        for _, _, count in request.containers:
            mask = self.choose(state, available, count, request)
            if mask is None or mask.bit_count() != count or mask & ~available:
                return None
            chosen.append(mask)
            available &= ~mask
        return tuple(chosen)

    def _request(self, pod: PodRequest, prepared: object) -> WholeDevicePodState:
        return prepared if isinstance(prepared, WholeDevicePodState) else self._parse(pod)

    def _parse(self, pod: PodRequest) -> WholeDevicePodState:
        wanted: list[tuple[str, str, int]] = []
        for container in pod.containers:
            asked = [(r, n) for r in self.resources if (n := container.resources.get(r, 0)) > 0]
            if len(asked) > 1:
                names = " and ".join(r for r, _ in asked)
                return WholeDevicePodState(
                    error=f"container {container.name} requests {names}, which count the same devices; request one"
                )
            if asked:
                wanted.append((container.name, *asked[0]))
        try:
            extra = self.read(pod)
        except Refused as exc:
            return WholeDevicePodState(tuple(wanted), error=str(exc))
        return WholeDevicePodState(tuple(wanted), extra)

    def _refuse(self, reason: str) -> Status:
        return Status.unresolvable(reason, plugin=self.name)

    # -- hooks ---------------------------------------------------------------------------------------------------

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_build_node(
        self, node: NodeInfo, shared: dict[str, object] | None
    ) -> WholeDeviceNodeState | None:
        # No default for `shared`: pluggy passes no argument that has one, and each node would learn alone.
        found = self.devices(node)
        if found is None or not found[0]:
            return None
        devices, extra = found
        # Before the bitmasks and holder lists: whatever `devices` read, at most MAX_DEVICES_PER_NODE of them.
        check_device_count(node.name, f"{self.name} devices", len(devices))
        mix = shared.get(MIX_KEY) if shared is not None else None
        if shared is not None and not isinstance(mix, SizeMix):
            mix = shared[MIX_KEY] = SizeMix(drift=MIX_DRIFT)
        return WholeDeviceNodeState(self.name, node.name, devices, extra, mix if isinstance(mix, SizeMix) else None)

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_validate(self, pod: PodRequest) -> Status | None:
        error = self._parse(pod).error
        return self._refuse(error) if error else None

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_prepare(self, pod: PodRequest) -> WholeDevicePodState:
        return self._parse(pod)

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_fit(self, state: WholeDeviceNodeState, pod: PodRequest, prepared: object) -> Status:
        request = self._request(pod, prepared)
        if request.error:
            return self._refuse(request.error)
        if not request.total:
            return Status.success()
        eligible, reason = self.eligible(state, request)
        if reason:
            return self._refuse(reason)
        resource = request.containers[0][1]
        if request.total > eligible.bit_count():
            return self._refuse(f"node(s) had fewer than {request.total} healthy {resource} {self.noun}".rstrip())
        if self._plan(state, request) is not None:
            return Status.success()
        if self._place(state, request, eligible) is None:  # not even on an empty node
            return self._refuse(f"node(s) had no valid set of {request.total} {resource} {self.noun}".rstrip())
        return Status.unschedulable(f"Insufficient {resource}", plugin=self.name)

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_score(self, state: WholeDeviceNodeState, pod: PodRequest, prepared: object) -> float:
        request = self._request(pod, prepared)
        if not request.total or request.error:
            return 100.0 if not request.error else 0.0
        plan = self._plan(state, request)
        return 0.0 if plan is None else self.score(state, request, plan)

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_fragmentation(
        self, state: WholeDeviceNodeState, pod: PodRequest, prepared: object, free: Mapping[str, int]
    ) -> float | None:
        """How much more often the node turns away the next container of the learned mix once the pod is placed,
        in devices (`fragmentation_growth` of its plan); None before any pod was placed, or for a pod that asks for
        none of these devices (cpu is not in the kit's measure)."""
        request = self._request(pod, prepared)
        if not state.mix.total or request.error or not request.total:
            return None
        plan = self._plan(state, request)
        if plan is None:
            return None
        taken = 0
        for mask in plan:
            taken |= mask
        return fragmentation_growth(
            state.free, state.free & ~taken, state.mix, lambda free, count: self.fits(state, free, count)
        )

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_fragmentation_epoch(self, shared: dict[str, object]) -> int | None:
        """The version of the engine's learned mix (`SizeMix.version`): the fragmentation answers move with it."""
        mix = shared.get(MIX_KEY)
        return mix.version if isinstance(mix, SizeMix) else None

    @scheduler_hooks.hookimpl
    def kubegpu_scheduler_allocate(
        self, state: WholeDeviceNodeState, pod: PodRequest, prepared: object
    ) -> PluginAllocation | None:
        request = self._request(pod, prepared)
        if request.error:
            return None
        plan = self._plan(state, request) if request.total else ()
        if plan is None:
            return None
        containers: dict[str, dict[str, list[str]]] = {}
        for (container, resource, _), mask in zip(request.containers, plan, strict=True):
            containers.setdefault(container, {})[resource] = state.ids_of(mask)
        return PluginAllocation(plugin=self.name, containers=containers, fields=self.fields(state, request, plan))


# ---------------------------------------------------------------------------------------------------------------
# Node side
# ---------------------------------------------------------------------------------------------------------------


class DeviceFilesPlugin:
    """Base of a node-side plugin whose devices are files under `/dev` (`/dev/acme0`, `/dev/acme1`, ...).

    Discovery lists the files whose name matches `pattern` (numbered ones in numeric order); a device whose file
    disappeared is unhealthy. The node advertises the healthy count as `resource` capacity (and `count_label` when
    set). A container granted devices gets their device nodes, `env` = the ids joined by commas, and CDI names of
    `cdi_kind`; the plugin owns exactly those paths, that variable and that CDI kind (`kubegpu_device_owned`).
    """

    name: str = ""
    resource: str = ""
    pattern: str = ""  # a regular expression for a device file name under /dev, with one group for its number
    env: str = ""
    cdi_kind: str = ""
    model: str | None = None
    count_label: str = ""

    def bind_plugin_name(self, name: str) -> None:
        self.name = name

    def _compiled(self) -> re.Pattern[str]:
        return re.compile(self.pattern)

    def device_ids(self, dev: Path) -> list[str]:
        """The device file names in `dev` that match `pattern`, numbered ones in numeric order."""
        if not dev.is_dir():
            return []
        compiled = self._compiled()
        found = []
        for path in dev.iterdir():
            match = compiled.fullmatch(path.name)
            if match is not None:
                number = match.group(1) if compiled.groups else None
                found.append((int(number) if number and number.isdigit() else -1, path.name))
        return [name for _, name in sorted(found)]

    def edit(self, allocation: ContainerAllocation, edit: ContainerEdit, ids: list[str]) -> None:
        """Anything more a container needs (a library mount, an env from `allocation.fields`); the default: none."""

    @device_hooks.hookimpl
    def kubegpu_device_resources(self) -> list[str]:
        return [self.resource]

    @device_hooks.hookimpl
    def kubegpu_device_owned(self) -> DeviceOwnership:
        return DeviceOwnership(
            envs=(self.env,) if self.env else (),
            device_paths=(f"/dev/{self.pattern}",),
            cdi_kinds=(self.cdi_kind,) if self.cdi_kind else (),
        )

    @device_hooks.hookimpl
    def kubegpu_device_discover(self, host_root: Path) -> DeviceInventory | None:
        ids = self.device_ids(host_root / "dev")
        if not ids:
            return None
        return DeviceInventory(plugin=self.name, devices=[DeviceInfo(id=i, model=self.model) for i in ids])

    @device_hooks.hookimpl
    def kubegpu_device_health(self, host_root: Path, inventory: DeviceInventory) -> dict[str, bool]:
        return {device.id: (host_root / "dev" / device.id).exists() for device in inventory.devices}

    @device_hooks.hookimpl
    def kubegpu_device_advertise(self, inventory: DeviceInventory) -> Advertisement:
        healthy = len(inventory.healthy_ids())
        labels = {self.count_label: str(healthy)} if self.count_label else {}
        return Advertisement(capacity={self.resource: healthy}, labels=labels)

    @device_hooks.hookimpl
    def kubegpu_device_plugin_ids(self, inventory: DeviceInventory) -> dict[str, dict[str, bool]]:
        return {self.resource: {d.id: d.healthy for d in inventory.devices}}

    @device_hooks.hookimpl
    def kubegpu_device_edit_container(
        self, allocation: ContainerAllocation, edit: ContainerEdit, dev_root: Path
    ) -> bool | None:
        ids = allocation.resources.get(self.resource)
        if not ids:
            return None
        compiled = self._compiled()
        for device in ids:
            if not compiled.fullmatch(device):
                raise ValueError(f"allocation names {device!r}, which is not a {self.resource} device id")
        edit.replace_devices(
            f"/dev/{self.pattern}", [DeviceNode(host_path=str(dev_root / d), container_path=f"/dev/{d}") for d in ids]
        )
        if self.cdi_kind:
            edit.replace_cdi_devices(self.cdi_kind, [f"{self.cdi_kind}={d}" for d in ids])
        if self.env:
            edit.envs[self.env] = ",".join(ids)
        self.edit(allocation, edit, ids)
        return True


def label_devices(labels: Mapping[str, str], label: str, prefix: str) -> list[DeviceInfo]:
    """`prefix0`..`prefix<n-1>` from a count label (`acme.example/count: "4"`); none when absent or not a count.
    A count over `kubegpu.core.limits.MAX_DEVICES_PER_NODE` raises `ValueError` before any device is made (the
    engine turns it into the reason the node's pods get)."""
    count = bounded_count(labels.get(label, ""), f"label {label}")
    return [DeviceInfo(id=f"{prefix}{i}") for i in range(count or 0)]
