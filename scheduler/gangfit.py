"""Where a gang goes in a topology: pure functions over each node's room (how many members fit there) and its place
in the levels. The engine (`engine/gangdomains.py`) measures the room, `engine/gangs.py` reserves; this module only
chooses.

The rules, after Kueue's topology-aware scheduling:

* A topology is a tree: the levels from the widest to the narrowest (a block label, a rack label, ...), then the
  nodes. A node without a level's label is in no domain of that level (it cannot serve a gang that requires it).
* `required` level: every member in one domain of that level, or none placed.
* Otherwise, the narrowest single domain that fits the whole gang: from the `preferred` level (default: the
  narrowest level) up to the widest (within the required domain, when one is asked for). A gang no single domain
  fits is split over as few domains as possible at each level (largest first, the last one the best fit).
* Best fit: among the domains that fit, the one with the least room to spare, so a 4-node gang does not break the
  only free 16-node rack. Ties go to the domain named first.
* The slots come out in domain order, so neighbouring ranks land in the same domain, then the neighbouring one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Fit", "Shortfall", "choose"]


@dataclass(frozen=True, slots=True)
class Fit:
    """Where the members go: (node, how many members) in rank order; the domain chosen at the required level (or
    the narrowest single domain that holds them all), as (level, value); None when the gang spans several."""

    slots: tuple[tuple[str, int], ...]
    level: str | None
    domain: str | None


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why no placement holds `need` members: the roomiest domain of `level` (None: the whole cluster) is `domain`,
    with room for `room` members on `nodes` nodes."""

    need: int
    level: str | None
    domain: str | None
    room: int
    nodes: int


_DIGITS = re.compile(r"([0-9]+)")


def natural(name: str) -> tuple[object, ...]:
    """A sort key that puts `node-2` before `node-10`. A run of ASCII digits compares as the number it writes, by
    its length and text without leading zeros (never `int`: a file's names and labels may hold any printable text,
    `²`, which is a digit to `str.isdigit` but not to `int`, or digits past what `int` reads)."""
    return tuple(
        (len(part.lstrip("0")), part.lstrip("0")) if i % 2 else part for i, part in enumerate(_DIGITS.split(name))
    )


class _Domain:
    __slots__ = ("_key", "children", "name", "nodes", "room")

    def __init__(self, name: str) -> None:
        self.name = name
        self._key: tuple[object, ...] | None = None
        self.room = 0
        self.nodes = 0
        self.children: dict[str, _Domain] = {}

    @property
    def key(self) -> tuple[object, ...]:
        """The name's `natural` sort key, made when first compared: a choice compares the domains of one path down
        the tree, not the thousands of nodes it holds (made for every node, the keys took most of a gang's try)."""
        if self._key is None:
            self._key = natural(self.name)
        return self._key


def _tree(rooms: Mapping[str, int], labels: Mapping[str, Mapping[str, str]], levels: Sequence[str]) -> _Domain:
    root = _Domain("")
    for node, room in rooms.items():
        if room <= 0:
            continue
        node_labels = labels.get(node, {})
        domain = root
        domain.room += room
        domain.nodes += 1
        for level in levels:
            value = node_labels.get(level, "")
            child = domain.children.get(value)
            if child is None:
                child = domain.children[value] = _Domain(value)
            domain = child
            domain.room += room
            domain.nodes += 1
        leaf = domain.children.setdefault(node, _Domain(node))
        leaf.room, leaf.nodes = room, 1
    return root


def _at(root: _Domain, depth: int) -> list[tuple[tuple[str, ...], _Domain]]:
    """The domains `depth` levels below the root, each with its path of values (the unlabelled left out)."""
    found: list[tuple[tuple[str, ...], _Domain]] = [((), root)]
    for _ in range(depth):
        found = [((*path, name), child) for path, domain in found for name, child in domain.children.items() if name]
    return found


def _best(candidates: list[tuple[tuple[str, ...], _Domain]], need: int) -> tuple[tuple[str, ...], _Domain] | None:
    fitting = [c for c in candidates if c[1].room >= need]
    return min(fitting, key=lambda c: (c[1].room, [natural(name) for name in c[0]])) if fitting else None


def _fill(domain: _Domain, need: int, out: list[tuple[str, int]]) -> None:
    """Slots for `need` members in `domain`: the best-fit single child if one holds them all, else as few children
    as possible, largest first, the last one the best fit for what is left."""
    if not domain.children:
        out.append((domain.name, min(domain.room, need)))
        return
    children = sorted(domain.children.values(), key=lambda c: (-c.room, c.key))
    single = [c for c in children if c.room >= need]
    if single:
        _fill(min(single, key=lambda c: (c.room, c.key)), need, out)
        return
    left = need
    chosen: list[_Domain] = []
    rest = list(children)
    while left > 0 and rest:
        fits = [c for c in rest if c.room >= left]
        child = min(fits, key=lambda c: (c.room, c.key)) if fits else rest[0]
        rest.remove(child)
        chosen.append(child)
        left -= child.room
    left = need
    for child in chosen:
        take = min(child.room, left)
        _fill(child, take, out)
        left -= take


def choose(
    rooms: Mapping[str, int],
    labels: Mapping[str, Mapping[str, str]],
    levels: Sequence[str],
    need: int,
    *,
    required: str | None = None,
    preferred: str | None = None,
) -> Fit | Shortfall:
    """Where `need` members go. `rooms`: each node's room (members that fit there, 0: none); `labels`: each node's
    labels; `levels`: the level labels, widest first, the hostname left out. A `required` or `preferred` label that
    is not among `levels` is a level of its own (the only one); `kubernetes.io/hostname` asks for one node."""
    asked = required or preferred
    if asked is not None and asked != "kubernetes.io/hostname" and asked not in levels:
        levels = (asked,)
    depth_of = {level: depth for depth, level in enumerate(levels, 1)}
    depth_of["kubernetes.io/hostname"] = len(levels) + 1
    root = _tree(rooms, labels, levels)
    scope: list[tuple[tuple[str, ...], _Domain]] = [((), root)]
    top = 0
    if required is not None:
        top = depth_of[required]
        candidates = _at(root, top)
        best = _best(candidates, need)
        if best is None:
            roomiest = max(candidates, key=lambda c: c[1].room, default=None)
            if roomiest is None:
                return Shortfall(need, required, None, 0, 0)
            return Shortfall(need, required, roomiest[0][-1], roomiest[1].room, roomiest[1].nodes)
        scope = [best]
    elif root.room < need:
        return Shortfall(need, None, None, root.room, root.nodes)
    narrowest = depth_of[preferred] if preferred is not None else len(levels)
    base_path, base = scope[0]
    for depth in range(narrowest, top, -1):
        candidates = [(base_path + path, d) for path, d in _at(base, depth - top)]
        best = _best(candidates, need)
        if best is not None:
            out: list[tuple[str, int]] = []
            _fill(best[1], need, out)
            level = "kubernetes.io/hostname" if depth > len(levels) else levels[depth - 1]
            return Fit(tuple(out), level, best[0][-1])
    out = []
    _fill(base, need, out)
    if required is not None:
        return Fit(tuple(out), required, base_path[-1])
    return Fit(tuple(out), None, None)
