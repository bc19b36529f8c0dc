"""Tiles of Intel GPU cards: which tiles a container gets, how the allocation names them, the mask the node side sets.

A multi-tile card (a Data Center GPU Max 1550 has two) is shared tile by tile: a container asking
`gpu.intel.com/i915: 1` and `gpu.intel.com/tiles: 1` gets one tile of one card, and another container the card's
other tile. The scheduler side books each tile (`IntelGasNodeState.tile_free`: per card, a bitmask of the tiles nobody
holds) and gives a container the *lowest* free tiles of each of its cards (`pick_tiles`; GAS takes any free ones);
the amount `gpu.intel.com/tiles` per card, which GAS counts too, keeps a card's tiles from going over its count.

The allocation names the tiles in the intel-gas plugin's own fields, signed with the rest (`TILES_FIELD`: container
-> card -> tile numbers; `TILES_PER_CARD_FIELD`: the node's tiles per card; `CARD_TILES_FIELD`: each named card's
own, on a node whose cards have unequal tiles; `INIT_TILES_FIELD`: a classic init container's, of its pod's
tiles and those the pod holds for it besides), and, for Intel's GPU plugin, in GAS's pod
annotation `gas-container-tiles` (`gas_tiles_annotation`): containers in spec order separated by `|` (a container
given no tile is an empty string), its cards by `,`, each card as `cardN:` and its tiles as `gtK` joined by `+`:
`card0:gt0+gt1|card1:gt1,card2:gt0`. The tile numbers are the card's `gt` directories in sysfs
(`/sys/class/drm/cardN/gt/gtK`).

The node side sets Level Zero's `ZE_AFFINITY_MASK` from the signed fields (`affinity_mask`), as Intel's GPU plugin does
from the annotation: in Level Zero's default FLAT device hierarchy every tile of every card the container sees is a
device of its own, numbered card after card (the container's cards in card order), so card position p, tile t is device
`p * tiles_per_card + t` (`0,1`, `3`), or, on cards of unequal tiles, the tiles of the cards before it plus t; where the
container's own env sets `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE`, a card is one device and a tile its sub-device: `p.t`
(`0.0,1.1`). A card of one tile needs no mask. The node side sets `ZE_FLAT_DEVICE_HIERARCHY` to the hierarchy the mask
was written in (`mask_hierarchy`), so that neither the image's own ENV nor a spelling Level Zero reads otherwise turns a
tile's number into a whole card's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubegpu.core.kit import bit_indices, lowest_bits

__all__ = [
    "AFFINITY_ENV",
    "CARD_TILES_FIELD",
    "HIERARCHY_ENV",
    "INIT_TILES_FIELD",
    "TILES_FIELD",
    "TILES_PER_CARD_FIELD",
    "TILES_UNKNOWN",
    "advertised_tiles",
    "affinity_mask",
    "gas_tiles_annotation",
    "mask_hierarchy",
    "pick_tiles",
    "read_card_tiles",
    "read_tiles_field",
    "read_tiles_per_card",
]

AFFINITY_ENV = "ZE_AFFINITY_MASK"
HIERARCHY_ENV = "ZE_FLAT_DEVICE_HIERARCHY"
TILES_FIELD = "tiles"
TILES_PER_CARD_FIELD = "tilesPerCard"
# classic init container -> card -> tile numbers: the pod's tiles on the card it is given (the containers after it
# are not running yet), and where it asks more, tiles booked for the pod besides (kube-scheduler's max of the init
# containers and the sum of the others, per card)
INIT_TILES_FIELD = "initTiles"
# card -> its tiles, for the cards given tiles, where a node's cards have unequal tiles (`tilesPerCard` is the most)
CARD_TILES_FIELD = "cardTiles"
# The attribute a card's inventory carries instead of `tiles` where the advertiser could not count them: why. The
# node then offers no tiles, and the scheduler books none there: a mask numbers every card's tiles (T207).
TILES_UNKNOWN = "tilesUnknown"
# The most tiles kubegpu books on one card: Intel's cards have 1 or 2; a node advertising more per card is read as is,
# up to this, so a tile bitmask stays a small integer whatever `gpu.intel.com/tiles` a node claims.
MAX_TILES_PER_CARD = 64


def pick_tiles(free: int, count: int) -> tuple[int, ...] | None:
    """The `count` lowest tiles of the bitmask `free`, or None when fewer are free."""
    bits = lowest_bits(free, count)
    return None if bits is None else tuple(bit_indices(bits))


def gas_tiles_annotation(columns: Sequence[Sequence[tuple[str, Sequence[int]]]]) -> str:
    """GAS's `gas-container-tiles` value: one column per container in spec order (its (card, tiles) pairs in card
    order; empty for a container given no tile)."""
    return "|".join(
        ",".join(f"{card}:" + "+".join(f"gt{tile}" for tile in tiles) for card, tiles in column) for column in columns
    )


def read_tiles_field(fields: Mapping[str, Any], container: str, name: str = TILES_FIELD) -> dict[str, list[int]] | str:
    """The container's tiles by card from the plugin's fields (`name`: `TILES_FIELD`, or `INIT_TILES_FIELD` for a
    classic init container; `{}`: none, as every allocation before tiles were booked), or why the fields cannot be
    read: a card name that is not `cardN`, a tile that is not a number from 0 to `MAX_TILES_PER_CARD - 1`, a tile
    named twice."""
    by_container = fields.get(name) or {}
    if not isinstance(by_container, dict):
        return f"the allocation's {name} field is not a map of containers"
    given = by_container.get(container) or {}
    if not isinstance(given, dict):
        return f"container {container}: the allocation's {name} is not a map of cards"
    tiles: dict[str, list[int]] = {}
    for card, numbers in given.items():
        if not isinstance(card, str) or not card.startswith("card") or not card[4:].isdigit():
            return f"container {container}: the allocation gives tiles of {str(card)[:40]!r}, which is not a card"
        if not isinstance(numbers, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < MAX_TILES_PER_CARD for t in numbers
        ):
            return (
                f"container {container}: the tiles of {card} are not numbers from 0 to {MAX_TILES_PER_CARD - 1}: "
                f"{str(numbers)[:80]}"
            )
        if len(set(numbers)) != len(numbers):
            return f"container {container}: the allocation names a tile of {card} twice: {numbers}"
        tiles[card] = sorted(numbers)
    return tiles


def advertised_tiles(attributes: Mapping[str, Any]) -> int | None:
    """The tiles the advertiser counted on a card (its inventory's `tiles` attribute), None when it does not say or
    says something no card has."""
    tiles = attributes.get("tiles")
    if isinstance(tiles, int) and not isinstance(tiles, bool) and 0 < tiles <= MAX_TILES_PER_CARD:
        return tiles
    return None


def read_tiles_per_card(fields: Mapping[str, Any]) -> int:
    """The node's tiles per card the allocation was placed with (0 when it does not say)."""
    value = fields.get(TILES_PER_CARD_FIELD, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TILES_PER_CARD:
        return 0
    return value


def read_card_tiles(fields: Mapping[str, Any]) -> dict[str, int] | str:
    """Each card's tiles as the allocation says them (`CARD_TILES_FIELD`; empty when it does not: the node's cards
    have `tilesPerCard` each), or what is wrong with the field."""
    value = fields.get(CARD_TILES_FIELD) or {}
    if not isinstance(value, dict) or not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_TILES_PER_CARD for n in value.values()
    ):
        return f"the allocation's {CARD_TILES_FIELD} is not a map of cards to numbers from 1 to {MAX_TILES_PER_CARD}"
    return {str(card): n for card, n in value.items()}


def mask_hierarchy(hierarchy: str) -> str:
    """The device hierarchy a mask is written in for a container whose env says `hierarchy`: COMPOSITE where it asks
    for it (in any spelling), else FLAT (Level Zero's default; COMBINED numbers its root devices as FLAT does). The
    node side sets it beside the mask (`device.py`), so that Level Zero reads the mask as it was written, whatever
    the image's own ENV or the spelling says: in COMPOSITE, the FLAT mask `0` is the whole of the first card."""
    return "COMPOSITE" if hierarchy.strip().upper() == "COMPOSITE" else "FLAT"


def affinity_mask(
    cards: Sequence[str], tiles: Mapping[str, Sequence[int]], per_card: int | Mapping[str, int], hierarchy: str
) -> str:
    """Level Zero's `ZE_AFFINITY_MASK` for a container seeing `cards` (in the order its devices are listed) and given
    `tiles` of them, on cards of `per_card` tiles (each card's own, where they differ): FLAT numbering (the tiles of
    the cards before, plus `t`) unless `hierarchy` is COMPOSITE (`p.t`, `mask_hierarchy`); "" when there is nothing
    to mask (no tiles, or cards of one tile)."""
    counts = [per_card if isinstance(per_card, int) else per_card.get(card, 0) for card in cards]
    if max(counts, default=0) <= 1:
        return ""
    composite = mask_hierarchy(hierarchy) == "COMPOSITE"
    entries: list[str] = []
    before = 0  # FLAT: the devices (tiles) of the cards listed before this one
    for position, (card, count) in enumerate(zip(cards, counts, strict=True)):
        for tile in sorted(tiles.get(card, ())):
            entries.append(f"{position}.{tile}" if composite else str(before + tile))
        before += count
    return ",".join(entries)
