"""The FPGA plugin, scheduler side: whole `example.com/fpga` cards and one rule about what is loaded on them.

A node's cards come from its advertised inventory (`kubegpu.io/devices`, written by `kubegpu advertise` with
this distribution's device side) or, without an advertiser, from the label `example.com/fpga.count`. All cards
of a node carry the bitstream named by the node label `example.com/fpga.bitstream`. A pod that names a
bitstream in the annotation `example.com/fpga-bitstream` fits only nodes with that bitstream; a pod that names
none may use any node, and prefers nodes with no bitstream loaded, which keeps those for the pods that need
them. Cards are independent (no topology), so a container gets the lowest free card ids.
"""

from __future__ import annotations

import logging
import re

from kubegpu.core.models import DeviceCell, NodeInfo, Occupancy, PluginAllocation, PodRequest
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom, hookimpl
from kubegpu.core.status import Status
from kubegpu_fpga import BITSTREAM_ANNOTATION, BITSTREAM_LABEL, COUNT_LABEL, NAME, RESOURCE, card_index

__all__ = ["NAME", "RESOURCE", "FpgaState", "cards_from_label", "lowest_free"]

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------------------

# A bitstream name is used as a label value, so it follows the label-value syntax.
BITSTREAM_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
SCORE_MATCHED = 100.0  # the pod named a bitstream and the node has it, or the node has none loaded
SCORE_LOADED_UNUSED = 50.0  # the pod needs no bitstream but the node's cards are loaded with one


# ------------------------------------------------------------------------------------------------------------
# Private state
# ------------------------------------------------------------------------------------------------------------


class FpgaState(DeviceNodeState):
    """One node's cards as bitmasks: bit `i` stands for `cards[i]`."""

    plugin = NAME

    def __init__(self, node: str, cards: tuple[str, ...], healthy: int, bitstream: str | None) -> None:
        super().__init__(node)
        self.cards = cards
        self.index = {card: i for i, card in enumerate(cards)}
        self.healthy = healthy
        self.free = healthy
        self.bitstream = bitstream
        self.holders: dict[int, str] = {}


# ------------------------------------------------------------------------------------------------------------
# Hook implementations
# ------------------------------------------------------------------------------------------------------------


@hookimpl
def kubegpu_scheduler_resources() -> list[str]:
    return [RESOURCE]


@hookimpl
def kubegpu_scheduler_build_node(node: NodeInfo) -> FpgaState | None:
    bitstream = node.labels.get(BITSTREAM_LABEL) or None
    inventory = node.inventories.get(NAME)
    if inventory is not None:
        numbered = sorted((index, d) for d in inventory.devices if (index := card_index(d.id)) is not None)
        cards = tuple(d.id for _, d in numbered)
        healthy = sum(1 << i for i, (_, d) in enumerate(numbered) if d.healthy)
    else:
        cards = cards_from_label(node.labels.get(COUNT_LABEL))
        healthy = (1 << len(cards)) - 1
    if not cards:
        return None
    return FpgaState(node.name, cards, healthy, bitstream)


@hookimpl
def kubegpu_scheduler_headroom(state: FpgaState) -> Headroom:
    used = len(state.holders) / len(state.cards)
    return Headroom(free={RESOURCE: state.free.bit_count()}, utilization=used)


@hookimpl
def kubegpu_scheduler_validate(pod: PodRequest) -> Status | None:
    wanted = pod.annotations.get(BITSTREAM_ANNOTATION)
    if wanted is not None and not BITSTREAM_NAME.fullmatch(wanted):
        return Status.unresolvable(
            f"annotation {BITSTREAM_ANNOTATION} must name a bitstream (letters, digits, '-', '_', '.'), got {wanted!r}",
            plugin=NAME,
        )
    return None


@hookimpl
def kubegpu_scheduler_fit(state: FpgaState, pod: PodRequest) -> Status:
    wanted = _requests(pod)
    total = sum(wanted.values())
    if total == 0:
        return Status.success()
    bitstream = pod.annotations.get(BITSTREAM_ANNOTATION)
    if bitstream is not None and bitstream != state.bitstream:
        reason = f"node(s) didn't have FPGA bitstream {bitstream!r} (annotation {BITSTREAM_ANNOTATION})"
        return Status.unresolvable(reason, plugin=NAME)
    if total > state.healthy.bit_count():
        return Status.unresolvable(f"node(s) had fewer than {total} healthy {RESOURCE} cards", plugin=NAME)
    if total > state.free.bit_count():
        return Status.unschedulable(f"Insufficient {RESOURCE}", plugin=NAME)
    return Status.success()


@hookimpl
def kubegpu_scheduler_score(state: FpgaState, pod: PodRequest) -> float:
    if pod.annotations.get(BITSTREAM_ANNOTATION) is None and state.bitstream is not None:
        return SCORE_LOADED_UNUSED
    return SCORE_MATCHED


@hookimpl
def kubegpu_scheduler_allocate(state: FpgaState, pod: PodRequest) -> PluginAllocation | None:
    free = state.free
    containers: dict[str, dict[str, list[str]]] = {}
    for container, count in _requests(pod).items():
        bits = lowest_free(free, count)
        if bits is None:
            return None
        free &= ~bits
        containers[container] = {RESOURCE: [state.cards[i] for i in _bit_indices(bits)]}
    fields = {"bitstream": state.bitstream} if state.bitstream else {}
    return PluginAllocation(plugin=NAME, containers=containers, fields=fields)


@hookimpl
def kubegpu_scheduler_take(state: FpgaState, pod_key: str, allocation: PluginAllocation) -> Status:
    bits = 0
    for resources in allocation.containers.values():
        for resource, cards in resources.items():
            if resource != RESOURCE:
                return Status.error(f"resource {resource!r} is not {RESOURCE}", plugin=NAME)
            for card in cards:
                i = state.index.get(card)
                if i is None:
                    return Status.error(f"card {card!r} does not exist on the node", plugin=NAME)
                bit = 1 << i
                if bits & bit:
                    return Status.error(f"card {card} is allocated twice", plugin=NAME)
                if not state.healthy & bit:
                    return Status.error(f"card {card} is unhealthy", plugin=NAME)
                if i in state.holders:
                    return Status.error(f"card {card} is already held by {state.holders[i]}", plugin=NAME)
                bits |= bit
    state.free &= ~bits
    for i in _bit_indices(bits):
        state.holders[i] = pod_key
    return Status.success()


@hookimpl
def kubegpu_scheduler_release(state: FpgaState, pod_key: str, allocation: PluginAllocation) -> Status:
    held: list[int] = []
    for card in sorted(allocation.device_ids()):
        i = state.index.get(card)
        if i is None or state.holders.get(i) != pod_key:
            return Status.error(f"card {card!r} is not held by {pod_key}", plugin=NAME)
        held.append(i)
    for i in held:
        del state.holders[i]
        state.free |= (1 << i) & state.healthy
    return Status.success()


@hookimpl
def kubegpu_scheduler_describe(state: FpgaState) -> list[Occupancy]:
    cells = [
        DeviceCell(
            id=card,
            holders=[state.holders[i]] if i in state.holders else [],
            used=1.0 if i in state.holders else 0.0,
            healthy=bool(state.healthy >> i & 1),
        )
        for i, card in enumerate(state.cards)
    ]
    free = state.free.bit_count()
    return [Occupancy(family=RESOURCE, cells=cells, total=len(cells), free=free, largest_fit=free)]


# ------------------------------------------------------------------------------------------------------------
# Pure helpers
# ------------------------------------------------------------------------------------------------------------


def _requests(pod: PodRequest) -> dict[str, int]:
    """Container name -> cards requested, for the containers that request any."""
    return {c.name: n for c in pod.containers if (n := c.resources.get(RESOURCE, 0)) > 0}


def cards_from_label(value: str | None) -> tuple[str, ...]:
    """`fpga0`..`fpga<n-1>` from the `example.com/fpga.count` label; none when it is absent or not a count."""
    if value is None:
        return ()
    if not value.isdigit():
        log.warning("ignoring label %s=%r: not a card count", COUNT_LABEL, value)
        return ()
    return tuple(f"fpga{i}" for i in range(int(value)))


def lowest_free(free: int, count: int) -> int | None:
    """The `count` lowest set bits of `free` as a mask, or None when fewer are set."""
    if free.bit_count() < count:
        return None
    bits = 0
    for _ in range(count):
        low = free & -free
        bits |= low
        free ^= low
    return bits


def _bit_indices(bits: int) -> list[int]:
    return [i for i in range(bits.bit_length()) if bits >> i & 1]
