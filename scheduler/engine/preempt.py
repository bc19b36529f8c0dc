"""The PostFilter extension point: where evicting pods of lower priority would let a pod fit, and whom
(`kubegpu.scheduler.preemption` has the rules; these are the what-ifs against the cache, which leave it as it was),
and nominating the node held for a preempting pod while its victims leave.

A victim that is a member of a gang never leaves the rest of it below its `minMember`, running uselessly: the rest
of the gang goes too, counted in the candidate (so a node whose victims break no gang is preferred), or the node is no
candidate where one of them may not go (`GangPreempting._gangs_kept_whole`).

As kube-scheduler's DefaultPreemption dry-runs victims on a cloned node and stops at enough candidates, `preempt`
tries nodes in turn from where the last one stopped until it has `candidates_wanted` of them, and a pod whose fit
reads only the node's usage is tried on a copy of it (`NodeRecord.usage_copy`): no node, memo or change log moves.
A pod asking for devices or with inter-pod rules is tried on the node itself, its victims released through the
ledger and put back (`_victims_in_place`), since the plugins' fit and the inter-pod rules read more than a copy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable, Sequence

from kubegpu.core.models import (
    PodRequest,
)
from kubegpu.core.status import Code
from kubegpu.scheduler.engine.admission import Admission
from kubegpu.scheduler.engine.cache import count_on_node
from kubegpu.scheduler.engine.filtering import NOMINATED, held_for_another, held_whole_for_another
from kubegpu.scheduler.engine.records import NodeRecord, Plan, PodRecord, summarize_reasons
from kubegpu.scheduler.preemption import (
    NO_VICTIMS,
    NOT_HELPFUL,
    Budget,
    Candidate,
    Preemption,
    by_importance,
    candidates_wanted,
    may_preempt,
    pick,
    split_by_budget,
)


class Preempting(Admission):
    """Preemption what-ifs and nomination."""

    def preempt(self, pod: PodRequest, budgets: Sequence[Budget] = (), *, explain: bool = False) -> Preemption:
        """Where evicting pods of lower priority would let `pod` fit, devices included, and whom to evict there
        (`kubegpu.scheduler.preemption` has the rules). Changes nothing: the front-end evicts the victims (the
        simulator at once, the scheduler by deleting them and nominating the node) and schedules the pod again.
        The extender's `/preempt` answers from `complete_victims` per proposed node.

        As kube-scheduler's dry run, nodes are tried in turn from where the last preemption stopped, until enough
        candidates were found (`candidates_wanted`, with one that violates no budget), not every node.

        `explain`: where no node is chosen, `Preemption.outcome` accounts for every node as kube-scheduler 1.22+
        does (`NOT_HELPFUL` where the filters' refusal is unresolvable, `NO_VICTIMS` where no pod of lower priority
        runs, else the filters' reasons); none for a pod that may not preempt (kube-scheduler says nothing then)."""
        if not may_preempt(pod):
            return Preemption(None, reason="the pod's preemptionPolicy is Never")
        if pod.key in self.pods:
            return Preemption(None, reason=f"pod {pod.key} already holds resources on a node")
        outcome: Counter[str] = Counter()
        if not any(priority < pod.priority for priority, count in self._priorities.items() if count > 0):
            if explain:
                plan = self.plan(pod)
                for record in self.nodes.values():
                    outcome[self._no_victims(record, pod, plan)] += 1
            return self._not_preempted("no pod of lower priority runs anywhere", outcome, explain)
        status = self._validate(pod, self._route(pod))
        if not status.ok:  # kube-scheduler's PreFilter refused it: every node is unresolvable
            outcome[NOT_HELPFUL] = len(self.nodes)
            return self._not_preempted(status.message, outcome, explain)
        plan = self.plan(pod)
        names = list(self.nodes)
        total = len(names)
        wanted = candidates_wanted(total)
        start = self._preempt_start % total if total else 0
        candidates: list[Candidate] = []
        harmless = 0  # candidates that violate no budget
        tried = 0
        for tried in range(1, total + 1):
            record = self.nodes[names[(start + tried - 1) % total]]
            if held_whole_for_another(record, pod, self.nominee_requests):
                outcome[NOMINATED] += 1
                continue
            if not any(self.pods[key].request.priority < pod.priority for key in record.pods):
                if explain:
                    outcome[self._no_victims(record, pod, plan)] += 1
                continue
            status = self.check(record, pod, plan)
            if status.ok or status.code in (Code.UNRESOLVABLE, Code.ERROR):
                if not status.ok:
                    outcome[NOT_HELPFUL] += 1
                continue
            candidate = self._select_victims(record, pod, plan, budgets)
            if candidate is not None:
                candidate = self._gangs_kept_whole(candidate, pod.priority, budgets)
            if candidate is None:
                # kube-scheduler names the filters' refusal with every victim gone; the refusal as the node is
                # now stands for it (what the pod lacks, mostly the same).
                outcome.update(status.reasons)
                continue
            candidates.append(candidate)
            harmless += not candidate.violations
            if harmless and len(candidates) >= wanted:
                break
        self._preempt_start = start + tried
        chosen = pick(candidates)
        if chosen is None:
            reason = "no node would fit the pod even without the pods of lower priority"
            return self._not_preempted(reason, outcome, explain)
        victims = tuple(p.key for p in chosen.victims)
        return Preemption(chosen.node, victims, chosen.violations, candidates=tuple(candidates))

    def _no_victims(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> str:
        """A node where no pod of lower priority runs, in kube-scheduler's account: one whose filters' refusal is
        unresolvable is not tried at all (`NOT_HELPFUL`), the others find no victims (`NO_VICTIMS`)."""
        code = self.check(record, pod, plan).code
        return NOT_HELPFUL if code in (Code.UNRESOLVABLE, Code.ERROR) else NO_VICTIMS

    def _not_preempted(self, reason: str, outcome: Counter[str], explain: bool) -> Preemption:
        told = summarize_reasons(len(self.nodes), outcome) if explain else None
        return Preemption(None, reason=reason, outcome=told)

    def _gangs_kept_whole(self, candidate: Candidate, priority: int, budgets: Sequence[Budget]) -> Candidate | None:
        """The candidate with the other members of its victims' gangs that must go too, or None where one of them
        may not (`GangPreempting` says which; no gangs here)."""
        return candidate

    def select_victims(self, pod: PodRequest, name: str, budgets: Sequence[Budget] = ()) -> Candidate | None:
        """The fewest pods of lower priority to evict from node `name` so that `pod` fits there, or None when even
        evicting all of them would not do. What-if only: every pod is back as it was on return."""
        record = self.nodes.get(name)
        if record is None:
            return None
        return self._select_victims(record, pod, self.plan(pod), budgets)

    def _select_victims(
        self, record: NodeRecord, pod: PodRequest, plan: Plan, budgets: Sequence[Budget]
    ) -> Candidate | None:
        """`select_victims` on a copy of the node's usage when nothing but the node's own usage decides whether
        the pod fits there (no devices, no inter-pod rules, no claims, no filter a third party added), remembered on
        the node (`NodeRecord.last_victims`); else on the node itself, each pod taken out and put back through the
        ledger. A node held for preempting pods of `pod`'s priority or higher is tried with them counted as placed
        there, as kube-scheduler's dry run filters with the nominated pods (`_nominee_refusal`, through `check`: in
        place); those of lower priority are not counted (`pod` may take their place, and they lose their hold:
        `displace_nominees`)."""
        if held_whole_for_another(record, pod, self.nominee_requests):
            return None
        in_place = (
            held_for_another(record, pod)
            or plan.devices
            or plan.volatile
            or pod.claims
            or pod.resource_claims
            or (self._added_filters and self._added_filters.intersection((*plan.node_rules, *plan.usage_rules)))
        )
        if not in_place:
            known = record.last_victims
            budgets = tuple(budgets)
            if (
                known is not None
                and known[0] == record.version
                and known[1] is plan.local
                and known[2] == pod.priority
                and known[3] == budgets
            ):
                return known[4]
        lower = [self.pods[key] for key in record.pods if key != pod.key]
        lower = [held for held in lower if held.request.priority < pod.priority]
        if not lower or not self._frees_enough(record, plan, lower):
            candidate = None
        elif in_place:
            return self._victims_in_place(record, pod, plan, lower, budgets)
        else:
            candidate = self._victims_on_copy(record, pod, plan, lower, budgets)
        if not in_place:
            record.last_victims = (record.version, plan.local, pod.priority, tuple(budgets), candidate)
        return candidate

    def _frees_enough(self, record: NodeRecord, plan: Plan, lower: list[PodRecord]) -> bool:
        """Whether evicting every pod of `lower` would leave room for the pod by NodeResourcesFit's arithmetic: where
        it would not, the node is no candidate, and no what-if is needed to tell. A resource the node does not list
        that a plugin's books count (`Headroom.unlisted`: a GPU share on a node that lists `nvidia.com/gpu` alone,
        as HAMi's device plugin leaves it) is the plugin's to judge, as in the filter: counted as none free, it made
        every such node no candidate, and a share never preempted there."""
        if not self._fit_by_index:  # NodeResourcesFit is off
            return True
        allocatable, used = record.info.allocatable, record.used
        if allocatable.get("pods", 0) - used["pods"] + len(lower) < 1:
            return False
        for resource, need in plan.fit:
            if resource not in allocatable and any(resource in h.unlisted for h in record.headroom.values()):
                continue
            free = allocatable.get(resource, 0) - used[resource]
            if free >= need:
                continue
            free += sum(requested(held.request, resource) for held in lower)
            if free < need:
                return False
        return True

    def _victims_on_copy(
        self, record: NodeRecord, pod: PodRequest, plan: Plan, lower: list[PodRecord], budgets: Sequence[Budget]
    ) -> Candidate | None:
        """kube-scheduler's `selectVictimsOnNode` on a copy of the node: every pod of lower priority out, then back
        one at a time, most important first, those whose eviction would violate a budget first; each pod whose
        return still leaves room stays."""
        if self._node_fit(record, pod, plan) is not None:
            return None
        # What `check` asks of such a pod, less the rules above, which read only the node: the usage filters.
        fits = self._usage_fit
        copy = record.usage_copy()
        for held in lower:
            count_on_node(copy, held.request, -1)
        if fits(copy, pod, plan) is not None:
            return None
        victims: list[PodRequest] = []
        violations = 0
        for request, violating in by_budget(lower, budgets):
            count_on_node(copy, request, +1)
            if fits(copy, pod, plan) is None:
                continue  # reprieved
            count_on_node(copy, request, -1)
            victims.append(request)
            violations += violating
        return Candidate(record.name, tuple(victims), violations)

    def _victims_in_place(
        self, record: NodeRecord, pod: PodRequest, plan: Plan, lower: list[PodRecord], budgets: Sequence[Budget]
    ) -> Candidate | None:
        """`_victims_on_copy`'s search on the node itself: the plugins' device fit and the inter-pod rules read
        the ledger and every placed pod, so each pod is released and put back exactly as it was."""
        out: dict[str, PodRecord] = {}
        try:
            for held in lower:
                released = self._set_aside(held.request.key)
                if released is not None:
                    out[held.request.key] = released
            if not self.check(record, pod, self.plan(pod)).ok:
                return None
            victims: list[PodRequest] = []
            violations = 0
            for request, violating in by_budget(lower, budgets):
                self._put_back(out.pop(request.key))
                if self.check(record, pod, self.plan(pod)).ok:
                    continue  # reprieved
                released = self._set_aside(request.key)
                if released is not None:
                    out[request.key] = released
                victims.append(request)
                violations += violating
            return Candidate(record.name, tuple(victims), violations)
        finally:
            for released in out.values():
                self._put_back(released)

    def complete_victims(
        self, pod: PodRequest, name: str, uids: Iterable[str], budgets: Sequence[Budget] = ()
    ) -> Candidate | None:
        """Check a preemption someone else proposed (kube-scheduler's victims, through the extender's `/preempt`):
        what must be evicted from node `name` besides the proposed pods (those of `uids` that hold resources there)
        for `pod` to fit, devices included. An empty candidate when the proposed victims free enough; else the
        engine's own choice there (`select_victims`), which replaces them (kube-scheduler takes an extender's victims
        as the node's): kube-scheduler counts a share's GPU as one of the node's `nvidia.com/gpu`, so the pod it
        proposes for the CPU the pod lacks may hold a share of a GPU the pod will not get, while the pods the engine
        evicts from the GPU it will get free that CPU too. Added to them, it was evicted for nothing. None when no
        eviction lets the pod fit or the node is unknown. What-if only: every pod is back as it was on return.

        None too for a pod the PreFilter refuses (`_validate`: the plugins' `kubegpu_scheduler_validate`), as `preempt`
        does: the extender's `/filter` refused it on every node, as unresolvable, but kube-scheduler before 1.21 reads
        only `FailedNodes` and asks for victims anyway, and a plugin's fit need not repeat its PreFilter's refusal."""
        record = self.nodes.get(name)
        if record is None or not self._validate(pod, self._route(pod)).ok:
            return None
        proposed = set(uids)
        keys = [key for key in record.pods if self.pods[key].request.uid in proposed]
        with self.pods_removed(keys):
            if self.check(record, pod, self.plan(pod)).ok:
                return Candidate(name, (), 0)
        return self.select_victims(pod, name, budgets)

    def nominate(self, pod: PodRequest, name: str | None) -> None:
        """Hold node `name` for a preempting pod while its victims leave (None: release the hold): as kube-scheduler
        counts nominated pods when it filters, a pod of equal or lower priority lands there only where it leaves the
        preemptor its room (`Filtering._nominee_refusal`)."""
        previous = self.nominated.pop(pod.key, None)
        self.nominee_requests.pop(pod.key, None)
        if previous is not None and (record := self.nodes.get(previous)) is not None:
            record.nominees.pop(pod.key, None)
            self._refresh(record)
        if name is not None:  # a node not known yet takes the hold when it comes (`add_node`)
            self.nominated[pod.key] = name
            self.nominee_requests[pod.key] = pod
            if (record := self.nodes.get(name)) is not None:
                record.nominees[pod.key] = pod.priority
                self._refresh(record)

    def displace_nominees(self, priority: int, name: str) -> tuple[PodRequest, ...]:
        """A pod (or a gang) of `priority` preempts on node `name`: the preempting pods nominated there of lower
        priority lose their hold (`unnominate`), as kube-scheduler's preemption clears their nominated node, since
        the room they counted on may now be the preemptor's; each is returned so that the front-end clears its
        `status.nominatedNodeName` and tries it again at once (it no longer waits for its victims there, and may
        preempt elsewhere). A gang's hold stays."""
        record = self.nodes.get(name)
        if record is None:
            return ()
        displaced = tuple(
            nominee
            for key, held_at in record.nominees.items()
            if held_at < priority and (nominee := self.nominee_requests.get(key)) is not None
        )
        for nominee in displaced:
            self.unnominate(nominee.key)
        return displaced

    def mark_leaving(self, key: str) -> None:
        """A placed pod is being deleted (its deletionTimestamp is set): it still holds what it holds until it is
        gone (`release`), but a preemptor nominated on its node may count on its devices (`_nominee_refusal`)."""
        held = self.pods.get(key)
        if held is None or key in self.leaving:
            return
        self.leaving.add(key)
        record = self.nodes.get(held.node)
        if record is not None and record.nominees:
            self._refresh(record)

    def being_deleted(self, keys: Iterable[str]) -> set[str]:
        """Those of `keys` whose pods are being deleted already (`mark_leaving`: their deletionTimestamp is set). A
        preemption may still count such a victim (its room is freed all the same), but its front-end deletes it
        no second time and gives it no second `Preempted` Event, as kube-scheduler 1.31+ skips a victim whose
        deletion has started."""
        return {key for key in keys if key in self.leaving}

    def unnominate(self, key: str) -> None:
        """Release the node held for a preempting pod (it was deleted, bound elsewhere, or gave up)."""
        self.nominee_requests.pop(key, None)
        name = self.nominated.pop(key, None)
        if name is not None and (record := self.nodes.get(name)) is not None:
            record.nominees.pop(key, None)
            self._refresh(record)

    def nominees(self, name: str) -> dict[str, int]:
        """The preempting pods node `name` is held for (`nominate`), with their priorities."""
        record = self.nodes.get(name)
        return dict(record.nominees) if record is not None else {}

    def nominee(self, key: str) -> PodRequest | None:
        """The preempting pod `key` as the node held for it counts it (`nominate`), if any."""
        return self.nominee_requests.get(key)

    def nominated_node(self, key: str) -> str | None:
        """The node held for preempting pod `key` (`nominate`), if any."""
        return self.nominated.get(key)

    def unnominate_all_but(self, live: Container[str]) -> None:
        """Release the nodes held for preempting pods not among `live`: a relist no longer shows them (deleted
        while the watch was down), and no event of theirs would ever release the hold."""
        for key in [key for key in self.nominated if key not in live]:
            self.unnominate(key)

    def awaits_victims(self, key: str, leaving: Container[str]) -> bool:
        """Whether the node held for preempting pod `key` (`nominate`) still holds one of `leaving` (victims deleted
        but not gone yet): the pod waits for them instead of preempting again."""
        name = self.nominated.get(key)
        record = self.nodes.get(name) if name is not None else None
        return record is not None and any(held in leaving for held in record.pods)


def requested(pod: PodRequest, resource: str) -> int:
    """How much of `resource` the pod counts for in a node's usage (`count_on_node`)."""
    if resource == "cpu":
        return pod.cpu_milli
    if resource == "memory":
        return pod.memory
    return pod.requests.get(resource, 0)


def by_budget(lower: list[PodRecord], budgets: Sequence[Budget]) -> list[tuple[PodRequest, bool]]:
    """The order in which pods set aside are put back: those whose eviction would violate a budget first, each part
    most important first (`split_by_budget`, `by_importance`), each with whether it violates one."""
    violating, others = split_by_budget(by_importance(held.request for held in lower), budgets)
    return [(request, True) for request in violating] + [(request, False) for request in others]
