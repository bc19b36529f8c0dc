"""Gang-aware preemption (`preempt_gang`): PostFilter for a gang that fits nowhere.

Per domain of the gang's level, the lowest-priority minimal set of pods whose eviction lets the whole gang in
(PodDisruptionBudgets respected as `Engine.preempt` does: pods whose eviction would violate one are kept first), never
a set that still leaves the gang unplaceable, and never a victim gang cut below its own `minMember` (then all of it
goes, or the domain is no candidate). A what-if: every pod is back as it was on return; the front-end evicts
(holding the domain with `nominate_gang`) and places the gang again (`gangs.place_gang`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kubegpu.core.manifests import ManifestError
from kubegpu.core.models import PodRequest
from kubegpu.scheduler import gangfit
from kubegpu.scheduler.engine.gangdomains import GangDomains, rank
from kubegpu.scheduler.engine.records import GangPreemption, PodRecord
from kubegpu.scheduler.podgroups import HOSTNAME, PodGroup, gang_key
from kubegpu.scheduler.preemption import Budget, Candidate, by_importance, may_preempt, pick, split_by_budget


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
