"""The intel-gas plugin, scheduler side: Intel GPUs shared card by card, after GPU Aware Scheduling (GAS).

Kubernetes sees an Intel GPU node's resources as node totals (`gpu.intel.com/memory.max: 16G`), but a
container's share has to come from real cards: two 5G containers fit on two 8G cards, a third does not,
although 6G remain in total. This plugin keeps the books per card, as GAS does, and places each container on
concrete cards.

The rules, in the order the engine meets them:

* **Cards.** The advertised inventory `node.inventories["intel-gas"]` (devices `card0`, ... with a health
  flag) when present, else the labels `gpu.intel.com/gpu-numbers` (with continuations) or the deprecated
  `gpu.intel.com/cards` (`cards.cards_from_labels`). Unhealthy cards are never chosen. A node without cards
  gets no state.
* **Per-card capacity.** Every `gpu.intel.com/*` resource in the node's allocatable is split evenly over its
  cards (integer division, as GAS assumes homogeneous cards), `i915` included: `i915: 8` over 2 cards lets each
  card serve 4 containers. Two exceptions, where kubegpu knows better than GAS: when the advertised inventory gives
  every healthy card's local memory, each card's `gpu.intel.com/memory.max` is its own (a 16G and a 4G card are not
  two 10G cards: an 8G container would not fit on the 4G one); and when it gives every healthy card's tiles, each
  card's `gpu.intel.com/tiles` is its own (a card of one tile and one of three are not two cards of two: the first
  has no gt1 to give).
* **A container's need.** A container requesting `gpu.intel.com/i915: n` (or `gpu.intel.com/xe: n`, treated
  alike) needs n distinct cards; each of its other `gpu.intel.com/*` requests is divided by n (integer
  division: a remainder is dropped, as in GAS), and that per-card amount, plus one unit of `i915`, must be
  free on every chosen card. Cards are distinct within a container only: two containers of one pod may share
  a card (`card0|card0`). Containers requesting no `gpu.intel.com/*` resource are left alone. A container
  requesting other `gpu.intel.com/*` resources without `i915`/`xe` is refused by `validate`, unless the
  environment sets `KUBEGPU_INTEL_WITHOUT_I915=ignore` (`kubegpu extender --intel-without-i915 ignore`): then,
  as GAS does, the container is left alone too, and the pod passes untouched to kube-scheduler's and the
  kubelet's node-total accounting.
* **Same card.** The pod annotation `gas-same-gpu` (as in GAS: a comma-separated list of at least two distinct
  container names of the pod) places the listed containers on one card together, which must have their summed
  per-card needs free. Each listed container must request exactly one `i915`/`xe` and no `tiles` or
  `*_monitoring` resource. A malformed list or a conflicting request is refused by `validate`.
* **Not followed.** A pod carrying GAS's `gas-allocate-xelink` or `gas-allocate-single-numa` annotation (read by its
  presence, as GAS does) is refused by `validate`, naming it: kubegpu does not place by Xe Link or NUMA node, and a
  pod placed on any cards instead would not know.
* **Candidates.** Healthy cards, narrowed by the pod annotations `gas-allow` (only these) and `gas-deny`
  (not these), both comma-separated card names.
* **Card choice.** Containers are placed one after another in spec order, without backtracking (as GAS
  does); a `gas-same-gpu` group is placed as one container where its first member stands. Among the
  candidate cards with enough free share, a container takes the n *fullest* cards: those whose busiest
  resource would be the most used after the placement (binpacking within the node, so untouched cards stay
  whole for multi-card and large requests); ties go to the lower card number (card2 before card10).
* **Reasons.** Shortages read like GAS's filter message with the per-card detail, e.g.
  `Not enough GPU-resources for deployment: will not fit (gpu.intel.com/memory.max: needs 5G on each of
  1 card(s); the most free on any card is 3G)`; memory amounts are written with Kubernetes suffixes
  (`cards.format_amount`). A request this node could not take even with all cards free is unresolvable (more
  cards than the node has, a per-card amount over the per-card capacity, annotations excluding too many
  cards); one blocked by shares in use is unschedulable.
* **Allocation.** Every requested `gpu.intel.com/*` resource of a container lists the container's cards,
  with `shares[container][resource][card]` = the per-card amount (1 for `i915`). The pod annotations GAS
  writes are added: `gas-ts` (the decision time in Unix nanoseconds) and `gas-container-cards` (containers
  in spec order separated by `|`, a container without Intel cards as an empty string, cards by `,`:
  `card0,card1|card2`).
* **Tiles.** A container's per-card `gpu.intel.com/tiles` are tiles of its own: on each of its cards, the lowest
  tiles no other container holds (`tiles.py`), named in the plugin's fields (`tiles`: container -> card -> tile
  numbers; `tilesPerCard`) and in GAS's `gas-container-tiles` (`card0:gt0+gt1|card1:gt1`), both only when some
  container asks tiles. A card has as many tiles as its `gpu.intel.com/tiles` capacity (at most 64). A shortage of
  tiles names the cards (`card0 has no free tile`). A container asking no tiles is counted by its other shares only,
  as in GAS, and may share a card whose tiles others hold. A classic init container asking tiles (which GAS leaves
  to the kubelet) runs before the containers after it, on the card `init_devices` names it: it is given tiles of
  its pod's there (`init_tile_plan`, signed in `initTiles`), and where it asks more than the pod holds there, the
  pod holds the rest besides, as kube-scheduler counts the more of the two.
* **Score.** GAS has none; here it is how full the chosen cards are after the placement (mean over the cards
  of their busiest resource's used fraction, times 100): a node where the pod fills cards already in use
  scores higher than one where it breaks into untouched cards.
* **Books.** The plugin kit's (`kubegpu.core.kit`): `IntelGasNodeState` is a `SharedDeviceNodeState` whose
  dimensions are the advertised resources, a container's cards its shares, and beside them each card's tiles one by
  one (`tile_free`); `IntelGasPlugin` is a `DevicePlugin`, whose take, release (each pod's shares and tiles, given
  back once), headroom and describe hooks are the kit's. An allocation signed before tiles were named books its
  `tiles` amount only.
* **Headroom.** Per advertised resource, an upper bound of what one container could get: the sum of the free
  per-card amounts over healthy cards; for `i915`/`xe`, the number of healthy cards with a free unit.
  Utilization is the used fraction of the `i915` (else `xe`, else memory) shares.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from kubegpu.core.annotations import init_devices
from kubegpu.core.kit import Claim, DevicePlugin, DeviceShare, SharedDeviceNodeState, bit_indices
from kubegpu.core.limits import check_device_count
from kubegpu.core.models import InitStep, NodeInfo, PluginAllocation, PodRequest
from kubegpu.core.scheduler_hooks import hookimpl
from kubegpu.core.status import Status
from kubegpu.plugins.intel_gas import (
    CARDS_ANNOTATION,
    COUNT_RESOURCES,
    I915,
    MEMORY,
    NAME,
    PREFIX,
    RESOURCES,
    TILES,
    TILES_ANNOTATION,
    TS_ANNOTATION,
    WITHOUT_I915_ENV,
    XE,
)
from kubegpu.plugins.intel_gas.cards import GPU_NUMBERS_LABEL, card_sort_key, cards_from_labels, format_amount
from kubegpu.plugins.intel_gas.placement import (
    IntelGasPlacement,
    IntelGasPodState,
    Refusal,
    candidate_cards,
    card_fullness,
    card_rows,
    choose_cards,
    fits_alone,
    pod_needs,
)
from kubegpu.plugins.intel_gas.tiles import (
    CARD_TILES_FIELD,
    INIT_TILES_FIELD,
    MAX_TILES_PER_CARD,
    TILES_FIELD,
    TILES_PER_CARD_FIELD,
    TILES_UNKNOWN,
    advertised_tiles,
    gas_tiles_annotation,
    pick_tiles,
    read_tiles_field,
)

__all__ = [
    "NAME",
    "RESOURCES",
    "WITHOUT_I915_ENV",
    "IntelGasNodeState",
    "IntelGasPlugin",
    "conformance_nodes",
    "plugin",
]

UNSPLIT = 1 << 30  # a card takes any number of containers' shares: its `i915` units count them

# The nodes `kubegpu plugins check` runs the conformance suite on: a node's cards come from labels it cannot guess.
conformance_nodes = [
    {
        "kind": "Node",
        "metadata": {"name": f"intel-{cards}", "labels": {GPU_NUMBERS_LABEL: ".".join(map(str, range(cards)))}},
        "status": {"allocatable": {I915: str(2 * cards), "gpu.intel.com/memory.max": str(8_000_000_000 * cards)}},
    }
    for cards in (1, 2, 4)
]


# ----------------------------------------------------------------------------------------------------------
# Private state
# ----------------------------------------------------------------------------------------------------------


class TileClaim(NamedTuple):
    """The plugin's own part of a `Claim` (`Claim.extra`): what a share asks of a resource the node does not advertise
    (card position, resource, amount), and the tiles it names (card position, bitmask of tile numbers)."""

    unadvertised: Sequence[tuple[int, str, int]] = ()
    tiles: Sequence[tuple[int, int]] = ()


class IntelGasNodeState(SharedDeviceNodeState):
    """One node's cards on the kit's books (`kubegpu.core.kit.SharedDeviceNodeState`): every advertised
    `gpu.intel.com/*` resource is a dimension of each card, with each card's capacity (`card_capacity`, by resource:
    one amount per card), a container's cards are its shares, and a card takes any number of them (no split count:
    `i915` counts them). `usage` is the kit's `used` by resource name, which the placement rule reads.

    Tiles are booked one by one beside their amount: `tile_count[i]` is card i's number of tiles (its
    `gpu.intel.com/tiles` capacity), bit t of `tile_free[i]` says tile t is free, `tile_holders` what each pod took,
    so a tile is never given to two containers and `give_back` returns exactly the pod's tiles, once."""

    plugin = NAME
    noun = "card"

    def __init__(self, node: str, cards: Sequence[str], healthy: Sequence[bool], capacity: Mapping[str, Sequence[int]]):
        dimensions = [(resource, list(amounts), [""] * len(cards)) for resource, amounts in capacity.items()]
        super().__init__(NAME, node, cards, healthy, dimensions, split=UNSPLIT)
        self.cards = self.ids
        self.healthy_cards = tuple(bit_indices(self.healthy))
        # each card's, for every advertised gpu.intel.com resource
        self.card_capacity = {resource: list(amounts) for resource, amounts in capacity.items()}
        self.usage = dict(zip(self.dimensions, self.used, strict=True))
        self.unused = {resource: [0] * len(self.cards) for resource in self.card_capacity}
        self.tile_count = list(self.card_capacity.get(TILES) or [0] * len(self.cards))
        self.tile_free = [(1 << count) - 1 for count in self.tile_count]
        self.tile_holders: dict[str, list[tuple[int, int]]] = {}
        self.memo: tuple[int, IntelGasPodState, IntelGasPlacement | Status] | None = None

    def cannot_take(self, claim: Claim) -> str | None:
        """A share of a resource the node does not advertise, before the kit's books. A share on an unhealthy card
        is taken, as the kit takes whole devices: no placement chooses one (`candidate_cards`), but a pod that held
        a share before its card failed keeps it when the engine re-takes the node's pods, and refusing it would leave
        the pod holding nothing, and every other card of the node to no new pod until it ended."""
        extra = claim.extra or TileClaim()
        for i, resource, amount in extra.unadvertised:
            return self.shortage_of(i, resource, 0, amount)
        problem = super().cannot_take(claim)
        if problem:
            return problem
        taking = [0] * len(self.cards)
        for i, tiles in extra.tiles:
            card, count = self.cards[i], self.tile_count[i]
            if tiles >> count:
                return f"{card} has {count} tile(s); the allocation names tile gt{tiles.bit_length() - 1}"
            clash = tiles & (taking[i] | ~self.tile_free[i])
            if clash:
                tile = (clash & -clash).bit_length() - 1
                holders = (key for key, held in self.tile_holders.items() for j, t in held if j == i and t & clash)
                return f"tile gt{tile} of {card} is already held by {next(holders, 'another container of the pod')}"
            taking[i] |= tiles
        return None

    def take(self, pod_key: str, claim: Claim) -> None:
        super().take(pod_key, claim)
        extra = claim.extra or TileClaim()
        if extra.tiles:
            held = self.tile_holders.setdefault(pod_key, [])
            for i, tiles in extra.tiles:
                self.tile_free[i] &= ~tiles
                held.append((i, tiles))

    def give_back(self, pod_key: str, claim: Claim) -> None:
        super().give_back(pod_key, claim)
        for i, tiles in self.tile_holders.pop(pod_key, ()):  # exactly what the pod took, once
            self.tile_free[i] |= tiles

    def shortage(self, i: int, d: int, free: int, taken: int) -> str:
        return self.shortage_of(i, self.dimensions[d], free, taken)

    def shortage_of(self, i: int, resource: str, free: int, taken: int) -> str:
        return (
            f"{self.cards[i]} has {format_amount(resource, free)} of {resource} free; "
            f"the allocation takes {format_amount(resource, taken)}"
        )

    def share_used(self, i: int) -> float:
        """The used fraction of the card's busiest resource."""
        return card_fullness(card_rows(self, self.usage), {}, i)

    def utilization(self) -> float:
        """The used fraction of the `i915` (else `xe`, else memory) shares over the healthy cards."""
        capacity = self.card_capacity
        total = {r: sum(amounts[i] for i in self.healthy_cards) for r, amounts in capacity.items()}
        basis = next((r for r in (I915, XE) if total.get(r)), None)
        if basis is None:
            basis = next((r for r in sorted(total) if "memory" in r and total[r]), None)
        if basis is None:
            return 0.0
        used = sum(self.usage[basis][i] for i in self.healthy_cards)
        return min(1.0, used / total[basis])


# ----------------------------------------------------------------------------------------------------------
# Hook implementations
# ----------------------------------------------------------------------------------------------------------


class IntelGasPlugin(DevicePlugin[IntelGasNodeState]):
    """The intel-gas plugin on the kit: the kit keeps the per-card books (take, release, headroom, describe over
    `SharedDeviceNodeState`); this class reads a node's cards and a pod's needs, places them by the GAS rules
    (`placement.py`) and reads an allocation back into a `Claim` of one share per container and card."""

    name = NAME
    resources = tuple(RESOURCES)
    family = NAME
    conformance_nodes = conformance_nodes  # the nodes `kubegpu plugins check` runs its suite on (above)

    # -- the books: what the kit's hooks ask ---------------------------------------------------------------------

    def claimed(self, state: IntelGasNodeState, allocation: PluginAllocation) -> Claim | str:
        """One share per container and card, of every resource the node advertises; what a share asks of a
        resource the node does not advertise goes in `Claim.extra`, for `cannot_take` to refuse. A card the node
        no longer has holds nothing (only allocations this scheduler signed reach here)."""
        if allocation.plugin != NAME:
            return f"the allocation belongs to plugin {allocation.plugin!r}, not {NAME!r}"
        stray = sorted(set(allocation.shares) - set(allocation.containers))
        if stray:
            return f"the allocation gives shares to container {stray[0]} but lists no cards for it"
        named_tiles = allocation.fields.get(TILES_FIELD)
        if isinstance(named_tiles, dict) and (stray := sorted(set(named_tiles) - set(allocation.containers))):
            return f"the allocation gives tiles to container {stray[0]} but lists no cards for it"
        position = {resource: d for d, resource in enumerate(state.dimensions)}
        shares: list[DeviceShare] = []
        unadvertised: list[tuple[int, str, int]] = []
        tiles: list[tuple[int, int]] = []
        for container, by_resource in allocation.containers.items():
            given = allocation.shares.get(container, {})
            if set(by_resource) != set(given):
                return (
                    f"container {container}: the allocation lists cards for {sorted(by_resource)} "
                    f"but shares for {sorted(given)}"
                )
            amounts: dict[int, list[int]] = {}
            for resource, ids in by_resource.items():
                if not resource.startswith(PREFIX):
                    return f"container {container}: {resource} is not an Intel GPU resource"
                per_card = given[resource]
                if len(set(ids)) != len(ids) or set(ids) != set(per_card):
                    return f"container {container}: the cards of {resource} ({ids}) do not match its shares"
                for card, amount in per_card.items():
                    if amount < 0:
                        return f"container {container}: the share of {resource} on {card} is negative ({amount})"
                    i = state.index.get(card)
                    if i is None:
                        # The card left the node (the labeler lists it no more) after the scheduler signed this
                        # allocation: nothing is held there, the pod's other cards still are, and if the card
                        # comes back the engine re-takes the pod's share of it with the node.
                        continue
                    d = position.get(resource)
                    if d is None:
                        if amount:
                            unadvertised.append((i, resource, amount))
                        continue
                    amounts.setdefault(i, [0] * len(position))[d] += amount
            shares.extend((i, tuple(row)) for i, row in amounts.items())
            # The tiles a container is given, one by one: as many on each card as its tiles share there. An
            # allocation signed before tiles were named has none, and books only the amount.
            named = read_tiles_field(allocation.fields, container)
            if isinstance(named, str):
                return named
            tile_shares = given.get(TILES, {})
            for card, numbers in named.items():
                if tile_shares.get(card) != len(numbers):
                    return (
                        f"container {container}: the allocation names {len(numbers)} tile(s) of {card}, but its "
                        f"{TILES} share there is {tile_shares.get(card, 0)}"
                    )
                i = state.index.get(card)
                if i is not None:  # a card the node no longer has holds nothing (above)
                    tiles.append((i, sum(1 << t for t in numbers)))
        # A classic init container runs on tiles of its pod's; those it asks beyond them the pod holds besides, once
        # per card however many init containers use them in turn (`init_tile_plan`).
        init = allocation.fields.get(INIT_TILES_FIELD) or {}
        if not isinstance(init, dict):
            return f"the allocation's {INIT_TILES_FIELD} field is not a map of containers"
        pods: dict[int, int] = {}
        for i, bits in tiles:
            pods[i] = pods.get(i, 0) | bits
        besides: dict[int, int] = {}
        for container in init:
            named = read_tiles_field(allocation.fields, str(container), INIT_TILES_FIELD)
            if isinstance(named, str):
                return named
            for card, numbers in named.items():
                i = state.index.get(card)
                if i is not None:
                    besides[i] = besides.get(i, 0) | (sum(1 << t for t in numbers) & ~pods.get(i, 0))
        for i, bits in besides.items():
            if not bits:
                continue
            tiles.append((i, bits))
            if TILES in position:
                row = [0] * len(position)
                row[position[TILES]] = bin(bits).count("1")
                shares.append((i, tuple(row)))
            else:
                unadvertised.append((i, TILES, bin(bits).count("1")))
        return Claim(shares=shares, extra=TileClaim(unadvertised, tiles))

    def learn(
        self, state: IntelGasNodeState, allocation: PluginAllocation, pod: PodRequest | None, claim: Claim
    ) -> None:
        """GAS learns no mix."""

    def headroom_free(self, state: IntelGasNodeState) -> dict[str, int]:
        """Per resource, an upper bound of what one container could get: the free per-card amounts summed over
        the healthy cards; for `i915`/`xe`, the healthy cards with a free unit."""
        free: dict[str, int] = {}
        for resource, cap in state.card_capacity.items():
            used = state.usage[resource]
            if resource in COUNT_RESOURCES:
                free[resource] = sum(1 for i in state.healthy_cards if used[i] < cap[i])
            else:
                free[resource] = sum(cap[i] - used[i] for i in state.healthy_cards)
        return free

    def largest(self, state: IntelGasNodeState, free: int) -> int:
        """The healthy cards that could take another container (a free `i915`/`xe` unit)."""
        counts = [r for r in COUNT_RESOURCES if r in state.usage]
        return sum(1 for i in state.healthy_cards if any(state.usage[r][i] < state.card_capacity[r][i] for r in counts))

    # -- deciding: the pod's needs, their cards ------------------------------------------------------------------

    @hookimpl
    def kubegpu_scheduler_build_node(self, node: NodeInfo) -> IntelGasNodeState | None:
        inventory = node.inventories.get(NAME)
        memory: list[int | None] = []
        tiles: list[int | None] = []
        unknown_tiles = False
        if inventory is not None:
            devices = sorted(inventory.devices, key=lambda d: card_sort_key(d.id))
            cards = [d.id for d in devices]
            healthy = [d.healthy for d in devices]
            memory = [d.memory for d in devices]
            tiles = [advertised_tiles(d.attributes) for d in devices]
            unknown_tiles = any(d.healthy and TILES_UNKNOWN in d.attributes for d in devices)
        else:
            cards = cards_from_labels(node.labels)
            healthy = [True] * len(cards)
        if not cards:
            return None
        check_device_count(node.name, "Intel cards", len(cards))
        # Allocatable counts the cards a device plugin or the advertiser can serve, so an unhealthy card is not in it.
        serving = max(1, sum(healthy))
        capacity = {
            r: [amount // serving] * len(cards) for r, amount in node.allocatable.items() if r.startswith(PREFIX)
        }
        # Tiles are booked one by one (`IntelGasNodeState.tile_free`): a node claiming more per card than any Intel
        # card has is read as having at most MAX_TILES_PER_CARD, so the books stay small whatever it advertises.
        if TILES in capacity:
            capacity[TILES] = [min(amount, MAX_TILES_PER_CARD) for amount in capacity[TILES]]
            # Each card's own tiles, when the advertiser counted them for every card that serves: split evenly, a
            # card of one tile beside one of three was booked two, and its mask named a tile it does not have.
            if unknown_tiles:  # the advertiser could not count a card's: every mask past it would be misnumbered
                capacity[TILES] = [0] * len(cards)
            elif tiles and all(t for t, ok in zip(tiles, healthy, strict=True) if ok):
                even = capacity[TILES][0]  # a failed card that never said keeps what its pods hold of the split
                capacity[TILES] = [t or even for t in tiles]
        # Each card's own local memory, when the inventory says it for every card that serves: cards of unequal
        # memory are not the even split GAS assumes.
        if MEMORY in capacity and memory and all(m for m, ok in zip(memory, healthy, strict=True) if ok):
            even = capacity[MEMORY][0]  # a failed card that never said keeps what its pods hold of the split
            capacity[MEMORY] = [m or even for m in memory]
        return IntelGasNodeState(node.name, cards, healthy, capacity)

    @hookimpl
    def kubegpu_scheduler_validate(self, pod: PodRequest) -> Status | None:
        problem = pod_needs(pod).problem
        return Status.unresolvable(problem, plugin=NAME) if problem else None

    @hookimpl
    def kubegpu_scheduler_prepare(self, pod: PodRequest) -> IntelGasPodState:
        return pod_needs(pod)

    @hookimpl
    def kubegpu_scheduler_fit(self, state: IntelGasNodeState, pod: PodRequest, prepared: IntelGasPodState) -> Status:
        result = _placement(state, pod, prepared, choose=False)
        return result if isinstance(result, Status) else Status.success()

    @hookimpl
    def kubegpu_scheduler_score(self, state: IntelGasNodeState, pod: PodRequest, prepared: IntelGasPodState) -> float:
        result = _placement(state, pod, prepared, choose=True)
        return 0.0 if isinstance(result, Status) else result.score

    @hookimpl
    def kubegpu_scheduler_allocate(
        self, state: IntelGasNodeState, pod: PodRequest, prepared: IntelGasPodState
    ) -> PluginAllocation | None:
        result = _placement(state, pod, prepared, choose=True)
        if isinstance(result, Status):
            return None
        needs = prepared.needs
        if not any(needs):
            return PluginAllocation(plugin=NAME)
        containers: dict[str, dict[str, list[str]]] = {}
        shares: dict[str, dict[str, dict[str, int]]] = {}
        columns: list[str] = []
        tile_columns: list[list[tuple[str, tuple[int, ...]]]] = []
        named_tiles: dict[str, dict[str, list[int]]] = {}
        picks = pod_tiles(state, prepared, result.cards)
        if picks is None:  # the amounts fit (choose_cards), so the tiles do: books that disagree place nothing
            return None
        for container, need, picked, taken in zip(pod.containers, needs, result.cards, picks[0], strict=True):
            tile_columns.append([])
            if need is None or picked is None:
                columns.append("")
                continue
            names = [state.cards[i] for i in picked]
            containers[container.name] = {r: list(names) for r, _ in need.per_card}
            shares[container.name] = {r: dict.fromkeys(names, amount) for r, amount in need.per_card}
            columns.append(",".join(names))
            for i, chosen in taken.items():
                tile_columns[-1].append((state.cards[i], chosen))
                named_tiles.setdefault(container.name, {})[state.cards[i]] = list(chosen)
        init_tiles = {
            name: {state.cards[i]: list(tiles) for i, tiles in by_card.items()}
            for name, by_card in result.init_tiles.items()
        }
        annotations = {TS_ANNOTATION: str(time.time_ns()), CARDS_ANNOTATION: "|".join(columns)}
        fields: dict[str, object] = {}
        if named_tiles or init_tiles:
            if named_tiles:
                annotations[TILES_ANNOTATION] = gas_tiles_annotation(tile_columns)
            most = max(state.tile_count)
            fields = {TILES_FIELD: named_tiles, TILES_PER_CARD_FIELD: most}
            if init_tiles:
                fields[INIT_TILES_FIELD] = init_tiles
            # Level Zero numbers a container's tiles card after card: on cards of fewer tiles than the most, the
            # node side needs each card's own to number them (`tiles.affinity_mask`)
            named = sorted(
                {card for by_card in (*named_tiles.values(), *init_tiles.values()) for card in by_card},
                key=card_sort_key,
            )
            counts = {card: state.tile_count[state.cards.index(card)] for card in named}
            if any(count != most for count in counts.values()):
                fields[CARD_TILES_FIELD] = counts
        return PluginAllocation(
            plugin=NAME, containers=containers, shares=shares, fields=fields, annotations=annotations
        )


# ----------------------------------------------------------------------------------------------------------
# Placement: the GAS rules on one node
# ----------------------------------------------------------------------------------------------------------


# fit on a one-container pod only needs to know that enough cards fit; the choice waits for score/allocate.
_FITS = IntelGasPlacement(cards=(), score=0.0)


def _placement(
    state: IntelGasNodeState, pod: PodRequest, needs: IntelGasPodState, *, choose: bool
) -> IntelGasPlacement | Status:
    """fit, score and allocate ask in turn about the same pod and node: compute once per state version. The engine
    prepares one `needs` per pod signature (annotations included), so it keys the memo for every equal pod."""
    memo = state.memo
    if memo is not None and memo[0] == state.version and memo[1] is needs:
        cached = memo[2]
        if cached is not _FITS or not choose:
            return cached
    result = _place(state, pod, needs, choose)
    state.memo = (state.version, needs, result)
    return result


def _place(
    state: IntelGasNodeState, pod: PodRequest, needs: IntelGasPodState, choose: bool
) -> IntelGasPlacement | Status:
    if needs.problem:
        return Status.unresolvable(needs.problem, plugin=NAME)
    intel = [need for need in needs.needs if need is not None]
    if not intel:
        return IntelGasPlacement(cards=tuple(None for _ in needs.needs), score=0.0)
    pool = candidate_cards(state, pod.annotations)
    steps = init_tile_steps(pod)
    if not choose and not steps and len(intel) == 1 and fits_alone(state, intel[0], pool):
        return _FITS
    result = choose_cards(state, needs.needs, pool, state.usage, needs.same)
    if isinstance(result, IntelGasPlacement):
        if not steps:
            return result
        plan = init_tile_plan(state, needs, result.cards, steps)
        if isinstance(plan, Refusal):
            refuse = Status.unresolvable if plan.final else Status.unschedulable
            return refuse(plan.reason, plugin=NAME)
        return replace(result, init_tiles=plan)
    if result.final:
        return Status.unresolvable(result.reason, plugin=NAME)
    # A pod whose own containers crowd each other out would not fit on this node even with every card free.
    on_free_node = choose_cards(state, needs.needs, pool, state.unused, needs.same)
    if isinstance(on_free_node, Refusal):
        return Status.unresolvable(on_free_node.reason, plugin=NAME)
    return Status.unschedulable(result.reason, plugin=NAME)


def pod_tiles(
    state: IntelGasNodeState, needs: IntelGasPodState, cards: Sequence[tuple[int, ...] | None]
) -> tuple[list[dict[int, tuple[int, ...]]], list[int]] | None:
    """Each container's tiles (per container: card index -> tiles), the lowest free ones of each of its cards in
    spec order, and the cards' free tiles after the pod's; None when some card has too few free."""
    tile_free = list(state.tile_free)  # less what the pod's earlier containers take
    taken: list[dict[int, tuple[int, ...]]] = []
    for need, picked in zip(needs.needs, cards, strict=True):
        taken.append({})
        per_card = dict(need.per_card).get(TILES, 0) if need is not None else 0
        for i in picked if per_card and picked is not None else ():
            chosen = pick_tiles(tile_free[i], per_card)
            if chosen is None:
                return None
            tile_free[i] &= ~sum(1 << t for t in chosen)
            taken[-1][i] = chosen
    return taken, tile_free


def init_tile_steps(pod: PodRequest) -> tuple[InitStep, ...]:
    """The pod's classic init containers that ask tiles of their cards."""
    return tuple(step for step in pod.init_steps if step.resources.get(TILES, 0) > 0)


def init_tile_plan(
    state: IntelGasNodeState,
    needs: IntelGasPodState,
    cards: Sequence[tuple[int, ...] | None],
    steps: Sequence[InitStep],
) -> dict[str, dict[int, tuple[int, ...]]] | Refusal:
    """Each classic init container's tiles (card index -> tiles), as kube-scheduler counts an init container beside
    the others: it runs before them, alone but for the sidecars started before it, so on the card it is given (the
    cards `init_devices` names it: the first container's holding as many) it takes the lowest of the tiles the pod's
    containers hold there, which are not in use yet, the sidecars' left out; where it asks more than that, the pod
    holds the lowest free tiles of the card besides, as many as its most demanding init container lacks, and the
    init containers share them in turn (`claimed` books them). A Refusal when the card has too few tiles (`final`)
    or too few free."""
    picks = pod_tiles(state, needs, cards)
    if picks is None:
        return Refusal("the pod's tiles do not fit the cards chosen for it", final=False)
    taken, tile_free = picks
    containers: dict[str, dict[str, list[str]]] = {}
    shares: dict[str, dict[str, dict[str, int]]] = {}
    held: dict[str, dict[int, tuple[int, ...]]] = {}
    for need, picked, tiles in zip(needs.needs, cards, taken, strict=True):
        if need is None or picked is None:
            continue
        names = [state.cards[i] for i in picked]
        containers[need.container] = {r: list(names) for r, _ in need.per_card}
        shares[need.container] = {r: dict.fromkeys(names, amount) for r, amount in need.per_card}
        held[need.container] = tiles
    given, _ = init_devices(containers, shares, tuple(steps))
    wanted: list[tuple[str, int, int, tuple[int, ...]]] = []  # (init container, card, tiles it asks, pod's usable)
    lacking: dict[int, int] = {}  # card -> the most tiles an init container lacks there
    for step in steps:
        count = step.resources.get(I915) or step.resources.get(XE) or 0
        ids = (given.get(step.name) or {}).get(I915) or (given.get(step.name) or {}).get(XE) or []
        per_card = step.resources[TILES] // count if count else 0
        if not ids or not per_card:
            continue  # no card of the pod's is named to it (nor then tiles), or it asks less than one of each
        for card in ids:
            i = state.index[card]
            if per_card > state.tile_count[i]:
                return Refusal(
                    f"init container {step.name} asks {per_card} tile(s) of {card}, which has {state.tile_count[i]}",
                    final=True,
                )
            running = {t for sidecar in step.sidecars for t in held.get(sidecar, {}).get(i, ())}
            usable = tuple(sorted({t for tiles in held.values() for t in tiles.get(i, ())} - running))
            wanted.append((step.name, i, per_card, usable))
            lacking[i] = max(lacking.get(i, 0), per_card - len(usable))
    extra: dict[int, tuple[int, ...]] = {}
    for i, count in lacking.items():
        if count <= 0:
            continue
        chosen = pick_tiles(tile_free[i], count)
        if chosen is None:
            return Refusal(
                f"{state.cards[i]} has {bin(tile_free[i]).count('1')} free tile(s) besides the pod's; its init "
                f"container needs {count} more there",
                final=False,
            )
        extra[i] = chosen
    plan: dict[str, dict[int, tuple[int, ...]]] = {}
    for name, i, per_card, usable in wanted:
        plan.setdefault(name, {})[i] = tuple(sorted((*usable, *extra.get(i, ()))[:per_card]))
    return plan


# ----------------------------------------------------------------------------------------------------------
# Factory
# ----------------------------------------------------------------------------------------------------------

# What the entry point names (`kubegpu.plugins.intel_gas.scheduler:plugin`), as a pip-installed plugin's.
plugin = IntelGasPlugin()
