"""Device-aware preemption, after kube-scheduler 1.20's DefaultPreemption.

When a pod fits no node, the engine (`Engine.preempt`) looks for nodes where evicting pods of *lower* priority would
let it fit, devices included: on a trn1 the victims' devices together with the free ones must form a valid set, so
the plugins' own fit decides, on the engine's what-if of the node without those pods (`Engine.pods_removed`).

Per node (`Engine.select_victims`): every lower-priority pod is set aside; if the pod still does not fit, the node is
no candidate. Otherwise the pods set aside are put back one at a time, most important first (higher priority, then
the earlier start), those whose eviction would violate a PodDisruptionBudget before the others, and every pod whose
return still leaves room stays (is reprieved); the rest are the victims.

Which nodes are tried (`Engine.preempt`): as kube-scheduler's dry run does, the nodes where the pod failed but not
for good, in turn from a start that moves on each time, until enough candidates are found (`candidates_wanted`: a
tenth of the nodes, at least 100, at most all; with at least one that violates no budget), not every node.
A pod without devices or inter-pod rules is tried on a copy of the node's usage (kube-scheduler's cloned node), so
a what-if changes nothing the next cycle reads; other pods are tried on the node itself, and put back.

Between candidate nodes (`pick`), in order: the fewest budget violations, the lowest highest victim priority, the
smallest sum of victim priorities, the fewest victims, the latest start among the most important victims, then the
first node met. Pods whose `preemptionPolicy` is `Never` never preempt; pods of equal or higher priority are never
victims.

This module holds the pure parts (budgets, ordering, the choice); the engine owns the what-ifs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kubegpu.core.models import LabelSelector, PodRequest
from kubegpu.scheduler.filters import selector_matches

__all__ = [
    "Budget",
    "Candidate",
    "Preemption",
    "by_importance",
    "candidates_wanted",
    "may_preempt",
    "pick",
    "split_by_budget",
]

PRIORITY_OFFSET = 1 << 31  # keeps sums of priorities positive (priorities are int32), as kube-scheduler does
# How many candidate nodes a preemption looks for before it chooses (kube-scheduler 1.20's DefaultPreemption
# defaults, `minCandidateNodesPercentage` and `minCandidateNodesAbsolute`).
MIN_CANDIDATES_PERCENT = 10
MIN_CANDIDATES = 100


@dataclass(frozen=True, slots=True)
class Budget:
    """A PodDisruptionBudget as preemption reads it: the pods it selects (in its namespace; a selector that is
    absent or empty selects none) and how many of them may still be disrupted (`status.disruptionsAllowed`).
    `disrupted` names pods the API server already counts as disrupted: evicting them again costs nothing."""

    namespace: str
    name: str
    selector: LabelSelector | None
    allowed: int
    disrupted: frozenset[str] = frozenset()

    def selects(self, pod: PodRequest) -> bool:
        if pod.namespace != self.namespace or self.selector is None or not self.selector.requirements:
            return False
        return selector_matches(self.selector, pod.labels)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node where evicting `victims` (most important first) lets the pod fit; `violations` of budgets."""

    node: str
    victims: tuple[PodRequest, ...]
    violations: int


@dataclass(frozen=True, slots=True)
class Preemption:
    """The outcome of `Engine.preempt`: the chosen node and the keys of the pods to evict there, or why not."""

    node: str | None
    victims: tuple[str, ...] = ()
    violations: int = 0
    reason: str | None = None
    candidates: tuple[Candidate, ...] = field(default=(), compare=False)
    # Where no node was chosen and the caller asked (`explain`): kube-scheduler 1.22+'s account of its dry run, each
    # node under one reason (`0/3 nodes are available: 3 No preemption victims found for incoming pod.`), which it
    # appends to the FailedScheduling message after `preemption: `.
    outcome: str | None = field(default=None, compare=False)


# kube-scheduler's reasons for a node in its preemption's account (`Preemption.outcome`): the filters refused it in a
# way no eviction helps (unresolvable), or no pod of lower priority runs there.
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"


def may_preempt(pod: PodRequest) -> bool:
    """kube-scheduler's PodEligibleToPreemptOthers, less the nominated-node check the front-end makes."""
    return pod.preemption_policy != "Never"


def candidates_wanted(nodes: int) -> int:
    """How many candidates to find among `nodes` before choosing: a tenth of them, at least 100, at most all."""
    return min(nodes, max(nodes * MIN_CANDIDATES_PERCENT // 100, MIN_CANDIDATES))


def by_importance(pods: Iterable[PodRequest]) -> list[PodRequest]:
    """Most important first: higher priority, then the earlier start (a pod not started yet counts as latest)."""
    return sorted(pods, key=lambda p: (-p.priority, p.start_time is None, p.start_time or ""))


def split_by_budget(pods: Sequence[PodRequest], budgets: Sequence[Budget]) -> tuple[list[PodRequest], list[PodRequest]]:
    """(pods whose eviction would violate a budget, the others), each in the order given. Every selected pod uses
    up one allowed disruption of each budget selecting it; a budget driven below zero is violated."""
    allowed = [b.allowed for b in budgets]
    violating: list[PodRequest] = []
    others: list[PodRequest] = []
    for pod in pods:
        violated = False
        if pod.labels:
            for i, budget in enumerate(budgets):
                if not budget.selects(pod) or pod.name in budget.disrupted:
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        (violating if violated else others).append(pod)
    return violating, others


def added_violations(victims: Sequence[PodRequest], added: Sequence[PodRequest], budgets: Sequence[Budget]) -> int:
    """How many of `added` (the rest of a victim's gang, which goes too) violate a budget once `victims` have used
    up what the budgets allow: they are evicted like any victim, so they count in the candidate's violations."""
    if not added or not budgets:
        return 0
    violating, _ = split_by_budget([*victims, *added], budgets)
    keys = {p.key for p in added}
    return sum(1 for p in violating if p.key in keys)


def _earliest_start_of_most_important(victims: Sequence[PodRequest]) -> str:
    top = max(p.priority for p in victims)
    starts = [p.start_time or "" for p in victims if p.priority == top]
    return min(starts)


def _violations(candidate: Candidate) -> int:
    return candidate.violations


def _highest_priority(candidate: Candidate) -> int:
    return max((p.priority for p in candidate.victims), default=-PRIORITY_OFFSET)


def _priority_sum(candidate: Candidate) -> int:
    return sum(p.priority + PRIORITY_OFFSET for p in candidate.victims)


def _victim_count(candidate: Candidate) -> int:
    return len(candidate.victims)


def pick(candidates: Sequence[Candidate]) -> Candidate | None:
    """The candidate DefaultPreemption would choose (see the module docstring); None when there is none."""
    if not candidates:
        return None
    best = list(candidates)
    for key in (_violations, _highest_priority, _priority_sum, _victim_count):
        lowest = min(key(c) for c in best)
        best = [c for c in best if key(c) == lowest]
        if len(best) == 1:
            return best[0]
    with_victims = [c for c in best if c.victims]
    if not with_victims:
        return best[0]
    latest = max(_earliest_start_of_most_important(c.victims) for c in with_victims)
    return next(c for c in with_victims if _earliest_start_of_most_important(c.victims) == latest)
