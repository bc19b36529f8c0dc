"""A deliberately small scheduler plugin for engine tests: `toy.example/card` whole cards from a node label.

It lets the engine's own behaviour (routing, filter order, reasons, policy, ledger, rollback, isolation) be tested
without depending on any real device family's rules. `BROKEN_HOOKS` makes chosen hooks raise.
"""

from __future__ import annotations

from kubegpu.core.models import NodeInfo, Occupancy, PluginAllocation, PodRequest
from kubegpu.core.scheduler_hooks import DeviceNodeState, Headroom, hookimpl
from kubegpu.core.status import Status

NAME = "toy"
RESOURCE = "toy.example/card"
BROKEN_HOOKS: set[str] = set()


class ToyState(DeviceNodeState):
    plugin = NAME

    def __init__(self, node: str, count: int) -> None:
        super().__init__(node)
        self.cards = [str(i) for i in range(count)]
        self.held: dict[str, str] = {}

    def free(self) -> list[str]:
        return [c for c in self.cards if c not in self.held]


def _maybe_break(hook: str) -> None:
    if hook in BROKEN_HOOKS:
        raise RuntimeError(f"toy {hook} exploded")


def _need(pod: PodRequest) -> list[tuple[str, int]]:
    return [(c.name, c.resources[RESOURCE]) for c in pod.containers if c.resources.get(RESOURCE, 0) > 0]


@hookimpl
def kubegpu_scheduler_resources() -> list[str]:
    return [RESOURCE]


@hookimpl
def kubegpu_scheduler_build_node(node: NodeInfo) -> ToyState | None:
    _maybe_break("build_node")
    count = int(node.labels.get("toy.example/cards", "0"))
    return ToyState(node.name, count) if count else None


@hookimpl
def kubegpu_scheduler_headroom(state: ToyState) -> Headroom:
    return Headroom({RESOURCE: len(state.free())}, len(state.held) / len(state.cards))


@hookimpl
def kubegpu_scheduler_validate(pod: PodRequest) -> Status | None:
    if pod.annotations.get("toy.example/refuse"):
        return Status.unresolvable("toy requests marked refuse are refused", plugin=NAME)
    return None


@hookimpl
def kubegpu_scheduler_fit(state: ToyState, pod: PodRequest) -> Status:
    _maybe_break("fit")
    total = sum(n for _, n in _need(pod))
    if total > len(state.cards):
        return Status.unresolvable(f"Insufficient {RESOURCE}", plugin=NAME)
    if total > len(state.free()):
        return Status.unschedulable(f"Insufficient {RESOURCE}", plugin=NAME)
    return Status.success()


@hookimpl
def kubegpu_scheduler_score(state: ToyState, pod: PodRequest) -> float:
    return 50.0


@hookimpl
def kubegpu_scheduler_allocate(state: ToyState, pod: PodRequest) -> PluginAllocation | None:
    free = state.free()
    containers: dict[str, dict[str, list[str]]] = {}
    for name, count in _need(pod):
        if count > len(free):
            return None
        containers[name] = {RESOURCE: free[:count]}
        free = free[count:]
    return PluginAllocation(plugin=NAME, containers=containers, annotations={"toy.example/seen": "yes"})


@hookimpl
def kubegpu_scheduler_take(state: ToyState, pod_key: str, allocation: PluginAllocation) -> Status:
    _maybe_break("take")
    ids = allocation.device_ids()
    for card in ids:
        if card not in state.cards:
            return Status.error(f"card {card} does not exist", plugin=NAME)
        if card in state.held:
            return Status.error(f"card {card} is already held by {state.held[card]}", plugin=NAME)
    for card in ids:
        state.held[card] = pod_key
    return Status.success()


@hookimpl
def kubegpu_scheduler_release(state: ToyState, pod_key: str, allocation: PluginAllocation) -> Status:
    for card in allocation.device_ids():
        if state.held.get(card) == pod_key:
            del state.held[card]
    return Status.success()


@hookimpl
def kubegpu_scheduler_describe(state: ToyState) -> list[Occupancy]:
    return [Occupancy(family=NAME, total=len(state.cards), free=len(state.free()), largest_fit=len(state.free()))]
