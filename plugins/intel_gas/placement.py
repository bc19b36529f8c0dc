"""The intel-gas placement rule, as pure functions over a node's per-card books (GAS's algorithm).

`pod_needs` reads what each container asks of each of its cards (`container_need`, the `gas-same-gpu` group);
`choose_cards` places the containers one after another, in spec order and without backtracking, each on the
*fullest* candidate cards that have its per-card need free (ties to the lower card number); `impossible` and
`shortage` say why a container cannot be placed, in GAS's words. `scheduler.py`'s module docstring states the rules in
full. Nothing here changes the books: `used` is handed in (the node's, or all zeros for "on an empty node").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kubegpu.core.models import ContainerRequest, PodRequest
from kubegpu.plugins.intel_gas import (
    ALLOW_ANNOTATION,
    COUNT_RESOURCES,
    DENY_ANNOTATION,
    I915,
    PREFIX,
    SAME_GPU_ANNOTATION,
    SAME_GPU_FORBIDDEN,
    TILES,
    UNSUPPORTED_ANNOTATIONS,
    WITHOUT_I915_ENV,
    XE,
)
from kubegpu.plugins.intel_gas.cards import format_amount, parse_card_names

NO_FIT = "Not enough GPU-resources for deployment: will not fit"


class CardBooks(Protocol):
    """What the rule reads of a node: its cards, the healthy ones, each card's capacity and use per resource."""

    cards: tuple[str, ...]
    healthy_cards: tuple[int, ...]
    card_capacity: dict[str, list[int]]
    usage: dict[str, list[int]]


@dataclass(frozen=True, slots=True)
class Need:
    """What one container asks of each of its cards: `per_card` lists every requested resource, by name."""

    container: str
    count_resource: str
    cards: int
    per_card: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class IntelGasPodState:
    needs: tuple[Need | None, ...]  # aligned with pod.containers; None: the container asks nothing of ours
    problem: str | None  # the validation refusal, if any
    same: tuple[int, ...] = ()  # indices of the `gas-same-gpu` containers, in spec order


@dataclass(frozen=True, slots=True)
class IntelGasPlacement:
    cards: tuple[tuple[int, ...] | None, ...]  # per container, chosen card indices in card order
    score: float
    # per classic init container asking tiles: card index -> its tiles (`scheduler.init_tile_plan`)
    init_tiles: Mapping[str, Mapping[int, tuple[int, ...]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    final: bool  # True: no freeing of shares can help on this node


def candidate_cards(state: CardBooks, annotations: Mapping[str, str]) -> tuple[int, ...]:
    """Healthy cards the pod's `gas-allow` / `gas-deny` annotations leave, in card order."""
    allow = parse_card_names(annotations.get(ALLOW_ANNOTATION))
    deny = parse_card_names(annotations.get(DENY_ANNOTATION))
    if not allow and not deny:
        return state.healthy_cards
    return tuple(
        i for i in state.healthy_cards if (not allow or state.cards[i] in allow) and state.cards[i] not in deny
    )


def choose_cards(
    state: CardBooks,
    needs: Sequence[Need | None],
    pool: Sequence[int],
    used: Mapping[str, Sequence[int]],
    same: Sequence[int] = (),
) -> IntelGasPlacement | Refusal:
    """Place the containers in order on the `pool` cards, given per-card `used` amounts (none: a free node).

    Each container takes the fullest fitting cards (see the module docstring); the shares taken by earlier
    containers of the pod count for later ones. The `same` containers (`gas-same-gpu`) are placed together, as
    one container asking for their summed needs on one card, where the first of them stands.
    """
    overlay: dict[tuple[int, str], int] = {}
    chosen: list[tuple[int, ...] | None] = []
    rows = card_rows(state, used)
    grouped = same_gpu_need(needs, same)
    for position, need in enumerate(needs):
        if need is None:
            chosen.append(None)
            continue
        if grouped is not None and position in same:
            if position != same[0]:
                chosen.append(chosen[same[0]])
                continue
            need = grouped
        refusal = impossible(state, need, pool)
        if refusal is not None:
            return refusal
        # A resource the node does not advertise can only be asked for in a zero amount here (`impossible`).
        checks = [(r, x, state.card_capacity[r], used[r]) for r, x in need.per_card if r in state.card_capacity]
        fitting = [i for i in pool if all(c[i] - u[i] - overlay.get((i, r), 0) >= x for r, x, c, u in checks)]
        if len(fitting) < need.cards:
            return Refusal(shortage(state, need, pool, used, overlay, len(fitting)), final=False)
        if len(fitting) > need.cards:
            extra = dict(need.per_card)
            fitting.sort(key=lambda i: (-card_fullness(rows, overlay, i, extra), i))
        picked = tuple(sorted(fitting[: need.cards]))
        for i in picked:
            for r, amount, _, _ in checks:
                overlay[(i, r)] = overlay.get((i, r), 0) + amount
        chosen.append(picked)
    distinct = {i for picked in chosen if picked for i in picked}
    fullness = [card_fullness(rows, overlay, i) for i in distinct]
    score = 100.0 * sum(fullness) / len(fullness) if fullness else 0.0
    return IntelGasPlacement(cards=tuple(chosen), score=min(100.0, score))


def fits_alone(state: CardBooks, need: Need, pool: Sequence[int]) -> bool:
    """Whether enough pool cards have the container's per-card need free now (no choice made)."""
    if impossible(state, need, pool) is not None:
        return False
    checks = [(x, state.card_capacity[r], state.usage[r]) for r, x in need.per_card if r in state.card_capacity]
    enough = 0
    for i in pool:
        if all(c[i] - u[i] >= x for x, c, u in checks):
            enough += 1
            if enough == need.cards:
                return True
    return False


def impossible(state: CardBooks, need: Need, pool: Sequence[int]) -> Refusal | None:
    """Why this node can never give the container its cards, whatever is released; None if it could."""
    healthy = len(state.healthy_cards)
    if need.cards > healthy:
        kind = "Intel GPU card(s)" if healthy == len(state.cards) else "healthy Intel GPU card(s)"
        return Refusal(f"node has {healthy} {kind}; the container asks for {need.cards}", final=True)
    if need.cards > len(pool):
        if not pool:
            reason = "the pod's gas-allow/gas-deny annotations exclude every Intel GPU card of this node"
        else:
            reason = (
                f"the pod's gas-allow/gas-deny annotations leave {len(pool)} Intel GPU card(s) on this node; "
                f"the container asks for {need.cards}"
            )
        return Refusal(reason, final=True)
    for resource, amount in need.per_card:
        caps = state.card_capacity.get(resource) or [0] * len(state.cards)
        big = sum(1 for i in pool if caps[i] >= amount)
        if big < need.cards:
            largest = max(caps)
            if not largest:
                has = "the node has none"
            elif min(caps) == largest:
                has = f"a card of this node has {format_amount(resource, largest)}"
            elif big:
                has = f"only {big} card(s) of this node have that much"
            elif any(cap >= amount for cap in caps):  # an unhealthy card, or one the pod's annotations exclude
                most = format_amount(resource, max((caps[i] for i in pool), default=0))
                has = f"the cards this pod may use here have at most {most}"
            else:
                has = f"the largest card of this node has {format_amount(resource, largest)}"
            wanted = f"{resource}: needs {format_amount(resource, amount)} on each of {need.cards} card(s)"
            return Refusal(f"{NO_FIT} ({wanted}; {has})", final=True)
    return None


def shortage(
    state: CardBooks,
    need: Need,
    pool: Sequence[int],
    used: Mapping[str, Sequence[int]],
    overlay: Mapping[tuple[int, str], int],
    fitting: int,
) -> str:
    """The per-card shortage keeping the container off this node, naming the first resource that is short."""
    for resource, amount in need.per_card:
        if resource not in state.card_capacity:
            continue
        cap, u = state.card_capacity[resource], used[resource]
        free = [cap[i] - u[i] - overlay.get((i, resource), 0) for i in pool]
        enough = sum(1 for f in free if f >= amount)
        if enough < need.cards:
            wanted = f"{resource}: needs {format_amount(resource, amount)} on each of {need.cards} card(s)"
            if resource == TILES:
                return f"{NO_FIT} ({wanted}; {free_tiles([state.cards[i] for i in pool], free)})"
            if enough:
                return f"{NO_FIT} ({wanted}; only {enough} card(s) have that much free)"
            return f"{NO_FIT} ({wanted}; the most free on any card is {format_amount(resource, max(free))})"
    wanted = ", ".join(f"{format_amount(r, amount)} {r}" for r, amount in need.per_card)
    have = f"only {fitting} card(s) have" if fitting else "no card has"
    detail = f"needs {wanted} on each of {need.cards} card(s); {have} all of it free"
    return f"{NO_FIT} ({detail})"


# A tile shortage names the cards, as many as a reason can hold.
NAMED_CARDS = 4


def free_tiles(cards: Sequence[str], free: Sequence[int]) -> str:
    """How many tiles each card has free, for a reason: `card0 has no free tile, card1 has 1 free tile`; past
    `NAMED_CARDS` cards, the rest summed up."""
    said = [f"{card} has {_tiles(n)}" for card, n in zip(cards[:NAMED_CARDS], free, strict=False)]
    rest = free[NAMED_CARDS:]
    if rest:
        said.append(f"{len(rest)} more card(s) have at most {_tiles(max(rest))}")
    return ", ".join(said)


def _tiles(count: int) -> str:
    return "no free tile" if count <= 0 else "1 free tile" if count == 1 else f"{count} free tiles"


Rows = list[tuple[str, Sequence[int], Sequence[int]]]


def card_rows(state: CardBooks, used: Mapping[str, Sequence[int]]) -> Rows:
    """(resource, per-card capacity, per-card used) for every resource some card has, for `card_fullness`."""
    return [(r, cap, used[r]) for r, cap in state.card_capacity.items() if any(cap)]


def card_fullness(
    rows: Rows, overlay: Mapping[tuple[int, str], int], i: int, extra: Mapping[str, int] | None = None
) -> float:
    """The used fraction of card i's busiest resource, counting `overlay` and an `extra` placement."""
    fullest = 0.0
    for resource, caps, used in rows:
        cap = caps[i]
        if not cap:
            continue
        amount = used[i]
        if overlay:
            amount += overlay.get((i, resource), 0)
        if extra:
            amount += extra.get(resource, 0)
        if amount > fullest * cap:
            fullest = amount / cap
    return fullest


def container_need(container: ContainerRequest, *, ignore_without_count: bool = False) -> Need | str | None:
    """The container's per-card need: None if it asks no `gpu.intel.com/*` resource (or, with
    `ignore_without_count`, none of i915/xe, as GAS ignores it); a refusal if invalid."""
    owned = {r: amount for r, amount in container.resources.items() if r.startswith(PREFIX) and amount > 0}
    if not owned:
        return None
    counts = [r for r in COUNT_RESOURCES if r in owned]
    if len(counts) == 2:
        return f"a container may request {I915} or {XE}, not both: keep the one its node advertises"
    if not counts and ignore_without_count:
        return None
    if not counts:
        others = ", ".join(sorted(owned))
        return (
            f"a container requesting {others} must also request {I915} (the number of cards to spread it "
            f"over): add {I915}: 1"
        )
    count = counts[0]
    cards = owned[count]
    per_card = tuple(sorted((r, 1 if r == count else amount // cards) for r, amount in owned.items()))
    return Need(container.name, count, cards, per_card)


def pod_needs(pod: PodRequest) -> IntelGasPodState:
    """Every container's need, in spec order, the `gas-same-gpu` group, and the first validation refusal (read once
    per pod signature: `kubegpu_scheduler_prepare`)."""
    ignore = os.environ.get(WITHOUT_I915_ENV, "").strip().lower() == "ignore"
    same_text = pod.annotations.get(SAME_GPU_ANNOTATION)
    needs: list[Need | None] = []
    problem: str | None = None
    for container in pod.containers:
        need = container_need(container, ignore_without_count=ignore)
        if isinstance(need, str):
            problem = problem or need
            needs.append(None)
        else:
            needs.append(need)
    if problem is None and any(needs):
        unsupported = next((name for name in UNSUPPORTED_ANNOTATIONS if name in pod.annotations), None)
        if unsupported is not None:
            problem = (
                f"the pod's {unsupported} annotation asks GAS for {UNSUPPORTED_ANNOTATIONS[unsupported]}, which "
                "kubegpu does not place by: remove the annotation to take any cards that fit"
            )
    same: tuple[int, ...] = ()
    if same_text is not None:
        group = same_gpu_containers(same_text, pod.containers, needs)
        if isinstance(group, str):
            problem = problem or group
        else:
            same = group
    return IntelGasPodState(tuple(needs), problem, same)


def same_gpu_containers(
    text: str, containers: Sequence[ContainerRequest], needs: Sequence[Need | None]
) -> tuple[int, ...] | str:
    """The indices (spec order) of the containers a `gas-same-gpu` value names, or why it is refused: as in GAS,
    at least two distinct names of the pod's containers, each requesting exactly one i915 (or xe) and no tiles or
    monitoring resource."""
    names = [name.strip() for name in text.split(",")]
    if len(names) < 2 or "" in names or len(set(names)) != len(names):
        return (
            f"the {SAME_GPU_ANNOTATION} annotation {text!r} is malformed: list at least two distinct container names, "
            "separated by commas"
        )
    index = {c.name: i for i, c in enumerate(containers)}
    absent = [name for name in names if name not in index]
    if absent:
        return f"the {SAME_GPU_ANNOTATION} annotation names {absent[0]!r}, which is not a container of the pod"
    for name in names:
        container, need = containers[index[name]], needs[index[name]]
        if need is None or need.cards != 1:
            return f"container {name} is listed in {SAME_GPU_ANNOTATION}: it must request exactly 1 {I915} (or {XE})"
        forbidden = [r for r in SAME_GPU_FORBIDDEN if container.resources.get(r, 0) > 0]
        if forbidden:
            return f"container {name} is listed in {SAME_GPU_ANNOTATION}: it cannot request {forbidden[0]}"
    return tuple(sorted(index[name] for name in names))


def same_gpu_need(needs: Sequence[Need | None], same: Sequence[int]) -> Need | None:
    """The `gas-same-gpu` containers as one container on one card: their per-card needs summed."""
    if not same:
        return None
    totals: dict[str, int] = {}
    members = [needs[i] for i in same]
    for need in members:
        assert need is not None  # same_gpu_containers checked it
        for resource, amount in need.per_card:
            totals[resource] = totals.get(resource, 0) + amount
    first = members[0]
    assert first is not None
    name = "+".join(n.container for n in members if n is not None)
    return Need(name, first.count_resource, 1, tuple(sorted(totals.items())))
