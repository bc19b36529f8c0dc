"""The intel-gas plugin, node side: find Intel GPU cards on a host and hand a container its cards.

Discovery reads only the host root it is given:

* **Cards** are the DRM directories `sys/class/drm/cardN` (connectors such as `card0-DP-1` and render nodes
  `renderD128` are not cards) whose `device/vendor` reads `0x8086`. The card name (`card0`) is the device id the
  allocation uses.
* **Details**, all optional: `device/device` (the PCI device id, e.g. `0x56c0`, used as the model),
  `lmem_total_bytes` or `device/lmem_total_bytes` (local memory in bytes), the render node under `device/drm/`
  (`renderD128`), the kernel driver (`device/driver` -> `i915` or `xe`) and the PCI address.
* **Tiles**, counted as Intel's GPU labeler counts them: the `gt/gtN` directories of the card (i915) and the
  `device/tileN` ones (xe), 1 when there are none (a card is one tile), at most 64. A card whose directory of
  either exists but cannot be read has, instead of `tiles`, `tilesUnknown` saying why.

The inventory: devices `{"id": "cardN", "model": "0x56c0", "memory", "attributes": {"render", "driver",
"pciAddress", "tiles"}}`; no topology (GAS has none). The scheduler side reads the ids and health.

Health: a card whose sysfs directory has disappeared is unhealthy.

Advertisement: `gpu.intel.com/i915` (or `gpu.intel.com/xe` for cards driven by `xe`) = healthy cards, one container
per card as the Intel device plugin's default; `gpu.intel.com/millicores` = 1000 per healthy card,
`gpu.intel.com/tiles` = their tiles (the resource NFD makes of the labeler's `gpu.intel.com/tiles` label, which GAS
and kubegpu book tile by tile; 0 while a healthy card's tiles are unknown, logged once: a container's mask numbers
the tiles of its cards one after another, so one card counted wrong moves its neighbours' numbers) and
`gpu.intel.com/memory.max` = their local memory when every card says how much it has. Labels, as the Intel GPU
labeler writes them, listing the healthy cards: `gpu.intel.com/gpu-numbers` = `0.1` (continued in `gpu-numbers2`,
`...3`, each starting with `Z`, when longer than a label value may be) and the deprecated `gpu.intel.com/cards` =
`card0.card1` (left out when too long: GAS reads `gpu-numbers` first).

Device-plugin ids (`kubegpu device-plugin`): the card names for `gpu.intel.com/i915` (or `xe`), one container per
card; `millicores` and `memory.max` are per-card amounts, not device ids, and stay node capacity.

Owned (`kubegpu_device_owned`; the CRI shim removes these from every container, then adds back what the allocation
grants): the DRM nodes `/dev/dri/cardN` and `/dev/dri/renderDN`, `KUBEGPU_INTEL_CARDS` (it selects nothing, but a
value the plugin did not write would misreport the cards), `ZE_AFFINITY_MASK` (a tenant's own would reach the other
tiles of a card it shares) and CDI names of kind `intel.com/gpu`.

Container edit (the CRI shim, after it verified the allocation): the container's cards are the union of the card
names under its `gpu.intel.com/*` resources.

* every `/dev/dri/cardN` and `/dev/dri/renderDN` entry (by container or host path) is removed, then each card's
  `/dev/dri/cardN` and its render node are added from `dev_root/dri/`. The render node is the one
  `dev_root/dri/by-path/` pairs with the card (`pci-...-card` and `pci-...-render` links); without those links,
  `renderD(128+N)` when that file exists;
* env `KUBEGPU_INTEL_CARDS=card0,card1` (for tools and logs: Level Zero and VA-API find the cards through the
  device nodes the container has);
* env `ZE_AFFINITY_MASK` when the allocation gives the container tiles (its fields `tiles`, `tilesPerCard`:
  `tiles.py`), in Level Zero's FLAT numbering (`0,1`; `p.t` where the container's env sets
  `ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE`), so a container given one tile of a card sees that tile only; none for whole
  cards or cards of one tile; beside it `ZE_FLAT_DEVICE_HIERARCHY` set to the hierarchy the mask is written in
  (FLAT or COMPOSITE), so that an image's own ENV cannot make Level Zero read a tile's number as a card's;
* CDI names `intel.com/gpu=cardN` (Intel's CDI vendor and class, named after the DRM card), replacing any other
  name of that kind in the CDI device list and in `cdi.k8s.io/*` annotations.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.models import (
    Advertisement,
    ContainerAllocation,
    ContainerEdit,
    DeviceInfo,
    DeviceInventory,
    DeviceNode,
    DeviceOwnership,
    Scalar,
)
from kubegpu.plugins.intel_gas import I915, MEMORY, MILLICORES, NAME, PREFIX, RESOURCES, TILES, XE
from kubegpu.plugins.intel_gas.cards import CARDS_LABEL, CONTINUATION_MARK, GPU_NUMBERS_LABEL, card_sort_key
from kubegpu.plugins.intel_gas.tiles import (
    AFFINITY_ENV,
    HIERARCHY_ENV,
    INIT_TILES_FIELD,
    MAX_TILES_PER_CARD,
    TILES_UNKNOWN,
    advertised_tiles,
    affinity_mask,
    mask_hierarchy,
    read_card_tiles,
    read_tiles_field,
    read_tiles_per_card,
)

__all__ = ["CARDS_ENV", "CDI_KIND", "NAME", "OWNED", "RESOURCES", "discover", "split_label"]

# ----------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------

INTEL_VENDOR = "0x8086"
DRM = Path("sys/class/drm")
CARDS_ENV = "KUBEGPU_INTEL_CARDS"
CDI_KIND = "intel.com/gpu"
OWNED = DeviceOwnership(
    envs=(CARDS_ENV, AFFINITY_ENV),
    device_paths=(r"/dev/dri/card[0-9]+", r"/dev/dri/renderD[0-9]+"),
    cdi_kinds=(CDI_KIND,),
)
RENDER_BASE = 128
LABEL_LIMIT = 63

_CARD = re.compile(r"card(0|[1-9][0-9]*)")
_RENDER = re.compile(r"renderD[0-9]+")
_DRI_NODE = re.compile(r"card[0-9]+|renderD[0-9]+")
_GT = re.compile(r"gt[0-9]+")
_TILE = re.compile(r"tile[0-9]+")

log = logging.getLogger(__name__)
_unknown_reported: tuple[str, ...] = ()  # the cards whose unknown tiles were last logged


# ----------------------------------------------------------------------------------------------------------
# Hook implementations
# ----------------------------------------------------------------------------------------------------------


@hookimpl
def kubegpu_device_resources() -> list[str]:
    return list(RESOURCES)


@hookimpl
def kubegpu_device_owned() -> DeviceOwnership:
    return OWNED


@hookimpl
def kubegpu_device_discover(host_root: Path) -> DeviceInventory | None:
    return discover(host_root)


@hookimpl
def kubegpu_device_health(host_root: Path, inventory: DeviceInventory) -> dict[str, bool]:
    return {d.id: (host_root / DRM / d.id).is_dir() for d in inventory.devices}


@hookimpl
def kubegpu_device_advertise(inventory: DeviceInventory) -> Advertisement:
    cards = sorted(inventory.devices, key=lambda d: card_sort_key(d.id))
    healthy = [d for d in cards if d.healthy]
    capacity: dict[str, int] = {}
    for card in cards:
        resource = XE if card.attributes.get("driver") == "xe" else I915
        capacity[resource] = capacity.get(resource, 0) + (1 if card.healthy else 0)
    capacity[MILLICORES] = 1000 * len(healthy)
    unknown = [card for card in healthy if TILES_UNKNOWN in card.attributes]
    # A card whose tiles are unknown cannot be numbered past: Level Zero's FLAT numbers of the tiles of the cards
    # after it in a container depend on it. No tile is offered on the node (whole cards still are) until it reads.
    capacity[TILES] = 0 if unknown else sum(_tiles(card) for card in healthy)
    _report_unknown_tiles(unknown)
    if cards and all(c.memory for c in cards):
        capacity[MEMORY] = sum(c.memory or 0 for c in healthy)
    numbers = ".".join(m.group(1) for c in healthy if (m := _CARD.fullmatch(c.id)))
    labels = split_label(GPU_NUMBERS_LABEL, numbers)
    names = ".".join(c.id for c in healthy)
    if len(names) <= LABEL_LIMIT:
        labels[CARDS_LABEL] = names
    return Advertisement(capacity=capacity, labels=labels)


@hookimpl
def kubegpu_device_plugin_ids(inventory: DeviceInventory) -> dict[str, dict[str, bool]]:
    ids: dict[str, dict[str, bool]] = {}
    for card in sorted(inventory.devices, key=lambda d: card_sort_key(d.id)):
        ids.setdefault(XE if card.attributes.get("driver") == "xe" else I915, {})[card.id] = card.healthy
    return ids


@hookimpl
def kubegpu_device_edit_container(allocation: ContainerAllocation, edit: ContainerEdit, dev_root: Path) -> bool | None:
    names = {card for resource, ids in allocation.resources.items() if resource.startswith(PREFIX) for card in ids}
    if not names:
        return None
    for card in names:
        if _CARD.fullmatch(card) is None:
            raise ValueError(f"allocation names {card!r}, which is not an Intel GPU card (card0, card1, ...)")
    cards = sorted(names, key=card_sort_key)
    renders = render_nodes(dev_root / "dri")

    edit.devices = [d for d in edit.devices if not (_is_dri_node(d.container_path) or _is_dri_node(d.host_path))]
    for card in cards:
        edit.devices.append(DeviceNode(host_path=str(dev_root / "dri" / card), container_path=f"/dev/dri/{card}"))
        render = renders.get(card)
        if render is None:
            fallback = f"renderD{RENDER_BASE + int(card[4:])}"
            render = fallback if (dev_root / "dri" / fallback).exists() else None
        if render is not None:
            edit.devices.append(
                DeviceNode(host_path=str(dev_root / "dri" / render), container_path=f"/dev/dri/{render}")
            )
    edit.envs[CARDS_ENV] = ",".join(cards)
    hierarchy = edit.envs.get(HIERARCHY_ENV, "")
    mask = tile_mask(allocation, cards, hierarchy)
    if mask:
        edit.envs[AFFINITY_ENV] = mask
        # Set, not left to the image's ENV (which the edit never sees, and which the container's config outranks):
        # read as COMPOSITE, the FLAT mask of tile 0 would be the whole card.
        edit.envs[HIERARCHY_ENV] = mask_hierarchy(hierarchy)
    else:
        edit.envs.pop(AFFINITY_ENV, None)
    edit.replace_cdi_devices(CDI_KIND, [f"{CDI_KIND}={card}" for card in cards])
    return True


# ----------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------


def discover(host_root: Path) -> DeviceInventory | None:
    """The inventory of the Intel cards under `host_root`, or None when there are none."""
    drm = host_root / DRM
    if not drm.is_dir():
        return None
    devices = []
    for entry in sorted(drm.iterdir(), key=lambda p: card_sort_key(p.name)):
        if _CARD.fullmatch(entry.name) is None or not entry.is_dir():
            continue
        device = entry / "device"
        if (_read(device / "vendor") or "").lower() != INTEL_VENDOR:
            continue
        attributes: dict[str, Scalar] = {}
        render = _render_of(device / "drm")
        if render:
            attributes["render"] = render
        driver = _link_name(device / "driver")
        if driver:
            attributes["driver"] = driver
        address = _link_name(device)
        if address and re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", address):
            attributes["pciAddress"] = address
        tiles = tile_count(entry)
        attributes[TILES_UNKNOWN if isinstance(tiles, str) else "tiles"] = tiles
        memory = _positive(_read(entry / "lmem_total_bytes")) or _positive(_read(device / "lmem_total_bytes"))
        devices.append(
            DeviceInfo(
                id=entry.name,
                model=(_read(device / "device") or "").lower() or None,
                memory=memory,
                attributes=attributes,
            )
        )
    if not devices:
        return None
    return DeviceInventory(plugin=NAME, devices=devices)


def tile_count(card: Path) -> int | str:
    """The tiles of the card at `card` (`sys/class/drm/cardN`): its `gt/gtN` directories (i915) and `device/tileN`
    ones (xe), as Intel's GPU labeler counts them; 1 when it shows none, at most MAX_TILES_PER_CARD. Or why they
    cannot be counted: a directory there that exists but cannot be read. Counted as one tile, such a card shifted
    the Level Zero FLAT numbers of the tiles of every card after it in a container's mask (T207)."""
    found = 0
    for parent, pattern in ((card / "gt", _GT), (card / "device", _TILE)):
        try:
            with os.scandir(parent) as entries:
                found += sum(1 for e in entries if pattern.fullmatch(e.name) and e.is_dir())
        except FileNotFoundError:
            continue  # no `gt` (xe) or no `tileN` (i915): that driver's way of showing tiles is not used
        except OSError as exc:
            return f"{DRM}/{card.name}/{parent.name} cannot be read: {exc.strerror or exc}"
        if found >= MAX_TILES_PER_CARD:
            break
    return min(max(found, 1), MAX_TILES_PER_CARD)


def _report_unknown_tiles(cards: list[DeviceInfo]) -> None:
    """Say once, when it changes, which cards keep the node from offering tiles (advertise runs every interval)."""
    global _unknown_reported
    said = tuple(f"{card.id} ({card.attributes[TILES_UNKNOWN]})" for card in cards)
    if said == _unknown_reported:
        return
    _unknown_reported = said
    if said:
        log.warning(
            "%s = 0 on this node: the tiles of %s are unknown, and a container's tile mask numbers every card's "
            "tiles; whole cards (%s) are still offered. Make the card's sysfs readable to the advertiser",
            TILES,
            ", ".join(said),
            I915,
        )
    else:
        log.info("every card's tiles are known again: %s offered", TILES)


def _tiles(card: DeviceInfo) -> int:
    """A discovered card's tiles; 1 for an inventory written before they were counted."""
    return advertised_tiles(card.attributes) or 1


def tile_mask(allocation: ContainerAllocation, cards: list[str], hierarchy: str) -> str:
    """The container's `ZE_AFFINITY_MASK` from the tiles the allocation's fields give it ("" when none: whole
    cards). Raises `ValueError` for tiles the allocation cannot give: of a card the container does not have, or past
    the node's tiles per card (they would number another card's tiles)."""
    tiles = read_tiles_field(allocation.fields, allocation.container)
    if tiles == {}:  # a classic init container's are named apart (tiles of its pod's, `INIT_TILES_FIELD`)
        tiles = read_tiles_field(allocation.fields, allocation.container, INIT_TILES_FIELD)
    if isinstance(tiles, str):
        raise ValueError(tiles)
    if not tiles:
        return ""
    per_card = read_tiles_per_card(allocation.fields)
    own = read_card_tiles(allocation.fields)
    if isinstance(own, str):
        raise ValueError(own)
    counts = {card: own.get(card, per_card) for card in cards}
    for card, numbers in tiles.items():
        if card not in cards:
            raise ValueError(f"the allocation gives tiles of {card}, which is not one of the container's cards {cards}")
        if not counts[card] or max(numbers, default=0) >= counts[card]:
            raise ValueError(f"the allocation gives tile(s) {numbers} of {card}, a card of {counts[card]} tile(s)")
    return affinity_mask(cards, tiles, counts, hierarchy)


def split_label(name: str, value: str) -> dict[str, str]:
    """A label value split as the Intel GPU labeler does: `name` holds the first 63 characters, `name2`, `name3`,
    ... the rest, each prefixed with `Z`. Every piece ends with a digit, as a label value must end alphanumeric."""
    labels: dict[str, str] = {}
    rest, key, room, prefix, index = value, name, LABEL_LIMIT, "", 2
    while True:
        piece = rest[:room]
        if len(rest) > room:
            piece = piece.rstrip(".")
        labels[key] = prefix + piece
        rest = rest[len(piece) :]
        if not rest:
            return labels
        key, room, prefix, index = f"{name}{index}", LABEL_LIMIT - len(CONTINUATION_MARK), CONTINUATION_MARK, index + 1


def render_nodes(dri: Path) -> dict[str, str]:
    """Card -> render node, from the `dri/by-path` links that pair them (`pci-0000:03:00.0-card` -> `../card1`,
    `pci-0000:03:00.0-render` -> `../renderD129`)."""
    by_path = dri / "by-path"
    if not by_path.is_dir():
        return {}
    cards: dict[str, str] = {}
    renders: dict[str, str] = {}
    for link in by_path.iterdir():
        target = Path(os.readlink(link)).name if link.is_symlink() else ""
        if link.name.endswith("-card") and _CARD.fullmatch(target):
            cards[link.name.removesuffix("-card")] = target
        elif link.name.endswith("-render") and _RENDER.fullmatch(target):
            renders[link.name.removesuffix("-render")] = target
    return {card: renders[slot] for slot, card in cards.items() if slot in renders}


def _render_of(drm: Path) -> str | None:
    if not drm.is_dir():
        return None
    found = sorted(p.name for p in drm.iterdir() if _RENDER.fullmatch(p.name))
    return found[0] if found else None


def _link_name(path: Path) -> str | None:
    try:
        return Path(os.readlink(path)).name if path.is_symlink() else None
    except OSError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _positive(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        number = int(text, 0)
    except ValueError:
        return None
    return number if number > 0 else None


def _is_dri_node(path: str) -> bool:
    node = Path(path)
    return node.parent.name == "dri" and _DRI_NODE.fullmatch(node.name) is not None
