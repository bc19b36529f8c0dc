"""The scheduling cycle: validate (PreFilter), find feasible nodes in capacity order or on kube-scheduler's
zone-by-zone sample (Filter), rank them (Score), and reserve the best one's devices (Reserve: each plugin allocates,
taken atomically, the allocation signed). When no node fits, the decision carries kube-scheduler's summary,
`0/5 nodes are available: 3 Insufficient ..., 2 ....`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from itertools import chain, compress, filterfalse, islice
from operator import not_

from kubegpu.core.models import (
    PodRequest,
)
from kubegpu.core.status import Code, Status
from kubegpu.scheduler.engine.records import (
    CPU_INDEX,
    DRA_INDEX,
    UNKNOWN_FREE,
    Decision,
    NodeRecord,
    Plan,
    Refusals,
    summarize_reasons,
)
from kubegpu.scheduler.engine.sampling import Sampling
from kubegpu.scheduler.index import CapacityIndex

# At most this many nodes changed since a walk last filtered them are filtered ahead of `Cycle._sample_passing`'s
# sample (usually the one or two nodes the last pods went to); more, and the cycle walks node by node.
STALE_FILTERED = 32


class Cycle(Sampling):
    """One pod's scheduling cycle, from its plan to a reserved node."""

    def schedule(self, pod: PodRequest, *, explain: bool = True) -> Decision:
        """Run one full cycle for a pod (`decide`) and, when a node fits, reserve its devices there (`reserve`, without
        filtering the node again). `explain` false: a refusal's reason counts only the nodes filtered, not those the
        capacity index passed over (for a front-end that will not show it: a pod waiting for its victims to leave)."""
        chosen = self._decide(pod, explain=explain)
        if isinstance(chosen, Decision):
            return chosen
        record, plan = chosen
        return self._allocate_and_hold(record, pod, plan)

    def decide(self, pod: PodRequest) -> Decision:
        """The scheduling cycle up to Reserve (PreFilter, Filter, Score): the node the pod should go to, or why none
        fits. Changes nothing but the memos and where the next sample starts; `reserve` holds the devices."""
        chosen = self._decide(pod)
        return chosen if isinstance(chosen, Decision) else Decision(pod.key, True, node=chosen[0].name)

    def _decide(self, pod: PodRequest, *, explain: bool = True) -> Decision | tuple[NodeRecord, Plan]:
        """`decide`'s cycle: the chosen node with the pod's plan, or the refusal."""
        if pod.key in self.pods:
            return Decision(
                pod.key, False, reason=f"pod {pod.key} already holds resources on a node", code=Code.UNRESOLVABLE
            )
        routes = self._route(pod)
        status = self._validate(pod, routes)
        if not status.ok:
            return Decision(pod.key, False, reason=status.message, code=status.code)
        plan = self.plan(pod)
        nodes = self.nodes
        if pod.node_name:
            record = nodes.get(pod.node_name)
            if record is None:
                return Decision(pod.key, False, reason=f"node {pod.node_name} is unknown", code=Code.UNRESOLVABLE)
            status = self.check(record, pod, plan)
            if not status.ok:
                return Decision(pod.key, False, reason=summarize_reasons(1, Counter(status.reasons)), code=status.code)
            return record, plan
        sample = self._sample_size(pod, plan)
        if self.sample < sample < len(nodes):
            return self._schedule_sampled(pod, plan, sample)
        if sample >= len(nodes) and explain:
            index, resource, need = self._selector(pod, plan)
            taken = self._every_node_by_shape(pod, plan, index, resource, need)
            if taken is not None:
                return taken
        feasible: list[str] = []
        evaluated = 0
        refusals = Refusals()
        settled = refusals.settled  # node class -> what one of its nodes' unresolvable answer says of the others
        reasons = refusals.reasons
        candidates, resource = self._candidates(pod, plan)
        visited: dict[int, list[dict[str, None]]] = {}  # node class -> the groups of its nodes filtered above
        judge = self._cluster_state(pod, plan).judge if plan.volatile else None
        check, refuse = self.check, self._refuse
        # The nodes known to pass the shape's node-local filters and device fit (`Passing`), less those held for a
        # preempting pod or gang: with no cluster-wide filter to ask, such a node fits without `check` (as in
        # `_schedule_sampled`); one checked and found passing joins them. A dead node refuses device pods whatever
        # it remembers.
        passing = None if judge is not None or (self._dead and plan.devices) else self._passing_nodes(plan)
        held = set(self._held_nodes()) if passing is not None else ()
        quick = passing - held if passing is not None and held else passing
        for klass, members in candidates:
            visited.setdefault(klass, []).append(members)
            known = settled.get(klass)
            if known is not None:
                if known.by_node:
                    for reason in known.status.reasons:
                        reasons[reason] += len(members)
                evaluated += len(members)
                continue
            for position, name in enumerate(members, 1):
                evaluated += 1
                if quick is not None and name in quick:
                    feasible.append(name)
                    if len(feasible) >= sample:
                        break
                    continue
                record = nodes[name]
                status = check(record, pod, plan, judge=judge)
                if status.code is Code.SUCCESS:
                    if passing is not None and self._passes_locally(record, plan):
                        passing.add(name)
                    feasible.append(name)
                    if len(feasible) >= sample:
                        break
                    continue
                if refuse(refusals, record, pod, plan, status):
                    # No other node of this class fits: counted without filtering (`_refused`).
                    rest = len(members) - position
                    if settled[klass].by_node:
                        for reason in status.reasons:
                            reasons[reason] += rest
                    evaluated += rest
                    break
            if len(feasible) >= sample:
                break
        if not feasible:
            if explain and evaluated < len(nodes):
                self._explain_skipped(pod, plan, visited, refusals, resource)
            return self._refused(refusals, pod, plan, len(nodes))
        best = feasible[0] if len(feasible) == 1 else self._rank(feasible, pod, plan)
        return nodes[best], plan

    def _explain_skipped(
        self,
        pod: PodRequest,
        plan: Plan,
        visited: dict[int, list[dict[str, None]]],
        refusals: Refusals,
        resource: str,
    ) -> None:
        """Count the nodes the capacity index skipped under their own reasons, as kube-scheduler would report them
        (a node that fails the node selector says so, not "Insufficient ..."). Only a pod that fits nowhere pays for
        this, a class whose nodes answer alike (unresolvable) costs one check, and one whose answers are remembered
        (`_skipped_tally`) what changed since."""
        settled = refusals.settled
        for klass, members in self._class_nodes.items():
            groups = visited.get(klass, ())
            left = len(members) - sum(len(group) for group in groups)
            if left <= 0:
                continue
            known = settled.get(klass)
            tally = self._skipped_tally(klass, pod, plan, resource) if known is None else None
            if tally is not None and tally.resolvable == len(tally.answers):
                # No answer there settles the class: each node skipped counts under its own, as below, from memory.
                reasons = refusals.reasons
                reasons.update(tally.reasons)
                for group in groups:
                    for name in group:
                        reasons.subtract(tally.answers[name].reasons)  # counted when the cycle filtered it
                refusals.resolvable = True
                continue
            if known is None:
                for name in members:
                    if any(name in group for group in groups):
                        continue
                    record = self.nodes[name]
                    status = self.check(record, pod, plan)
                    if status.ok:
                        status = Status.unschedulable(f"Insufficient {resource}")
                    left -= 1
                    if self._refuse(refusals, record, pod, plan, status) or left <= 0:
                        break
                known = settled.get(klass)
            if known is not None and known.by_node and left > 0:
                for reason in known.status.reasons:
                    refusals.reasons[reason] += left  # every other skipped node of the class answers alike

    def _schedule_sampled(self, pod: PodRequest, plan: Plan, sample: int) -> Decision | tuple[NodeRecord, Plan]:
        """The cycle of a pod scored on kube-scheduler's sample of a larger cluster (`_sample_size`): the first
        `sample` feasible nodes in the node tree's order (zone by zone in turn), from where the last such sample
        stopped, as kube-scheduler 1.20 takes them (`findNodesThatPassFilters`, `nextStartNodeIndex`). Every zone
        is in every sample; a sample in capacity order would hold the first zones only. Nodes the capacity index
        rules out are passed over, and filtered for their reasons only when no node fits. Taken from the shape's
        remembered answers where those are the nodes' own (`Sampling._sample_by_shape`); for a pod the cluster-wide
        rules judge, past the nodes they named where every other node is known to pass (`_sample_passing`)."""
        nodes, check, refuse = self.nodes, self.check, self._refuse
        cluster = self._cluster_state(pod, plan) if plan.volatile else None
        judge, by_name = (cluster.judge, cluster.refused) if cluster is not None else (None, None)
        index, resource, need = self._selector(pod, plan)
        taken = self._sample_by_shape(pod, plan, sample, index, resource, need)
        if taken is not None:
            return taken
        order = self._tree.order()
        least = index.least()
        # None when every node offers enough (the usual case): then no node is looked up in the index.
        offers = None if len(index) == len(order) and least is not None and least >= need else index.get
        start = self._next_start % len(order)
        feasible: list[str] = []
        refusals = Refusals()
        settled = refusals.settled
        passed: list[str] = []  # nodes the index ruled out
        refused: list[tuple[NodeRecord, Status]] = []  # counted only if no node fits
        settles = plan.settles
        # The nodes known to pass the shape's node-local filters and device fit (`Passing`) are asked only their
        # nominees and the cluster-wide judge; a dead node refuses device pods whatever it remembers.
        passing = None if self._dead and plan.devices else self._passing_nodes(plan)
        # Of those, the ones no preempting pod or gang holds (`_held_nodes`): asked nothing but the judge.
        held = set(self._held_nodes())
        quick = passing - held if passing is not None and held else passing
        if offers is None and not settles and passing is not None and (judge is None or by_name is not None):
            found = self._sample_passing(pod, plan, order, start, sample, passing, held, judge, by_name)
            if found is not None:
                best = found[0] if len(found) == 1 else self._rank(found, pod, plan)
                return nodes[best], plan
        processed = 0
        for processed, name in enumerate(chain(order[start:], order[:start]), 1):  # noqa: B007 (read after)
            if offers is not None and ((free := offers(name)) is None or free < need):
                passed.append(name)
                continue
            if quick is not None and not settled and name in quick:
                if by_name is not None:
                    judged = by_name.get(name)
                else:
                    judged = judge(name, nodes[name].info.labels) if judge is not None else None
                if judged is None:
                    feasible.append(name)
                    if len(feasible) >= sample:
                        break
                    continue
                record, status = nodes[name], judged
            else:
                record = nodes[name]
                if settled and record.klass in settled:
                    continue  # counted with its class if no node fits (`_refused`)
                status = check(record, pod, plan, judge=judge)
                if passing is not None and self._passes_locally(record, plan):
                    passing.add(name)
                if status.code is Code.SUCCESS:
                    feasible.append(name)
                    if len(feasible) >= sample:
                        break
                    continue
            if settles and status.code is Code.UNRESOLVABLE:
                refuse(refusals, record, pod, plan, status)  # settles the class: its other nodes are passed over
            else:
                refused.append((record, status))
        self._next_start = (start + processed) % len(order)
        if feasible:
            best = feasible[0] if len(feasible) == 1 else self._rank(feasible, pod, plan)
            return nodes[best], plan
        for record, status in refused:
            refuse(refusals, record, pod, plan, status)
        for name in passed:
            record = nodes[name]
            if record.klass in settled:
                continue
            status = check(record, pod, plan, judge=judge)
            refuse(
                refusals,
                record,
                pod,
                plan,
                status if not status.ok else Status.unschedulable(f"Insufficient {resource}"),
            )
        for klass, known in settled.items():
            if known.by_node:  # its nodes not counted one by one, all alike
                rest = len(self._class_nodes.get(klass, ())) - len(refusals.counted.get(klass, ()))
                for reason in known.status.reasons:
                    refusals.reasons[reason] += rest
        return self._refused(refusals, pod, plan, len(nodes))

    def _sample_passing(
        self,
        pod: PodRequest,
        plan: Plan,
        order: list[str],
        start: int,
        sample: int,
        passing: set[str],
        held: set[str],
        judge: Callable[[str, Mapping[str, str]], Status | None] | None,
        by_name: Mapping[str, Status] | None,
    ) -> list[str] | None:
        """`_schedule_sampled`'s walk where every node offers enough, no answer settles a class and the cluster-wide
        rules named the nodes they refuse (`ClusterState.refused`; None: they refuse none). The nodes known to pass
        the shape's node-local filters (`passing`, less those `held` for another pod) are refused only there; the
        few others (changed since a walk last met them) are filtered here, as the walk would filter them. The
        feasible nodes are then the first `sample` of the tree's order from `start` that nothing refused, found
        without a step per node in Python; the next sample starts after the last one found, or where this one
        started when fewer were. None where more than `STALE_FILTERED` nodes need filtering, or no node fits (the
        walk then counts the refusals). `judge`: the cluster-wide rules' judge (it looks a node up in `by_name`)."""
        quick = passing - held if held else passing
        stale = list(filterfalse(quick.__contains__, order))
        if len(stale) > STALE_FILTERED:
            return None
        refused: Mapping[str, Status] = by_name or {}
        if stale:
            nodes, check = self.nodes, self.check
            failed: dict[str, Status] = {}
            for name in stale:
                record = nodes[name]
                status = check(record, pod, plan, judge=judge)
                if self._passes_locally(record, plan):
                    passing.add(name)
                if status.code is not Code.SUCCESS:
                    failed[name] = status
            if failed:
                refused = {**refused, **failed}
        count = len(order)
        rotated = order[start:] + order[:start] if start else order
        if not refused:
            self._next_start = (start + sample) % count
            return rotated[:sample]
        at = list(islice(compress(range(count), map(not_, map(refused.__contains__, rotated))), sample))
        if not at:
            return None
        self._next_start = (start + at[-1] + 1) % count if len(at) >= sample else start
        return list(map(rotated.__getitem__, at))

    def _selector(self, pod: PodRequest, plan: Plan) -> tuple[CapacityIndex, str, int]:
        """The capacity index a cycle selects its candidates by, its resource, and the amount a node must offer.

        With several device resources the most selective index is used: the one with the fewest nodes that could
        offer the amount asked (an Intel pod's memory per card, rather than its card count). A pod without devices is
        selected by cpu, unless NodeResourcesFit is off: then no node is refused for what it lacks.
        """
        needs = [pair for _, pairs in plan.devices for pair in pairs]
        if not needs and pod.resource_claims and self._dra_on and DRA_INDEX in self._index:
            # DRA pods by the devices no claim holds: a node with fewer than the claims can take is no candidate.
            need = self.dra.min_devices(pod)
            if need > 0:
                return self._index[DRA_INDEX], DRA_INDEX, need
        if not needs:
            cpu = pod.cpu_milli if self._fit_by_index else -UNKNOWN_FREE
            return self._index[CPU_INDEX], "cpu", cpu
        empty = CapacityIndex()
        if len(needs) > 1:
            resource, need = min(needs, key=lambda p: self._index.get(p[0], empty).count_at_least(p[1]))
        else:
            resource, need = needs[0]
        return self._index.get(resource, empty), resource, need

    def _candidates(self, pod: PodRequest, plan: Plan) -> tuple[Iterator[tuple[int, dict[str, None]]], str]:
        """(node class, nodes) worth filtering, in policy order, and the resource the index selected them by
        (`_selector`)."""
        index, resource, need = self._selector(pod, plan)
        return index.groups_at_least(need, ascending=self.policy == "binpack"), resource
