"""Gangs: all-or-nothing placement in a topology (`place_gang`) and gang-aware preemption (`preempt_gang`).

`place_gang` measures each node's room for the gang's members (how many copies of its most demanding member fit,
on a node that passes every filter for it), lets `kubegpu.scheduler.gangfit` choose the domain and the nodes (best
fit, rank by rank in domain order), then reserves member by member (each plugin still chooses the devices inside its
node). Room is an estimate from counts; the reservation is the truth: when one fails, the node's room is corrected
and the choice made again. Either at least `minMember` members hold places, or nothing is held and the answer says
why, in a user's words ("gang ns/train-7: 16 members need 8 nvidia.com/gpu each; the largest rack (rack-3) has 12
such nodes free"). Members already holding places count towards `minMember` and stay where they are.

`preempt_gang` is PostFilter for a gang that fits nowhere: per domain of the gang's level, the lowest-priority
minimal set of pods whose eviction lets the whole gang in (PodDisruptionBudgets respected as `Engine.preempt` does:
pods whose eviction would violate one are kept first), never a set that still leaves the gang unplaceable, and never
a victim gang cut below its own `minMember` (then all of it goes, or the domain is no candidate). A what-if: every
pod is back as it was on return; the front-end evicts and places the gang again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import PodRequest
from kubegpu.core.status import Code
from kubegpu.scheduler import gangfit
from kubegpu.scheduler.engine.filtering import gang_nominee
from kubegpu.scheduler.engine.permit import Permitting
from kubegpu.scheduler.engine.records import Decision, GangPlacement, GangPreemption, NodeRecord, Plan, PodRecord
from kubegpu.scheduler.podgroups import (
    HOSTNAME,
    MAX_LEVELS,
    MAX_MEMBERS,
    PodGroup,
    gang_key,
    member_index,
    member_topology,
    profile_levels,
)
from kubegpu.scheduler.preemption import Budget, Candidate, by_importance, may_preempt, pick, split_by_budget

MAX_ATTEMPTS = 8  # choices made again after a reservation corrected a node's room


def rank(pod: PodRequest) -> tuple[bool, int, tuple[object, ...]]:
    """Members in rank order: by index (`podgroups.member_index`), the unindexed last, by name."""
    index = member_index(pod)
    return index is None, index or 0, gangfit.natural(pod.name)


class Gangs(Permitting):
    """Placing a gang whole, and preempting for one."""

    def set_topology(self, levels: Sequence[str] | None) -> None:
        """The topology levels, widest first (a Kueue `Topology`'s `podgroups.topology_levels`); None: the known
        labels (`podgroups.KNOWN_LEVELS`) found on the nodes."""
        if levels is not None and len(levels) > MAX_LEVELS:
            raise ValueError(f"at most {MAX_LEVELS} topology levels")
        self.levels = None if levels is None else tuple(levels)

    def topology_levels(self) -> tuple[str, ...]:
        """The levels gangs are placed by, widest first, without the hostname (`podgroups.profile_levels`)."""
        return profile_levels(self.levels, (record.info.labels for record in self.nodes.values()))

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
        reason = self._shortfall_reason(group, representative, plan, len(primary), shortfall, asked, beside)
        if others_failed is not None:  # the most demanding members had places; the others found none beside them
            reason = others_failed
        return self._refuse_gang(group.key, members, reason, Code.UNSCHEDULABLE)

    def preempt_gang(
        self, members: Sequence[PodRequest], group: PodGroup | None = None, budgets: Sequence[Budget] = ()
    ) -> GangPreemption:
        """Whom to evict so that the gang fits whole in one domain of its level (its required level, else its
        preferred one, else the narrowest level; the whole cluster without levels): the lowest-priority minimal
        set, budgets respected, victim gangs never cut below their minMember. Changes nothing."""
        todo = sorted((m for m in members if m.key not in self.pods), key=rank)
        if not todo:
            return GangPreemption("", reason="every member already holds a place")
        try:
            group = group or self.gang_of(todo[0])
            asked = self._asked_topology(group, todo)
        except ManifestError as exc:
            return GangPreemption(gang_key(todo[0]) or "", reason=str(exc))
        if group is None:
            group = PodGroup(todo[0].namespace, todo[0].name, len(todo))
        priority = min(m.priority for m in todo)
        if not all(may_preempt(m) for m in todo):
            return GangPreemption(group.key, reason="a member's preemptionPolicy is Never")
        if not any(p < priority for p, count in self._priorities.items() if count > 0):
            return GangPreemption(group.key, reason="no pod of lower priority runs anywhere")
        primary = self._shapes(todo)[0]  # the most demanding members need the domain; the others go beside them
        need = len(primary)
        levels = self.topology_levels()
        level = asked[0] or asked[1] or (levels[-1] if levels else None)
        representative = primary[0]
        gang_keys = {m.key for m in members}
        domains: dict[str, list[str]] = {}
        for name, record in self.nodes.items():
            value = "cluster" if level is None else name if level == HOSTNAME else record.info.labels.get(level)
            if value:
                domains.setdefault(value, []).append(name)
        candidates: list[Candidate] = []
        for value, names in sorted(domains.items(), key=lambda item: gangfit.natural(item[0])):
            lower = [
                key
                for name in names
                for key in self.nodes[name].pods
                if key not in gang_keys and self.pods[key].request.priority < priority
            ]
            if lower:
                candidate = self._gang_victims(representative, names, lower, need, levels, priority, budgets)
                if candidate is not None:
                    candidates.append(Candidate(value, candidate[0], candidate[1]))
        chosen = pick(candidates)
        if chosen is None:
            return GangPreemption(
                group.key,
                level,
                reason=f"gang {group.key}: no domain would fit it even without the pods of lower priority",
            )
        return GangPreemption(group.key, level, chosen.node, tuple(p.key for p in chosen.victims), chosen.violations)

    # -- what the two share ----------------------------------------------------------------------------------------

    def _asked_topology(self, group: PodGroup | None, members: Sequence[PodRequest]) -> tuple[str | None, str | None]:
        """(required, preferred) level: the PodGroup's annotations, else the first member's that has any."""
        if group is not None and (group.required or group.preferred):
            return group.required, group.preferred
        for member in members:
            asked = member_topology(member)
            if asked != (None, None):
                return asked
        return None, None

    def nominate_gang(
        self, gang: str, priority: int, level: str | None, domain: str | None, victims: Iterable[str] = ()
    ) -> None:
        """Hold the nodes of one domain (`level`=`domain`; a gang of no level: the nodes of its `victims`) for a
        preempting gang while its victims leave, as `nominate` holds one node for a pod: pods of equal or lower
        priority are kept off them, the gang's own members are not. Replaces the gang's earlier hold; `place_gang`
        ends it when the gang is placed."""
        self.unnominate_gang(gang)
        if level is None:
            names = tuple(dict.fromkeys(self.pods[key].node for key in victims if key in self.pods))
        elif level == HOSTNAME:
            names = (domain,) if domain in self.nodes else ()
        else:
            names = tuple(name for name, record in self.nodes.items() if record.info.labels.get(level) == domain)
        nominee = gang_nominee(gang)
        for name in names:
            record = self.nodes[name]
            record.nominees[nominee] = priority
            self._refresh(record)
        if names:
            self.nominated_gangs[gang] = names

    def unnominate_gang(self, gang: str) -> None:
        """Release the domain held for a preempting gang (placed, gone, or given up)."""
        nominee = gang_nominee(gang)
        for name in self.nominated_gangs.pop(gang, ()):
            if (record := self.nodes.get(name)) is not None and record.nominees.pop(nominee, None) is not None:
                self._refresh(record)

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

    def _shapes(self, todo: Sequence[PodRequest]) -> list[list[PodRequest]]:
        """The members grouped by what they request (`Plan.fit` and the devices each plugin is asked for), the most
        demanding shape first, each group in rank order."""
        groups: dict[tuple[object, ...], list[PodRequest]] = {}
        for member in todo:
            plan = self.plan(member)
            groups.setdefault((plan.fit, plan.devices), []).append(member)
        if len(groups) == 1:
            return list(groups.values())

        def demand(group: list[PodRequest]) -> tuple[int, int, int]:
            fit = self.plan(group[0]).fit
            return sum(a for r, a in fit if r != "cpu"), group[0].cpu_milli, len(group)

        return sorted(groups.values(), key=demand, reverse=True)

    def _near(
        self, holders: Sequence[str], required: str | None, levels: Sequence[str], rooms: dict[str, int], need: int
    ) -> tuple[dict[str, int], str | None]:
        """Where members join a gang whose other members hold places (they arrived late, the scheduler restarted
        mid-gang, or they are a launcher placed after its workers): with a required level, only the holders'
        domain of it; else the narrowest domain of the holders with room for `need` more (the whole cluster when
        none has). The rooms there, and that domain in words (None: the whole cluster)."""
        for level in [required] if required is not None else reversed(levels):
            near, where = self._beside(holders, level, rooms)
            if required is not None or sum(near.values()) >= need:
                return near, where
        return rooms, None

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

    def _beside(self, holders: Sequence[str], level: str, rooms: dict[str, int]) -> tuple[dict[str, int], str]:
        """The rooms in the domain of `level` where the gang's members already hold places (a gang bound in part
        by a scheduler that restarted, or members that waited at Permit): the rest of a gang that requires one
        domain goes where its first members are."""

        def domain(name: str) -> str | None:
            record = self.nodes.get(name)
            return None if record is None else name if level == HOSTNAME else record.info.labels.get(level)

        held = {domain(self.pods[key].node) for key in holders}
        near = {name: room for name, room in rooms.items() if domain(name) in held}
        named = ", ".join(sorted(str(value) for value in held)[:3]) + (", ..." if len(held) > 3 else "")
        return near, f"in {level.rsplit('/', 1)[-1]} {named}"

    def _rooms(self, pod: PodRequest, plan: Plan, names: Iterable[str]) -> dict[str, int]:
        """Each node's room for copies of `pod`: 0 where a filter refuses it, else how many fit by the counts of
        what it requests (at least 1); the reservation checks each copy."""
        judge = self._cluster_state(pod, plan).judge if plan.volatile else None
        rooms: dict[str, int] = {}
        for name in names:
            record = self.nodes[name]
            rooms[name] = self._room(record, pod, plan) if self.check(record, pod, plan, judge=judge).ok else 0
        return rooms

    @staticmethod
    def _room(record: NodeRecord, pod: PodRequest, plan: Plan) -> int:
        allocatable = record.info.allocatable
        room = allocatable.get("pods", 110) - record.used["pods"]
        for resource, amount in plan.fit:
            if amount > 0 and resource in allocatable:
                room = min(room, record.free(resource) // amount)
        return max(room, 1)

    def _reserve_slots(
        self, todo: Sequence[PodRequest], fit: gangfit.Fit
    ) -> tuple[list[Decision] | None, dict[str, int]]:
        """Reserve the members along the chosen slots. All reserved: their decisions. Else everything reserved here
        is given back, with each node's room corrected to what it took."""
        decisions: list[Decision] = []
        corrected: dict[str, int] = {}
        members = iter(todo)
        for node, count in fit.slots:
            for took in range(count):
                member = next(members, None)
                if member is None:
                    break
                decision = self.reserve(member, node)
                if not decision.scheduled:
                    corrected[node] = took
                    break
                decisions.append(decision)
            if node in corrected:
                break
        if len(decisions) == min(len(todo), sum(count for _, count in fit.slots)):
            return decisions, corrected
        for decision in decisions:
            self.unreserve(next(m for m in todo if m.key == decision.pod), decision.node)
        return None, corrected

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
    ) -> str:
        wants = [(r, a) for r, a in plan.fit if r not in ("cpu", "memory", "ephemeral-storage")]
        what = ", ".join(f"{a} {r}" for r, a in wants) or f"{pod.cpu_milli}m cpu"
        head = f"gang {group.key}: {need} members need {what} each"
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

    def _gang_victims(
        self,
        pod: PodRequest,
        names: Sequence[str],
        lower: Sequence[str],
        need: int,
        levels: Sequence[str],
        priority: int,
        budgets: Sequence[Budget],
    ) -> tuple[tuple[PodRequest, ...], int] | None:
        """In one domain (`names`): the fewest of `lower` to evict so that `need` copies of `pod` fit there, with
        the victims' gangs kept whole or evicted whole; (victims, budget violations), or None."""
        plan = self.plan(pod)
        out: dict[str, PodRecord] = {}
        requests = {key: self.pods[key].request for key in lower}

        def fits() -> bool:
            rooms = self._rooms(pod, self.plan(pod), names)
            labels = {name: self.nodes[name].info.labels for name in names}
            return isinstance(gangfit.choose(rooms, labels, levels, need), gangfit.Fit)

        try:
            for key in lower:
                if (released := self.release(key)) is not None:
                    out[key] = released
            if not fits():
                return None
            violating, others = split_by_budget(by_importance(requests.values()), budgets)
            victims: list[PodRequest] = []
            violations = 0
            for request in violating + others:
                self._put_back(out.pop(request.key))
                if fits():
                    continue  # reprieved
                if (released := self.release(request.key)) is not None:
                    out[request.key] = released
                victims.append(request)
                violations += request in violating
            whole = self._whole_gangs(victims, priority)
            if whole is None:
                return None
            for request in whole:
                if (released := self.release(request.key)) is not None:
                    out[request.key] = released
            del plan
            return (*victims, *whole), violations
        finally:
            for released in out.values():
                self._put_back(released)

    def _whole_gangs(self, victims: Sequence[PodRequest], priority: int) -> list[PodRequest] | None:
        """The other members of the victims' gangs that must go too: a gang left below its minMember goes whole.
        None when such a member is not of lower priority (the gang cannot go, so neither can its victim)."""
        extra: dict[str, PodRequest] = {}
        chosen = {v.key for v in victims}
        gangs: dict[str, PodGroup] = {}
        for victim in victims:
            try:
                group = self.gang_of(victim)
            except ManifestError:
                group = None
            if group is not None:
                gangs[group.key] = group
        for group in gangs.values():
            holders = [key for key in self.gang_holders(group) if key not in chosen]
            if not holders or len(holders) >= group.min_member:
                continue
            for key in holders:
                request = self.pods[key].request
                if request.priority >= priority:
                    return None
                extra[key] = request
        return list(extra.values())


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
