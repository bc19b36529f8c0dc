"""The extender's gang plans: one what-if placement per gang, kept while nothing it relied on changes.

kube-scheduler asks the extender's `/filter` about one gang member at a time and binds each at once, so every member
is answered from a placement of the whole gang (`Engine.place_gang`, given back at once). Made afresh for each
member, that placement costs the gang's size each time, and binding a gang of N members one by one costs N squared
(4,000 members: about 0.7 s for each member's `/filter`). A `GangPlan` is that placement kept for the gang: which
node each unbound member went to in the what-if, as of one engine change (`Engine.generation`), for one PodGroup
and one state of the gang's unbound members (`UnboundPods`' count of their changes, `epoch`). A member's `/filter`
answered from a kept plan costs a few dictionary look-ups, whatever the gang's size.

It holds while the cluster changes only by the extender binding a planned member to a node the plan had for a
member alike (equal `Plan.signature`): the bound member leaves the plan, one planned place on that node with it
(another alike member takes the bound one's planned place if it was elsewhere), and the plan moves on to the
change the reservation made. It holds too across changes of other nodes (`catch_up`: an ordinary pod bound
elsewhere between two members, as kube-scheduler's queue interleaves them; re-planned for each, binding a gang of
1,024 members cost 0.23 s a member instead of 4 ms), while none touched a node the plan uses or one a member of the
gang holds, the plan placed the gang, and its members' answers depend on their own nodes alone (no pod
(anti-)affinity or hard spread, no placed pod's anti-affinity newly matching them: one `Plan.stamp` for all). Its
places stay free then; a fresh plan might choose others, never refuse these. Anything else re-plans: a change of
the plan's nodes or the gang's (a pod bound, deleted or resized there, a node gone), a member added, updated or
gone, the PodGroup changed (tests/scheduler/test_extender_gangs.py holds the memo against a fresh plan).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kubegpu.core.models import PodRequest
from kubegpu.scheduler.podgroups import PodGroup

MAX_PLANS = 1024  # gangs whose plans are kept (the least recently asked go first)


@dataclass(slots=True)
class GangPlan:
    """One gang's what-if placement, valid at engine change `generation` for `group` and the gang's unbound members
    as of their change count `epoch`; `waiting`: those of them not bound since. `answer`: why the gang cannot be
    placed whole, or None when it can; then `node_of` is each planned member's node, `shape_of` its
    `Plan.signature`, and `on_node` the planned members of each node (the nodes a member is offered: those with at
    least one). `stamp`: the `Plan.stamp` every member's plan had (None: not one for all, or one that moves with
    every change); `held_on`: the nodes where members of the gang hold places (`catch_up`); `namespaces`: the
    engine's namespace epoch it was made at (`Engine.namespace_epoch`: a relabel moves no node, yet may change
    what a member's or a placed pod's term selects)."""

    group: PodGroup
    generation: int
    epoch: int
    waiting: set[str]
    answer: str | None = None
    node_of: dict[str, str] = field(default_factory=dict)
    shape_of: dict[str, tuple[object, ...]] = field(default_factory=dict)
    on_node: dict[str, dict[str, None]] = field(default_factory=dict)
    stamp: int | None = None
    held_on: set[str] = field(default_factory=set)
    namespaces: int = 0

    def holds(self, group: PodGroup, generation: int, epoch: int) -> bool:
        return self.generation == generation and self.epoch == epoch and self.group == group

    def catch_up(self, generation: int, stamp: int, changed_since: Callable[[int], set[str] | None]) -> bool:
        """Move the plan on to engine change `generation` when what changed since leaves it as it was (other nodes
        only: see the module's doc); `stamp` is the asking member's `Plan.stamp` now. False when it cannot."""
        if self.generation == generation:
            return True
        if self.answer is not None or self.stamp is None or stamp != self.stamp or self.generation > generation:
            return False
        changed = changed_since(self.generation)
        if changed is None or not changed.isdisjoint(self.on_node) or not changed.isdisjoint(self.held_on):
            return False
        self.generation = generation
        return True

    def place(self, key: str, node: str, shape: tuple[object, ...]) -> None:
        self.node_of[key] = node
        self.shape_of[key] = shape
        self.on_node.setdefault(node, {})[key] = None

    def bound(self, key: str, node: str, before: int, after: int) -> bool:
        """Member `key` was just bound to `node` by a reservation that moved the engine from change `before` to
        `after`: True when the plan still holds (it moved on), False when it must be made again."""
        if self.generation != before or self.answer is not None or key not in self.waiting:
            return False
        planned = self.node_of.get(key)
        if planned is None:
            return False
        if planned != node:
            # A member alike planned on `node` takes this one's planned place; its place on `node` is the one taken.
            shape = self.shape_of[key]
            other = next((k for k in self.on_node.get(node, ()) if self.shape_of[k] == shape), None)
            if other is None:
                return False
            self._unplace(other)
            self.place(other, planned, shape)
        self._unplace(key)
        self.waiting.discard(key)
        self.held_on.add(node)
        self.generation = after
        return True

    def _unplace(self, key: str) -> None:
        node = self.node_of.pop(key)
        del self.shape_of[key]
        members = self.on_node[node]
        del members[key]
        if not members:
            del self.on_node[node]


class GangPlans:
    """The plans of the gangs the extender was asked about, by gang key, least recently asked first."""

    def __init__(self) -> None:
        self.plans: dict[str, GangPlan] = {}

    def get(
        self,
        key: str,
        group: PodGroup,
        generation: int,
        epoch: int,
        stamp: int = -1,
        changed_since: Callable[[int], set[str] | None] | None = None,
        namespaces: int = 0,
    ) -> GangPlan | None:
        """The gang's plan if it holds at engine change `generation` (moved on to it across other nodes' changes
        when `changed_since` is given: `GangPlan.catch_up`), for `group`, the gang's change count `epoch` and the
        engine's namespace epoch `namespaces`."""
        plan = self.plans.pop(key, None)
        if plan is None or plan.epoch != epoch or plan.group != group or plan.namespaces != namespaces:
            return None
        if changed_since is not None:
            plan.catch_up(generation, stamp, changed_since)
        if not plan.holds(group, generation, epoch):
            return None
        self.plans[key] = plan  # re-inserted last: the dict is kept in LRU order
        return plan

    def keep(self, key: str, plan: GangPlan) -> None:
        self.plans.pop(key, None)
        if len(self.plans) >= MAX_PLANS:
            del self.plans[next(iter(self.plans))]
        self.plans[key] = plan

    def catch_up(self, gang: str, generation: int, stamp: int, changed_since: Callable[[int], set[str] | None]) -> None:
        """Before the extender reserves a member of `gang`: its plan moved on to `generation` where it can
        (`GangPlan.catch_up`), so that the binding follows it (an ordinary pod bound elsewhere since the member's
        `/filter` leaves the plan as it was)."""
        plan = self.plans.get(gang)
        if plan is not None:
            plan.catch_up(generation, stamp, changed_since)

    def bound(self, gang: str, pod: PodRequest, node: str, before: int, after: int) -> bool:
        """The extender bound `pod` (of `gang`) to `node`: its gang's plan moves on (True), or is dropped."""
        plan = self.plans.get(gang)
        if plan is None:
            return False
        if plan.bound(pod.key, node, before, after):
            return True
        del self.plans[gang]
        return False

    def drop(self, gang: str) -> None:
        """The gang has no member waiting any more (`UnboundPods`): nothing of its plan is kept."""
        self.plans.pop(gang, None)
