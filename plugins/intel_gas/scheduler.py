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
  cards (integer division, over all listed cards as GAS assumes homogeneous cards), `i915` included: `i915: 8`
  over 2 cards lets each card serve 4 containers.
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
* **Score.** GAS has none; here it is how full the chosen cards are after the placement (mean over the cards
  of their busiest resource's used fraction, times 100): a node where the pod fills cards already in use
  scores higher than one where it breaks into untouched cards.
* **Headroom.** Per advertised resource, an upper bound of what one container could get: the sum of the free
  per-card amounts over healthy cards; for `i915`/`xe`, the number of healthy cards with a free unit.
  Utilization is the used fraction of the `i915` (else `xe`, else memory) shares.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubegpu.core.limits import check_device_count
from kubegpu.core.models import (
    ContainerRequest,
    DeviceCell,
    NodeInfo,
    Occupancy,
    PluginAllocation,
    PodRequest,
)
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom, hookimpl
from kubegpu.core.status import Status
from kubegpu.plugins.intel_gas.cards import (
    GPU_NUMBERS_LABEL,
    card_sort_key,
    cards_from_labels,
    format_amount,
    parse_card_names,
)

NAME = "intel-gas"
RESOURCES = ["gpu.intel.com/*"]

# ----------------------------------------------------------------------------------------------------------
# Configuration: the resource and annotation names GAS defines
# ----------------------------------------------------------------------------------------------------------

PREFIX = "gpu.intel.com/"
I915 = "gpu.intel.com/i915"
XE = "gpu.intel.com/xe"
COUNT_RESOURCES = (I915, XE)  # "on how many cards": one unit per chosen card
ALLOW_ANNOTATION = "gas-allow"
DENY_ANNOTATION = "gas-deny"
TS_ANNOTATION = "gas-ts"
CARDS_ANNOTATION = "gas-container-cards"
SAME_GPU_ANNOTATION = "gas-same-gpu"
SAME_GPU_FORBIDDEN = ("gpu.intel.com/tiles", "gpu.intel.com/i915_monitoring", "gpu.intel.com/xe_monitoring")
NO_FIT = "Not enough GPU-resources for deployment: will not fit"
# GAS leaves a pod requesting gpu.intel.com/* without i915/xe to the default scheduler; kubegpu refuses it unless
# this environment variable says `ignore` (`kubegpu extender --intel-without-i915 ignore` sets it).
WITHOUT_I915_ENV = "KUBEGPU_INTEL_WITHOUT_I915"

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


@dataclass(frozen=True, slots=True)
class Need:
    """What one container asks of each of its cards: `per_card` lists every requested resource, by name."""

    container: str
    count_resource: str
    cards: int
    per_card: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class _PodNeeds:
    needs: tuple[Need | None, ...]  # aligned with pod.containers; None: the container asks nothing of ours
    problem: str | None  # the validation refusal, if any
    same: tuple[int, ...] = ()  # indices of the `gas-same-gpu` containers, in spec order


@dataclass(frozen=True, slots=True)
class _Placement:
    cards: tuple[tuple[int, ...] | None, ...]  # per container, chosen card indices in card order
    score: float


@dataclass(frozen=True, slots=True)
class _Refusal:
    reason: str
    final: bool  # True: no freeing of shares can help on this node


class IntelGasState(DeviceNodeState):
    """One node's cards and the amounts of each `gpu.intel.com/*` resource used on each card."""

    plugin = NAME

    def __init__(self, node: str, cards: Sequence[str], healthy: Sequence[bool], capacity: Mapping[str, int]):
        super().__init__(node)
        self.cards = tuple(cards)
        self.index = {card: i for i, card in enumerate(self.cards)}
        self.healthy = tuple(healthy)
        self.healthy_cards = tuple(i for i, ok in enumerate(self.healthy) if ok)
        self.capacity = dict(capacity)  # per card, for every advertised gpu.intel.com resource
        self.used = {resource: [0] * len(self.cards) for resource in self.capacity}
        self.unused = {resource: [0] * len(self.cards) for resource in self.capacity}
        # pod key -> (card index, resource) -> [amount, number of container entries]
        self.held: dict[str, dict[tuple[int, str], list[int]]] = {}
        self.version = 0
        self.memo: tuple[int, _PodNeeds, _Placement | Status] | None = None


def _own(state: DeviceNodeState) -> IntelGasState:
    assert isinstance(state, IntelGasState), f"intel-gas was given a {type(state).__name__}"
    return state


# ----------------------------------------------------------------------------------------------------------
# Hook implementations
# ----------------------------------------------------------------------------------------------------------


@hookimpl
def kubegpu_scheduler_resources() -> list[str]:
    return list(RESOURCES)


@hookimpl
def kubegpu_scheduler_build_node(node: NodeInfo) -> DeviceNodeState | None:
    inventory = node.inventories.get(NAME)
    if inventory is not None:
        devices = sorted(inventory.devices, key=lambda d: card_sort_key(d.id))
        cards = [d.id for d in devices]
        healthy = [d.healthy for d in devices]
    else:
        cards = cards_from_labels(node.labels)
        healthy = [True] * len(cards)
    if not cards:
        return None
    check_device_count(node.name, "Intel cards", len(cards))
    # Allocatable counts the cards a device plugin or the advertiser can serve, so an unhealthy card is not in it.
    serving = max(1, sum(healthy))
    capacity = {r: amount // serving for r, amount in node.allocatable.items() if r.startswith(PREFIX)}
    return IntelGasState(node.name, cards, healthy, capacity)


@hookimpl
def kubegpu_scheduler_headroom(state: DeviceNodeState) -> Headroom:
    s = _own(state)
    free: dict[str, int] = {}
    for resource, cap in s.capacity.items():
        used = s.used[resource]
        if resource in COUNT_RESOURCES:
            free[resource] = sum(1 for i in s.healthy_cards if used[i] < cap)
        else:
            free[resource] = sum(cap - used[i] for i in s.healthy_cards)
    return Headroom(free=free, utilization=_utilization(s))


@hookimpl
def kubegpu_scheduler_validate(pod: PodRequest) -> Status | None:
    problem = pod_needs(pod).problem
    return Status.unresolvable(problem, plugin=NAME) if problem else None


@hookimpl
def kubegpu_scheduler_prepare(pod: PodRequest) -> _PodNeeds:
    return pod_needs(pod)


@hookimpl
def kubegpu_scheduler_fit(state: DeviceNodeState, pod: PodRequest, prepared: _PodNeeds) -> Status:
    result = _placement(_own(state), pod, prepared, choose=False)
    return result if isinstance(result, Status) else Status.success()


@hookimpl
def kubegpu_scheduler_score(state: DeviceNodeState, pod: PodRequest, prepared: _PodNeeds) -> float:
    result = _placement(_own(state), pod, prepared, choose=True)
    return 0.0 if isinstance(result, Status) else result.score


@hookimpl
def kubegpu_scheduler_allocate(state: DeviceNodeState, pod: PodRequest, prepared: _PodNeeds) -> PluginAllocation | None:
    s = _own(state)
    result = _placement(s, pod, prepared, choose=True)
    if isinstance(result, Status):
        return None
    needs = prepared.needs
    if not any(needs):
        return PluginAllocation(plugin=NAME)
    containers: dict[str, dict[str, list[str]]] = {}
    shares: dict[str, dict[str, dict[str, int]]] = {}
    columns: list[str] = []
    for container, need, picked in zip(pod.containers, needs, result.cards, strict=True):
        if need is None or picked is None:
            columns.append("")
            continue
        names = [s.cards[i] for i in picked]
        containers[container.name] = {r: list(names) for r, _ in need.per_card}
        shares[container.name] = {r: dict.fromkeys(names, amount) for r, amount in need.per_card}
        columns.append(",".join(names))
    annotations = {TS_ANNOTATION: str(time.time_ns()), CARDS_ANNOTATION: "|".join(columns)}
    return PluginAllocation(plugin=NAME, containers=containers, shares=shares, annotations=annotations)


@hookimpl
def kubegpu_scheduler_take(state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status:
    s = _own(state)
    entries = _entries(s, allocation, taking=True)
    if isinstance(entries, str):
        return Status.error(entries, plugin=NAME)
    for (i, resource), (amount, _) in entries.items():
        free = s.capacity.get(resource, 0) - (s.used[resource][i] if resource in s.used else 0)
        if amount > free:
            return Status.error(
                f"{s.cards[i]} has {format_amount(resource, free)} of {resource} free; "
                f"the allocation takes {format_amount(resource, amount)}",
                plugin=NAME,
            )
    if not entries:
        return Status.success()
    held = s.held.setdefault(pod_key, {})
    for (i, resource), (amount, refs) in entries.items():
        if resource in s.used:
            s.used[resource][i] += amount
        entry = held.setdefault((i, resource), [0, 0])
        entry[0] += amount
        entry[1] += refs
    s.version += 1
    return Status.success()


@hookimpl
def kubegpu_scheduler_release(state: DeviceNodeState, pod_key: str, allocation: PluginAllocation) -> Status:
    s = _own(state)
    entries = _entries(s, allocation, taking=False)
    if isinstance(entries, str):
        return Status.error(entries, plugin=NAME)
    if not entries:
        return Status.success()
    held = s.held.get(pod_key, {})
    # Idempotent (Unreserve): shares the pod no longer holds are left alone.
    entries = {key: value for key, value in entries.items() if key in held}
    for (i, resource), (amount, refs) in entries.items():
        have = held[(i, resource)]
        if have[0] < amount or have[1] < refs:
            return Status.error(
                f"{pod_key} does not hold {format_amount(resource, amount)} of {resource} on {s.cards[i]}",
                plugin=NAME,
            )
    for (i, resource), (amount, refs) in entries.items():
        if resource in s.used:
            s.used[resource][i] -= amount
        entry = held[(i, resource)]
        entry[0] -= amount
        entry[1] -= refs
        if entry[1] == 0:
            del held[(i, resource)]
    if not held:
        s.held.pop(pod_key, None)
    s.version += 1
    return Status.success()


@hookimpl
def kubegpu_scheduler_describe(state: DeviceNodeState) -> list[Occupancy]:
    s = _own(state)
    holders: list[set[str]] = [set() for _ in s.cards]
    for pod_key, entries in s.held.items():
        for i, _ in entries:
            holders[i].add(pod_key)
    rows = _rows(s, s.used)
    cells = [
        DeviceCell(id=card, holders=sorted(holders[i]), used=_fullness(rows, {}, i), healthy=ok)
        for i, (card, ok) in enumerate(zip(s.cards, s.healthy, strict=True))
    ]
    counts = [r for r in COUNT_RESOURCES if r in s.used]
    untouched = sum(1 for i in s.healthy_cards if all(s.used[r][i] == 0 for r in s.used))
    shareable = sum(1 for i in s.healthy_cards if any(s.used[r][i] < s.capacity[r] for r in counts))
    return [
        Occupancy(
            family=NAME,
            layout="cells",
            cells=cells,
            total=len(s.cards),
            free=untouched,
            largest_fit=shareable,
        )
    ]


# ----------------------------------------------------------------------------------------------------------
# Placement: the GAS rules on one node
# ----------------------------------------------------------------------------------------------------------


# fit on a one-container pod only needs to know that enough cards fit; the choice waits for score/allocate.
_FITS = _Placement(cards=(), score=0.0)


def _placement(state: IntelGasState, pod: PodRequest, needs: _PodNeeds, *, choose: bool) -> _Placement | Status:
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


def _place(state: IntelGasState, pod: PodRequest, needs: _PodNeeds, choose: bool) -> _Placement | Status:
    if needs.problem:
        return Status.unresolvable(needs.problem, plugin=NAME)
    intel = [need for need in needs.needs if need is not None]
    if not intel:
        return _Placement(cards=tuple(None for _ in needs.needs), score=0.0)
    pool = candidate_cards(state, pod.annotations)
    if not choose and len(intel) == 1 and _fits_alone(state, intel[0], pool):
        return _FITS
    result = choose_cards(state, needs.needs, pool, state.used, needs.same)
    if isinstance(result, _Placement):
        return result
    if result.final:
        return Status.unresolvable(result.reason, plugin=NAME)
    # A pod whose own containers crowd each other out would not fit on this node even with every card free.
    on_free_node = choose_cards(state, needs.needs, pool, state.unused, needs.same)
    if isinstance(on_free_node, _Refusal):
        return Status.unresolvable(on_free_node.reason, plugin=NAME)
    return Status.unschedulable(result.reason, plugin=NAME)


def candidate_cards(state: IntelGasState, annotations: Mapping[str, str]) -> tuple[int, ...]:
    """Healthy cards the pod's `gas-allow` / `gas-deny` annotations leave, in card order."""
    allow = parse_card_names(annotations.get(ALLOW_ANNOTATION))
    deny = parse_card_names(annotations.get(DENY_ANNOTATION))
    if not allow and not deny:
        return state.healthy_cards
    return tuple(
        i for i in state.healthy_cards if (not allow or state.cards[i] in allow) and state.cards[i] not in deny
    )


def choose_cards(
    state: IntelGasState,
    needs: Sequence[Need | None],
    pool: Sequence[int],
    used: Mapping[str, Sequence[int]],
    same: Sequence[int] = (),
) -> _Placement | _Refusal:
    """Place the containers in order on the `pool` cards, given per-card `used` amounts (none: a free node).

    Each container takes the fullest fitting cards (see the module docstring); the shares taken by earlier
    containers of the pod count for later ones. The `same` containers (`gas-same-gpu`) are placed together, as
    one container asking for their summed needs on one card, where the first of them stands.
    """
    overlay: dict[tuple[int, str], int] = {}
    chosen: list[tuple[int, ...] | None] = []
    rows = _rows(state, used)
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
        refusal = _impossible(state, need, pool)
        if refusal is not None:
            return refusal
        # A resource the node does not advertise can only be asked for in a zero amount here (`_impossible`).
        checks = [(r, x, state.capacity[r], used[r]) for r, x in need.per_card if r in state.capacity]
        fitting = [i for i in pool if all(c - u[i] - overlay.get((i, r), 0) >= x for r, x, c, u in checks)]
        if len(fitting) < need.cards:
            return _Refusal(_shortage(state, need, pool, used, overlay, len(fitting)), final=False)
        if len(fitting) > need.cards:
            extra = dict(need.per_card)
            fitting.sort(key=lambda i: (-_fullness(rows, overlay, i, extra), i))
        picked = tuple(sorted(fitting[: need.cards]))
        for i in picked:
            for r, amount, _, _ in checks:
                overlay[(i, r)] = overlay.get((i, r), 0) + amount
        chosen.append(picked)
    distinct = {i for picked in chosen if picked for i in picked}
    fullness = [_fullness(rows, overlay, i) for i in distinct]
    score = 100.0 * sum(fullness) / len(fullness) if fullness else 0.0
    return _Placement(cards=tuple(chosen), score=min(100.0, score))


def _fits_alone(state: IntelGasState, need: Need, pool: Sequence[int]) -> bool:
    """Whether enough pool cards have the container's per-card need free now (no choice made)."""
    if _impossible(state, need, pool) is not None:
        return False
    checks = [(x, state.capacity[r], state.used[r]) for r, x in need.per_card if r in state.capacity]
    enough = 0
    for i in pool:
        if all(c - u[i] >= x for x, c, u in checks):
            enough += 1
            if enough == need.cards:
                return True
    return False


def _impossible(state: IntelGasState, need: Need, pool: Sequence[int]) -> _Refusal | None:
    """Why this node can never give the container its cards, whatever is released; None if it could."""
    healthy = len(state.healthy_cards)
    if need.cards > healthy:
        kind = "Intel GPU card(s)" if healthy == len(state.cards) else "healthy Intel GPU card(s)"
        return _Refusal(f"node has {healthy} {kind}; the container asks for {need.cards}", final=True)
    if need.cards > len(pool):
        if not pool:
            reason = "the pod's gas-allow/gas-deny annotations exclude every Intel GPU card of this node"
        else:
            reason = (
                f"the pod's gas-allow/gas-deny annotations leave {len(pool)} Intel GPU card(s) on this node; "
                f"the container asks for {need.cards}"
            )
        return _Refusal(reason, final=True)
    for resource, amount in need.per_card:
        cap = state.capacity.get(resource, 0)
        if amount > cap:
            has = f"a card of this node has {format_amount(resource, cap)}" if cap else "the node has none"
            wanted = f"{resource}: needs {format_amount(resource, amount)} on each of {need.cards} card(s)"
            return _Refusal(f"{NO_FIT} ({wanted}; {has})", final=True)
    return None


def _shortage(
    state: IntelGasState,
    need: Need,
    pool: Sequence[int],
    used: Mapping[str, Sequence[int]],
    overlay: Mapping[tuple[int, str], int],
    fitting: int,
) -> str:
    """The per-card shortage keeping the container off this node, naming the first resource that is short."""
    for resource, amount in need.per_card:
        if resource not in state.capacity:
            continue
        cap, u = state.capacity[resource], used[resource]
        free = [cap - u[i] - overlay.get((i, resource), 0) for i in pool]
        enough = sum(1 for f in free if f >= amount)
        if enough < need.cards:
            wanted = f"{resource}: needs {format_amount(resource, amount)} on each of {need.cards} card(s)"
            if enough:
                return f"{NO_FIT} ({wanted}; only {enough} card(s) have that much free)"
            return f"{NO_FIT} ({wanted}; the most free on any card is {format_amount(resource, max(free))})"
    wanted = ", ".join(f"{format_amount(r, amount)} {r}" for r, amount in need.per_card)
    have = f"only {fitting} card(s) have" if fitting else "no card has"
    detail = f"needs {wanted} on each of {need.cards} card(s); {have} all of it free"
    return f"{NO_FIT} ({detail})"


_Rows = list[tuple[str, int, Sequence[int]]]


def _rows(state: IntelGasState, used: Mapping[str, Sequence[int]]) -> _Rows:
    """(resource, per-card capacity, per-card used) for every resource a card has, for `_fullness`."""
    return [(r, cap, used[r]) for r, cap in state.capacity.items() if cap > 0]


def _fullness(
    rows: _Rows, overlay: Mapping[tuple[int, str], int], i: int, extra: Mapping[str, int] | None = None
) -> float:
    """The used fraction of card i's busiest resource, counting `overlay` and an `extra` placement."""
    fullest = 0.0
    for resource, cap, used in rows:
        amount = used[i]
        if overlay:
            amount += overlay.get((i, resource), 0)
        if extra:
            amount += extra.get(resource, 0)
        if amount > fullest * cap:
            fullest = amount / cap
    return fullest


def _utilization(state: IntelGasState) -> float:
    basis = next((r for r in (I915, XE) if state.capacity.get(r)), None)
    if basis is None:
        basis = next((r for r in sorted(state.capacity) if "memory" in r and state.capacity[r]), None)
    if basis is None or not state.healthy_cards:
        return 0.0
    used = sum(state.used[basis][i] for i in state.healthy_cards)
    return min(1.0, used / (state.capacity[basis] * len(state.healthy_cards)))


def _entries(
    state: IntelGasState, allocation: PluginAllocation, *, taking: bool
) -> dict[tuple[int, str], list[int]] | str:
    """The allocation's shares summed per (card, resource) as [amount, entries], or why it is refused."""
    if allocation.plugin != NAME:
        return f"the allocation belongs to plugin {allocation.plugin!r}, not {NAME!r}"
    stray = sorted(set(allocation.shares) - set(allocation.containers))
    if stray:
        return f"the allocation gives shares to container {stray[0]} but lists no cards for it"
    totals: dict[tuple[int, str], list[int]] = {}
    for container, by_resource in allocation.containers.items():
        shares = allocation.shares.get(container, {})
        if set(by_resource) != set(shares):
            return (
                f"container {container}: the allocation lists cards for {sorted(by_resource)} "
                f"but shares for {sorted(shares)}"
            )
        for resource, ids in by_resource.items():
            if not resource.startswith(PREFIX):
                return f"container {container}: {resource} is not an Intel GPU resource"
            amounts = shares[resource]
            if len(set(ids)) != len(ids) or set(ids) != set(amounts):
                return f"container {container}: the cards of {resource} ({ids}) do not match its shares"
            for card, amount in amounts.items():
                i = state.index.get(card)
                if i is None:
                    return f"{card} is not an Intel GPU card of this node"
                if taking and not state.healthy[i]:
                    return f"{card} is unhealthy"
                if amount < 0:
                    return f"container {container}: the share of {resource} on {card} is negative ({amount})"
                entry = totals.setdefault((i, resource), [0, 0])
                entry[0] += amount
                entry[1] += 1
    return totals


# ----------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------


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


def pod_needs(pod: PodRequest) -> _PodNeeds:
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
    same: tuple[int, ...] = ()
    if same_text is not None:
        group = same_gpu_containers(same_text, pod.containers, needs)
        if isinstance(group, str):
            problem = problem or group
        else:
            same = group
    return _PodNeeds(tuple(needs), problem, same)


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
