"""How the GPUs of one node are connected, and how to pick the best-connected free set among them.

After KubeGPU, a node's GPUs form a *group tree*: the root holds every GPU, each group holds smaller groups
whose GPUs are better connected to each other than to the rest, and the leaves are single GPUs. On a
DGX-1-style hybrid cube-mesh (p3.16xlarge, p3dn.24xlarge) the tree is

    root {0..7} > quads {0,1,2,3} {4,5,6,7} > pairs {0,1} {2,3} {4,5} {6,7} > GPUs

and on an NVSwitch machine (p4d.24xlarge, p5.48xlarge), where every GPU reaches every other at full speed, the
tree is the root alone: every set is equally good. A node whose topology is unknown gets the same one-level
tree (`flat`): no set is preferred, because nothing says one would be better.

Choosing n GPUs (`choose`): take the *smallest* group that has n free GPUs; among groups of that size take the
one with the fewest free GPUs (the tightest fit, which keeps bigger free groups whole), then the one whose
enclosing groups have the fewest free GPUs, then the lowest GPU id. Inside the chosen group, `fill` recurses:
into the tightest child that can hold what is still needed, otherwise it takes the fullest child whole and
goes on. The tree is precomputed per node (a handful of bitmasks), so a choice costs a few popcounts, never a
subset enumeration.

Quality (`placement_score`): 100 when the set lies inside a group of the smallest size that can hold n GPUs
(one GPU, a pair for 2, a quad for 3 or 4 on the cube-mesh, anything on NVSwitch), otherwise 100 * that size /
the size of the group the set had to span (4 GPUs split over both quads: 50; 2 GPUs in one quad but not a
pair: 50; 2 GPUs across quads: 25).

Everything here is pure: GPUs are bit positions 0..n-1 in a node's id order, sets are Python ints.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CATALOG",
    "CUBE_MESH",
    "FLAT",
    "GROUPS",
    "NVSWITCH",
    "Group",
    "GroupTree",
    "InstanceType",
    "TopologyError",
    "build_tree",
    "choose",
    "fill",
    "ids_of",
    "link_pairs",
    "normalize_model",
    "placement_score",
    "tree_from_inventory",
]

CUBE_MESH = "cube-mesh"
NVSWITCH = "nvswitch"
FLAT = "flat"
GROUPS = "groups"

_DGX1_GROUPS: list[Any] = [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
_QUAD_GROUPS: list[Any] = [[0, 1], [2, 3]]


# ----------------------------------------------------------------------------------------------------------
# Catalog
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceType:
    """What an instance type tells about its GPUs. Model names follow GPU Feature Discovery's `gpu.product`
    labels; memory is the nominal size in MiB. Labels and advertised inventories win over these defaults."""

    gpus: int
    model: str
    memory_mib: int
    kind: str
    groups: tuple[Any, ...] = ()


CATALOG: Mapping[str, InstanceType] = {
    "p3.2xlarge": InstanceType(1, "Tesla-V100-SXM2-16GB", 16384, FLAT),
    "p3.8xlarge": InstanceType(4, "Tesla-V100-SXM2-16GB", 16384, CUBE_MESH, tuple(_QUAD_GROUPS)),
    "p3.16xlarge": InstanceType(8, "Tesla-V100-SXM2-16GB", 16384, CUBE_MESH, tuple(_DGX1_GROUPS)),
    "p3dn.24xlarge": InstanceType(8, "Tesla-V100-SXM2-32GB", 32768, CUBE_MESH, tuple(_DGX1_GROUPS)),
    "p4d.24xlarge": InstanceType(8, "NVIDIA-A100-SXM4-40GB", 40960, NVSWITCH),
    "p4de.24xlarge": InstanceType(8, "NVIDIA-A100-SXM4-80GB", 81920, NVSWITCH),
    "p5.48xlarge": InstanceType(8, "NVIDIA-H100-80GB-HBM3", 81920, NVSWITCH),
}


# ----------------------------------------------------------------------------------------------------------
# The group tree
# ----------------------------------------------------------------------------------------------------------


class TopologyError(ValueError):
    """A topology description that does not describe a tree over the node's GPUs; the message says why."""


@dataclass(frozen=True, slots=True)
class Group:
    """One group of the tree: its GPUs as a bitmask, its lowest GPU, its children (none for a single GPU)
    and the masks of the groups enclosing it, nearest first (ties go towards the tightest surroundings)."""

    mask: int
    size: int
    low: int
    children: tuple[Group, ...]
    ancestors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GroupTree:
    """A node's precomputed tree. `groups` are the groups of two or more levels (not single GPUs) ordered by
    (size, lowest GPU); `ideal[n]` is the size of the smallest group that can hold n GPUs."""

    kind: str
    gpus: int
    root: Group
    groups: tuple[Group, ...]
    ideal: tuple[int, ...]


def build_tree(kind: str, gpus: int, groups: Sequence[Any] = ()) -> GroupTree:
    """The tree over GPUs 0..gpus-1 whose top-level groups are `groups` (nested lists of GPU positions).

    GPUs in no group hang directly under the root; a group equal to its parent is merged into it. Raises
    `TopologyError` for an unknown position, a GPU listed twice or an empty group.
    """
    if gpus < 1:
        raise TopologyError("a topology needs at least one GPU")
    seen: set[int] = set()
    tops = [_mask(member, gpus, seen) for member in groups]
    everything = (1 << gpus) - 1
    leaves = [_leaf(bit, ()) for bit in range(gpus) if not (1 << bit) & sum(tops)]
    root_children = _children(list(groups), everything, gpus, ())
    root = Group(everything, gpus, 0, tuple(sorted([*root_children, *leaves], key=lambda g: g.low)), ())
    inner: list[Group] = []
    _collect(root, inner)
    inner.sort(key=lambda g: (g.size, g.low))
    ideal = [0] * (gpus + 1)
    for n in range(1, gpus + 1):
        ideal[n] = min(g.size for g in inner if g.size >= n)
    return GroupTree(kind, gpus, root, tuple(inner), tuple(ideal))


def _mask(member: Any, gpus: int, seen: set[int]) -> int:
    """The bitmask of a nested member, checking positions as it goes."""
    if isinstance(member, bool):
        raise TopologyError(f"{member!r} is not a GPU")
    if isinstance(member, int):
        if not 0 <= member < gpus:
            raise TopologyError(f"GPU {member} is not on this node")
        if member in seen:
            raise TopologyError(f"GPU {member} appears in two groups")
        seen.add(member)
        return 1 << member
    if isinstance(member, (list, tuple)):
        if not member:
            raise TopologyError("a group is empty")
        mask = 0
        for item in member:
            mask |= _mask(item, gpus, seen)
        return mask
    raise TopologyError(f"{member!r} is neither a GPU nor a group")


def _children(members: list[Any], parent: int, gpus: int, ancestors: tuple[int, ...]) -> list[Group]:
    enclosing = (parent, *ancestors)
    result: list[Group] = []
    for member in members:
        if isinstance(member, int):
            result.append(_leaf(member, enclosing))
            continue
        mask = _mask(member, gpus, set())
        if mask == parent:
            result.extend(_children(list(member), parent, gpus, ancestors))
            continue
        kids = _children(list(member), mask, gpus, enclosing)
        size = mask.bit_count()
        if size == 1:
            result.extend(kids)
            continue
        low = (mask & -mask).bit_length() - 1
        result.append(Group(mask, size, low, tuple(sorted(kids, key=lambda g: g.low)), enclosing))
    return result


def _leaf(bit: int, ancestors: tuple[int, ...]) -> Group:
    return Group(1 << bit, 1, bit, (), ancestors)


def _collect(group: Group, into: list[Group]) -> None:
    if group.children:
        into.append(group)
        for child in group.children:
            _collect(child, into)


def link_pairs(tree: GroupTree) -> tuple[tuple[int, int], ...]:
    """The GPU pairs joined by a direct NVLink, for pictures. On a hybrid cube-mesh every GPU of a quad links to
    the other three and to the GPU in the same place of the next quad; an NVSwitch joins GPUs through the switch
    (no direct pairs); other trees say nothing about links."""
    if tree.kind != CUBE_MESH:
        return ()
    quads = [g for g in tree.groups if g.size == 4] or ([tree.root] if tree.gpus <= 4 else [])
    members = [[bit for bit in range(tree.gpus) if quad.mask >> bit & 1] for quad in quads]
    pairs = [(a, b) for quad in members for i, a in enumerate(quad) for b in quad[i + 1 :]]
    for left, right in itertools.pairwise(members):
        pairs.extend(zip(left, right, strict=False))
    return tuple(pairs)


def tree_from_inventory(topology: Mapping[str, Any], ids: Sequence[str]) -> GroupTree | None:
    """The tree an advertised inventory's `topology` describes, or None when it describes none.

    Format (the `topology` of `node.inventories["nvidia"]`):
    * `{"groups": [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]}` -- the root's groups, nested: a group is a list of
      GPUs (device ids, as strings or integers) or of smaller groups; GPUs listed nowhere hang under the root;
    * `{"kind": "nvswitch"}` -- all-to-all, every set equally good;
    * `{"kind": "cube-mesh"}` -- the DGX-1 tree above, for 8 GPUs (4 GPUs: one quad of two pairs);
    * `{"kind": "flat"}` -- no preference between sets;
    * neither `kind` nor `groups` -- not described: None; the caller falls back to the instance-type catalog.
    Raises `TopologyError` when the description does not fit the devices.
    """
    position = {device: bit for bit, device in enumerate(ids)}
    if "groups" in topology:
        raw = topology["groups"]
        if not isinstance(raw, list):
            raise TopologyError("topology.groups must be a list of groups")
        return build_tree(GROUPS, len(ids), [_positions(member, position) for member in raw])
    kind = topology.get("kind")
    if kind is None:
        return None
    if kind == NVSWITCH:
        return build_tree(NVSWITCH, len(ids))
    if kind == FLAT:
        return build_tree(FLAT, len(ids))
    if kind == CUBE_MESH:
        shapes = {8: _DGX1_GROUPS, 4: _QUAD_GROUPS}
        if len(ids) not in shapes:
            raise TopologyError(f"a cube-mesh has 4 or 8 GPUs, this node has {len(ids)}")
        return build_tree(CUBE_MESH, len(ids), shapes[len(ids)])
    raise TopologyError(f"topology.kind {kind!r} is not one of cube-mesh, nvswitch, flat")


def _positions(member: Any, position: Mapping[str, int]) -> Any:
    """Nested device ids -> nested bit positions."""
    if isinstance(member, list):
        return [_positions(item, position) for item in member]
    if isinstance(member, (str, int)) and not isinstance(member, bool) and str(member) in position:
        return position[str(member)]
    raise TopologyError(f"topology names GPU {member!r}, which the inventory does not list")


# ----------------------------------------------------------------------------------------------------------
# Choosing GPUs
# ----------------------------------------------------------------------------------------------------------


def choose(tree: GroupTree, available: int, n: int) -> tuple[int, int] | None:
    """The best-connected n GPUs among `available`: (their mask, the size of the group they lie in), or None.

    See the module docstring for the rule; O(number of groups) popcounts.
    """
    if n < 1 or available.bit_count() < n:
        return None
    best: Group | None = None
    best_key: tuple[int, tuple[int, ...], int] | None = None
    for group in tree.groups:
        if best is not None and group.size > best.size:
            break
        if group.size < n:
            continue
        free = (group.mask & available).bit_count()
        if free < n:
            continue
        key = (free, tuple((a & available).bit_count() for a in group.ancestors), group.low)
        if best_key is None or key < best_key:
            best, best_key = group, key
    if best is None:
        return None
    return fill(best, n, available), best.size


def fill(group: Group, n: int, available: int) -> int:
    """n GPUs from `available` inside `group` (which must have them): into the tightest child that can hold
    the rest, else the fullest child whole (lowest id first), and again."""
    if not group.children:
        return group.mask & available
    picked = 0
    rest = list(group.children)
    while n > 0:
        fits: Group | None = None
        fits_free = 0
        fullest = rest[0]
        fullest_free = -1
        for child in rest:
            free = (child.mask & available).bit_count()
            if free >= n and (fits is None or free < fits_free):
                fits, fits_free = child, free
            if free > fullest_free:
                fullest, fullest_free = child, free
        if fits is not None:
            return picked | fill(fits, n, available)
        if fullest_free <= 0:  # the caller promised enough GPUs; never loop on a broken promise
            break
        picked |= fullest.mask & available
        n -= fullest_free
        rest.remove(fullest)
    return picked


def placement_score(tree: GroupTree, n: int, group_size: int) -> float:
    """100 when n GPUs lie in a group of the smallest size that can hold them, else proportionally less."""
    if n <= 1 or group_size <= 0:
        return 100.0
    return 100.0 * tree.ideal[n] / group_size


def ids_of(mask: int, ids: Sequence[str]) -> list[str]:
    """The device ids of a mask, lowest position first."""
    result = []
    while mask:
        low = mask & -mask
        result.append(ids[low.bit_length() - 1])
        mask ^= low
    return result


_SEPARATORS = re.compile(r"[\s_-]+")


def normalize_model(model: str) -> str:
    """A GPU model name for comparison: trimmed, case-folded, with runs of spaces, `-` and `_` made one `-`
    (GPU Feature Discovery writes `Tesla-V100-SXM2-16GB` where NVML says `Tesla V100-SXM2-16GB`)."""
    return _SEPARATORS.sub("-", model.strip().casefold())
