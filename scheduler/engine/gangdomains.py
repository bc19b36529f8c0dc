"""Gang domains: the topology levels gangs are placed by, the domains held for a preempting gang, and each node's
room for a gang's members.

The bookkeeping both gang placement (`gangs.place_gang`) and gang-aware preemption (`gangpreempt.preempt_gang`) stand
on: which levels the cluster has (`set_topology`, `topology_levels`), which level a gang asks for (its PodGroup's, else
a member's annotations), the nodes of one domain held for a preempting gang while its victims leave (`nominate_gang`,
`unnominate_gang`, as `nominate` holds one node for a pod), the members grouped by what they request (the most
demanding shape chooses the domain), and how many copies of a member each node has room for (0 where a filter
refuses it; an estimate from counts that the reservation checks), in a whole cluster or beside the members that
already hold places.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kubegpu.core.models import PodRequest
from kubegpu.scheduler import gangfit
from kubegpu.scheduler.engine.filtering import gang_nominee
from kubegpu.scheduler.engine.permit import Permitting
from kubegpu.scheduler.engine.records import NodeRecord, Plan
from kubegpu.scheduler.podgroups import HOSTNAME, MAX_LEVELS, PodGroup, member_index, member_topology, profile_levels


def rank(pod: PodRequest) -> tuple[bool, int, tuple[object, ...]]:
    """Members in rank order: by index (`podgroups.member_index`), the unindexed last, by name."""
    index = member_index(pod)
    return index is None, index or 0, gangfit.natural(pod.name)


class GangDomains(Permitting):
    """The topology levels, the domains held for preempting gangs, and the room for a gang's members."""

    def set_topology(self, levels: Sequence[str] | None) -> None:
        """The topology levels, widest first (a Kueue `Topology`'s `podgroups.topology_levels`); None: the known
        labels (`podgroups.KNOWN_LEVELS`) found on the nodes."""
        if levels is not None and len(levels) > MAX_LEVELS:
            raise ValueError(f"at most {MAX_LEVELS} topology levels")
        self.levels = None if levels is None else tuple(levels)

    def topology_levels(self) -> tuple[str, ...]:
        """The levels gangs are placed by, widest first, without the hostname (`podgroups.profile_levels`)."""
        return profile_levels(self.levels, (record.info.labels for record in self.nodes.values()))

    def nominate_gang(
        self, gang: str, priority: int, level: str | None, domain: str | None, victims: Iterable[str] = ()
    ) -> tuple[str, ...]:
        """Hold the nodes of one domain (`level`=`domain`; a gang of no level: the nodes of its `victims`) for a
        preempting gang while its victims leave, as `nominate` holds one node for a pod: pods of equal or lower
        priority are kept off them, the gang's own members are not. Replaces the gang's earlier hold; `place_gang`
        ends it when the gang is placed. Returns the nodes held."""
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
        return names

    def unnominate_gang(self, gang: str) -> None:
        """Release the domain held for a preempting gang (placed, gone, or given up)."""
        nominee = gang_nominee(gang)
        for name in self.nominated_gangs.pop(gang, ()):
            if (record := self.nodes.get(name)) is not None and record.nominees.pop(nominee, None) is not None:
                self._refresh(record)

    def _asked_topology(self, group: PodGroup | None, members: Sequence[PodRequest]) -> tuple[str | None, str | None]:
        """(required, preferred) level: the PodGroup's annotations, else the first member's that has any."""
        if group is not None and (group.required or group.preferred):
            return group.required, group.preferred
        for member in members:
            asked = member_topology(member)
            if asked != (None, None):
                return asked
        return None, None

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
