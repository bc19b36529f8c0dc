"""Pure helpers of the intel-gas plugin: which cards a node has, which a pod allows, how amounts read.

GPU Aware Scheduling learns a node's cards from labels written by the Intel GPU labeler (node feature
discovery): `gpu.intel.com/gpu-numbers` (`0.1.2` -> card0, card1, card2) and, before it, the deprecated
`gpu.intel.com/cards` (`card0.card1`). A label value is limited to 63 characters, so a long `gpu-numbers`
continues in `gpu-numbers2`, `gpu-numbers3`, ..., each continuation starting with the control character `Z`
that is stripped before the pieces are joined. As in GAS, a continuation without the `Z` makes the whole
`gpu-numbers` value unusable, and the `cards` label is read instead. The labels are the node's to write: joining
stops, refusing the node, once the value is longer than the most cards kubegpu handles could need
(`MAX_SPLIT_LABEL_CHARS`), so a node labelled with thousands of continuations costs a few reads, not seconds.

Everything here is a plain function of strings and integers, tested directly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from kubegpu.core.limits import MAX_DEVICES_PER_NODE

__all__ = [
    "CARDS_LABEL",
    "GPU_NUMBERS_LABEL",
    "card_sort_key",
    "cards_from_labels",
    "format_amount",
    "join_split_label",
    "parse_card_names",
]

GPU_NUMBERS_LABEL = "gpu.intel.com/gpu-numbers"
CARDS_LABEL = "gpu.intel.com/cards"
CONTINUATION_MARK = "Z"
# Every card kubegpu handles on a node, numbered up to 9999999, each with its `.`: far more than a real node writes.
MAX_SPLIT_LABEL_CHARS = MAX_DEVICES_PER_NODE * 8

_CARD = re.compile(r"card(\d+)")

# Exact suffixes a Kubernetes quantity may carry, largest first; `format_amount` picks the shortest exact one.
_SUFFIXES: tuple[tuple[str, int], ...] = (
    ("Ei", 1 << 60),
    ("E", 10**18),
    ("Pi", 1 << 50),
    ("P", 10**15),
    ("Ti", 1 << 40),
    ("T", 10**12),
    ("Gi", 1 << 30),
    ("G", 10**9),
    ("Mi", 1 << 20),
    ("M", 10**6),
    ("Ki", 1 << 10),
    ("k", 10**3),
)
_DECIMAL: tuple[tuple[str, int], ...] = tuple((s, u) for s, u in _SUFFIXES if s in ("E", "P", "T", "G", "M"))


def join_split_label(labels: Mapping[str, str], name: str) -> str:
    """The value of `name` joined with its continuations `name2`, `name3`, ... (each `Z`-prefixed).

    Returns "" when the label is absent or a continuation lacks its `Z` (GAS then ignores the label). Raises
    `ValueError` naming the label once the joined value passes `MAX_SPLIT_LABEL_CHARS`, before reading further.
    """
    pieces = [labels.get(name, "")]
    length = len(pieces[0])
    postfix = 2
    while (more := labels.get(f"{name}{postfix}")) is not None:
        if not more.startswith(CONTINUATION_MARK):
            return ""
        pieces.append(more[len(CONTINUATION_MARK) :])
        length += len(pieces[-1])
        if length > MAX_SPLIT_LABEL_CHARS:
            raise ValueError(
                f"the node's {name} label and its continuations ({name}2 to {name}{postfix}, so far) run past "
                f"{MAX_SPLIT_LABEL_CHARS} characters: more Intel cards than kubegpu handles on one node "
                f"({MAX_DEVICES_PER_NODE})"
            )
        postfix += 1
    return "".join(pieces)


def cards_from_labels(labels: Mapping[str, str]) -> list[str]:
    """The node's card names from `gpu-numbers` (with continuations), else from the deprecated `cards` label.

    Entries are split on `.`; blanks, `gpu-numbers` entries that are not numbers, and repeats are skipped.
    The result is in card order (`card_sort_key`): card2 before card10.
    """
    numbers = join_split_label(labels, GPU_NUMBERS_LABEL)
    names = [f"card{int(part)}" for part in _parts(numbers) if part.isdigit()]
    if not names:
        names = list(_parts(labels.get(CARDS_LABEL, "")))
    return sorted(set(names), key=card_sort_key)


def _parts(value: str) -> Iterable[str]:
    return (part for part in (p.strip() for p in value.split(".")) if part)


def card_sort_key(name: str) -> tuple[int, int, str]:
    """Card order: `cardN` by N (card2 before card10), then any other name alphabetically."""
    match = _CARD.fullmatch(name)
    if match:
        return (0, int(match.group(1)), "")
    return (1, 0, name)


def parse_card_names(value: str | None) -> frozenset[str]:
    """The card names of a `gas-allow` / `gas-deny` annotation (comma-separated, blanks ignored)."""
    if not value:
        return frozenset()
    return frozenset(part for part in (p.strip() for p in value.split(",")) if part)


def format_amount(resource: str, value: int) -> str:
    """An amount of `resource` for a reason a person reads.

    Memory resources (a name containing `memory`) are bytes: an exact Kubernetes suffix when one exists
    (`5G`, `16Gi`; the shortest wins), else the byte count with a rounded decimal reading
    (`3589934592 (~3.59G)`). Other resources (`i915`, `millicores`, `tiles`) are plain counts.
    """
    if "memory" not in resource or value == 0:
        return str(value)
    exact = [f"{value // unit}{suffix}" for suffix, unit in _SUFFIXES if value % unit == 0]
    if exact:
        return min(exact, key=len)
    for suffix, unit in _DECIMAL:
        if abs(value) >= unit:
            return f"{value} (~{value / unit:.3g}{suffix})"
    return str(value)
