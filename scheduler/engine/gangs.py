"""Gangs: all-or-nothing placement in a topology (`place_gang`).

`place_gang` measures each node's room for the gang's members (how many copies of its most demanding member fit,
on a node that passes every filter for it: `gangdomains`), lets `kubegpu.scheduler.gangfit` choose the domain and the
nodes (best fit, rank by rank in domain order), then reserves member by member (each plugin still chooses the devices
inside its node). Room is an estimate from counts; the reservation is the truth: when one fails, the node's room is
corrected and the choice made again. Either at least `minMember` members hold places, or nothing is held and the
answer says why, in a user's words ("gang ns/train-7: 16 members need 8 nvidia.com/gpu each; the largest rack (rack-3)
has 12 such nodes free"). Members already holding places count towards `minMember` and stay where they are.

A gang that fits nowhere is preempted for by `gangpreempt.preempt_gang`, below this layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import PodRequest
from kubegpu.core.status import Code
from kubegpu.scheduler import gangfit
from kubegpu.scheduler.engine.gangdomains import rank
from kubegpu.scheduler.engine.gangpreempt import GangPreempting
from kubegpu.scheduler.engine.records import Decision, GangPlacement, Plan
from kubegpu.scheduler.podgroups import MAX_MEMBERS, PodGroup, gang_key

MAX_ATTEMPTS = 8  # choices made again after a reservation corrected a node's room


class Gangs(GangPreempting):
    """Placing a gang whole."""

    def place_gang(
        self, members: Sequence[PodRequest], group: PodGroup | None = None, *, partial: bool = False
    ) -> GangPlacement:
        """Reserve places for the gang's members, all or nothing: at least `minMember` of them (with those already
        holding places) hold reservations on return, every one in the domain the gang asks for, or none does and
        the answer says why. `group`: the gang (None: the first member's, `gang_of`). Members go rank by rank in
        domain order. The front-end then asks Permit (`permit`) for each and binds the approved ones.

        `partial`: a gang with fewer members than `minMember` so far (the live scheduler's, whose members arrive one
        by one) places those it has, all of them, in a domain with room for `minMember`, for Permit to hold while
        the others arrive; without it such a gang is refused ("waiting for the others")."""

        if not members:
            return GangPlacement("", False, reason="a gang of no members", code=Code.UNRESOLVABLE)
        try:
            group = group or self.gang_of(members[0])
            asked = self._asked_topology(group, members)
        except ManifestError as exc:
            return self._refuse_gang(gang_key(members[0]) or members[0].key, members, str(exc), Code.UNRESOLVABLE)
        if group is None:
            group = PodGroup(members[0].namespace, members[0].name, len(members))
        if len(members) > MAX_MEMBERS:
            return self._refuse_gang(group.key, members, f"more than {MAX_MEMBERS} members", Code.UNRESOLVABLE)
        holders = self.gang_holders(group)
        todo = sorted((m for m in members if m.key not in self.pods), key=rank)
        for member in todo:  # the PreFilter, as a cycle runs it for one pod: a plugin's fit need not repeat it
            status = self._validate(member, self._route(member))
            if not status.ok:
                return self._refuse_gang(group.key, members, f"{member.key}: {status.message}", status.code)
        least = max(0, group.min_member - len(holders))
        if len(todo) < least and not partial:
            reason = (
                f"gang {group.key}: {len(todo) + len(holders)} of minMember {group.min_member} members present; "
                "waiting for the others"
            )
            return self._refuse_gang(group.key, members, reason, Code.UNSCHEDULABLE)
        if not todo:
            return GangPlacement(group.key, True, tuple(self._held(m) for m in members))
        if group.min_resources and (gap := self._resource_gap(group, holders)) is not None:
            return self._refuse_gang(group.key, members, gap, Code.UNSCHEDULABLE)
        # Room is counted per member shape: the most demanding shape's members choose the domain and the nodes, the
        # others (a launcher beside its workers) go beside them.
        shapes = self._shapes(todo)
        primary, others = shapes[0], shapes[1:]
        representative = primary[0]
        plan = self.plan(representative)
        rooms = self._rooms(representative, plan, self.nodes)
        levels = self.topology_levels()
        rest = len(todo) - len(primary)
        least_primary = max(0, least - rest)
        beside: str | None = None
        if holders:
            rooms, beside = self._near(holders, asked[0], levels, rooms, max(len(primary), least_primary))
        targets = (
            [least_primary]
            if len(primary) < least_primary
            else [len(primary)] + ([least_primary] if 0 < least_primary < len(primary) else [])
        )
        shortfall: gangfit.Shortfall | None = None
        others_failed: str | None = None
        for target in targets:
            for _ in range(MAX_ATTEMPTS):
                labels = {name: self.nodes[name].info.labels for name, room in rooms.items() if room > 0}
                fit = gangfit.choose(rooms, labels, levels, target, required=asked[0], preferred=asked[1])
                if isinstance(fit, gangfit.Shortfall):
                    shortfall = shortfall or fit
                    break
                decisions, corrected = self._reserve_slots(primary, fit)
                if decisions is None:
                    rooms.update(corrected)
                    continue
                placed_others = self._place_beside(others, [*holders, *(d.pod for d in decisions)], asked, levels)
                if isinstance(placed_others, str):
                    # The others found no room beside this choice: give it back and choose elsewhere.
                    others_failed = placed_others
                    for decision in decisions:
                        self.unreserve(next(m for m in primary if m.key == decision.pod), decision.node)
                    rooms.update({node: 0 for node, _ in fit.slots})
                    continue
                self.unnominate_gang(group.key)
                placed = {d.pod: d for d in (*decisions, *placed_others)}
                answer = tuple(
                    placed.get(m.key)
                    or (
                        self._held(m)
                        if m.key in self.pods
                        else Decision(
                            m.key, False, reason=f"gang {group.key}: placed without it", code=Code.UNSCHEDULABLE
                        )
                    )
                    for m in sorted(members, key=rank)
                )
                return GangPlacement(group.key, True, answer, fit.level, fit.domain)
        # The count the room was measured for: with fewer members than minMember so far (`partial`), minMember's,
        # not those present ("2 members need 8 GPUs each; the rack has 2 such nodes free" reads as a contradiction).
        need = targets[0]
        so_far = len(holders) + len(todo) if need > len(primary) else None
        reason = self._shortfall_reason(group, representative, plan, need, shortfall, asked, beside, so_far)
        if others_failed is not None:  # the most demanding members had places; the others found none beside them
            reason = others_failed
        return self._refuse_gang(group.key, members, reason, Code.UNSCHEDULABLE)

    def _resource_gap(self, group: PodGroup, holders: Sequence[str]) -> str | None:
        """scheduler-plugins' coscheduling PreFilter: the PodGroup's `minResources` must be free in the cluster (what
        the gang's own members hold counts as free), else why not; None when it is."""
        free = dict.fromkeys(group.min_resources, 0)
        for record in self.nodes.values():
            for resource in free:
                free[resource] += max(0, record.free(resource))
        for key in holders:
            for resource in free:
                free[resource] += _requested(self.pods[key].request, resource)
        short = [
            f"{_amount(resource, need)} {resource} (free: {_amount(resource, free[resource])})"
            for resource, need in sorted(group.min_resources.items())
            if free[resource] < need
        ]
        if not short:
            return None
        return f"gang {group.key}: PodGroup.spec.minResources is not free in the cluster: {', '.join(short)}"

    def _place_beside(
        self,
        shapes: Sequence[Sequence[PodRequest]],
        holders: list[str],
        asked: tuple[str | None, str | None],
        levels: Sequence[str],
    ) -> list[Decision] | str:
        """Reserve each of `shapes` (members alike in what they request) beside the gang's `holders`: their
        decisions, or why one shape found no room (then nothing of theirs is held)."""
        decisions: list[Decision] = []
        for shape in shapes:
            plan = self.plan(shape[0])
            rooms, where = self._near(holders, asked[0], levels, self._rooms(shape[0], plan, self.nodes), len(shape))
            placed: list[Decision] | None = None
            for _ in range(MAX_ATTEMPTS):
                labels = {name: self.nodes[name].info.labels for name, room in rooms.items() if room > 0}
                fit = gangfit.choose(rooms, labels, levels, len(shape), required=asked[0])
                if isinstance(fit, gangfit.Shortfall):
                    break
                placed, corrected = self._reserve_slots(shape, fit)
                if placed is not None:
                    break
                rooms.update(corrected)
            if placed is None:
                for decision in decisions:
                    self.unreserve(self.pods[decision.pod].request, decision.node)
                wants = ", ".join(f"{a} {r}" for r, a in plan.fit if a) or "nothing"
                return (
                    f"gang {gang_key(shape[0]) or shape[0].key}: {len(shape)} members need {wants} each beside the "
                    f"{len(holders)} members placed {where or 'in the cluster'}; there is no room for them there"
                )
            decisions.extend(placed)
            holders = [*holders, *(d.pod for d in placed)]
        return decisions

    def _held(self, member: PodRequest) -> Decision:
        held = self.pods[member.key]
        return Decision(
            member.key, True, node=held.node, allocation=held.allocation, annotations=dict(held.annotations)
        )

    @staticmethod
    def _refuse_gang(key: str, members: Sequence[PodRequest], reason: str, code: Code) -> GangPlacement:
        refused = tuple(Decision(m.key, False, reason=reason, code=code) for m in sorted(members, key=rank))
        return GangPlacement(key, False, refused, reason=refused[0].reason if refused else reason, code=code)

    def _shortfall_reason(
        self,
        group: PodGroup,
        pod: PodRequest,
        plan: Plan,
        need: int,
        shortfall: gangfit.Shortfall | None,
        asked: tuple[str | None, str | None],
        beside: str | None = None,
        so_far: int | None = None,
    ) -> str:
        """`so_far`: the members that exist, where fewer than the `need` the room was measured for."""
        wants = [(r, a) for r, a in plan.fit if r not in ("cpu", "memory", "ephemeral-storage")]
        what = ", ".join(f"{a} {r}" for r, a in wants) or f"{pod.cpu_milli}m cpu"
        count = f"{need} members"
        if so_far is not None:
            count += f" (minMember {group.min_member}, {so_far} so far)"
        head = f"gang {group.key}: {count} need {what} each"
        if shortfall is None:
            return f"{head}; their reservations failed on every choice"
        if beside is not None and asked[0] is not None:
            # Members joining a gang that requires one domain go only where the others hold places.
            return f"{head} beside the members that hold places {beside}; it has room for {shortfall.room} of them"
        if shortfall.room == 0 and shortfall.level is None:
            decision = self.decide(pod)
            return f"{head}; no node fits one: {decision.reason}"
        if shortfall.level is None:
            where = "the cluster"
        elif shortfall.domain is None:
            where = f"no node has the label {shortfall.level}, so no"
            return f"{head} in one {shortfall.level} domain; {where} domain exists"
        else:
            where = f"the largest {shortfall.level.rsplit('/', 1)[-1]} ({shortfall.domain})"
        if shortfall.room == shortfall.nodes:
            return f"{head}; {where} has {shortfall.room} such nodes free"
        return f"{head}; {where} has room for {shortfall.room} of them on {shortfall.nodes} nodes"


def _requested(pod: PodRequest, resource: str) -> int:
    """What the pod takes of `resource` on its node, as a node's usage counts it (cpu in millicores)."""
    if resource == "cpu":
        return pod.cpu_milli
    if resource == "memory":
        return pod.memory
    if resource == "pods":
        return 1
    return pod.requests.get(resource, 0)


def _amount(resource: str, amount: int) -> str:
    """An amount as a PodGroup's `minResources` writes it: cpu in cores (kept in millicores), else whole units."""
    if resource == "cpu":
        return f"{amount / 1000:g}"
    return str(amount)


def summary(placement: GangPlacement) -> Mapping[str, object]:
    """A gang placement as plain values (for reports and logs)."""
    return {
        "gang": placement.gang,
        "placed": placement.placed,
        "level": placement.level,
        "domain": placement.domain,
        "members": [d.pod for d in placement.decisions if d.scheduled],
        "reason": placement.reason,
    }
