"""Gang-aware preemption (`preempt_gang`): PostFilter for a gang that fits nowhere.

Per domain of the gang's level, the lowest-priority minimal set of pods whose eviction lets the whole gang in
(PodDisruptionBudgets respected as `Engine.preempt` does: pods whose eviction would violate one are kept first), never
a set that still leaves the gang unplaceable, and never a victim gang cut below its own `minMember` (then all of it
goes, or the domain is no candidate). A what-if: every pod is back as it was on return; the front-end evicts
(holding the domain with `nominate_gang`) and places the gang again (`gangs.place_gang`). A single pod's preemption
keeps its victims' gangs whole the same way (`_gangs_kept_whole`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import PodRequest
from kubegpu.scheduler import gangfit
from kubegpu.scheduler.engine.gangdomains import GangDomains, rank
from kubegpu.scheduler.engine.records import Decision, GangPreemption, PodRecord
from kubegpu.scheduler.podgroups import HOSTNAME, PodGroup, gang_key
from kubegpu.scheduler.preemption import (
    Budget,
    Candidate,
    added_violations,
    by_importance,
    may_preempt,
    pick,
    split_by_budget,
)


class GangPreempting(GangDomains):
    """Preempting for a gang: whom to evict so that it fits whole in one domain."""

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
        # The most demanding members need the domain; the others go beside them.
        shapes = self._shapes(todo)
        levels = self.topology_levels()
        level = asked[0] or asked[1] or (levels[-1] if levels else None)
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
                candidate = self._gang_victims(shapes, names, lower, levels, priority, budgets)
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

    def _gang_victims(
        self,
        shapes: Sequence[Sequence[PodRequest]],
        names: Sequence[str],
        lower: Sequence[str],
        levels: Sequence[str],
        priority: int,
        budgets: Sequence[Budget],
    ) -> tuple[tuple[PodRequest, ...], int] | None:
        """In one domain (`names`): the fewest of `lower` to evict so that the gang's members (`shapes`, the most
        demanding first) fit there, with the victims' gangs kept whole or evicted whole; (victims, budget
        violations), or None."""
        pod = shapes[0][0]
        plan = self.plan(pod)
        out: dict[str, PodRecord] = {}
        requests = {key: self.pods[key].request for key in lower}
        labels = {name: self.nodes[name].info.labels for name in names}

        def fits() -> bool:
            rooms = self._rooms(pod, self.plan(pod), names)
            fit = gangfit.choose(rooms, labels, levels, len(shapes[0]))
            if not isinstance(fit, gangfit.Fit):
                return False
            return len(shapes) == 1 or self._others_fit(shapes, fit, names, labels, levels)

        try:
            for key in lower:
                if (released := self._set_aside(key)) is not None:
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
                if (released := self._set_aside(request.key)) is not None:
                    out[request.key] = released
                victims.append(request)
                violations += request in violating
            whole = self._whole_gangs(victims, priority)
            if whole is None:
                return None
            for request in whole:
                if (released := self._set_aside(request.key)) is not None:
                    out[request.key] = released
            del plan
            return (*victims, *whole), violations + added_violations(victims, whole, budgets)
        finally:
            for released in out.values():
                self._put_back(released)

    def _others_fit(
        self,
        shapes: Sequence[Sequence[PodRequest]],
        fit: gangfit.Fit,
        names: Sequence[str],
        labels: Mapping[str, Mapping[str, str]],
        levels: Sequence[str],
    ) -> bool:
        """Whether the gang's other shapes (a 1-GPU driver beside its 8-GPU workers) find room in the domain
        (`names`, each node's `labels`) once its most demanding members hold the places `fit` chose; with the room
        counted for those alone, a domain was emptied for a gang that still could not go. A what-if: what it reserves
        is given back."""
        held: list[tuple[PodRequest, str]] = []
        try:
            decisions, _ = self._reserve_slots(shapes[0], fit)
            if decisions is None:
                return True  # the estimate is all there is to go by, as for a gang of one shape
            by_key = {m.key: m for m in shapes[0]}
            held.extend((by_key[d.pod], d.node or "") for d in decisions)
            for shape in shapes[1:]:
                rooms = self._rooms(shape[0], self.plan(shape[0]), names)
                other = gangfit.choose(rooms, labels, levels, len(shape))
                if not isinstance(other, gangfit.Fit):
                    return False
                placed, _ = self._reserve_slots(shape, other)
                if placed is None:
                    return False
                by_key = {m.key: m for m in shape}
                held.extend((by_key[d.pod], d.node or "") for d in placed)
            return True
        finally:
            for member, node in held:
                self.unreserve(member, node)

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

    def _gangs_kept_whole(self, candidate: Candidate, priority: int, budgets: Sequence[Budget]) -> Candidate | None:
        """A pod's preemption (`Engine.preempt`) keeps its victims' gangs whole, as a gang's does: a worker evicted
        from a training gang left the others running below `minMember`, useless, holding their GPUs until their job
        failed; Kueue, too, evicts a gang's workload whole. The other members that must go are added to the
        candidate (costing it in `pick`, so a node whose victims break no gang wins), or None where one of them is
        not of lower priority. Those members' budgets count as the victims' do: uncounted, a node whose eviction broke
        a gang's budget through its other members looked as if it broke none, and won."""
        whole = self._whole_gangs(candidate.victims, priority)
        if whole is None:
            return None
        if not whole:
            return candidate
        violations = candidate.violations + added_violations(candidate.victims, whole, budgets)
        return Candidate(candidate.node, (*candidate.victims, *whole), violations)

    def whole_gangs(self, victims: Sequence[PodRequest], priority: int) -> list[PodRequest] | None:
        """The other members of the victims' gangs that must go with them (a gang left below its `minMember` goes
        whole), wherever they run; None when one of them is not of lower priority than `priority`. The extender's
        `/preempt` asks it of kube-scheduler's victims. What-if only."""
        return self._whole_gangs(victims, priority)

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
