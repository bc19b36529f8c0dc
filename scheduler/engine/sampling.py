"""kube-scheduler's sample of feasible nodes (`Cycle._schedule_sampled`), and every feasible node (`Cycle._decide` at
`percentageOfNodesToScore: 100`), taken without filtering the nodes one by one.

A cycle that scores kube-scheduler's adaptive count of feasible nodes (41 % of 1,213) walks the node tree from where
the last sample stopped until it has found that many, then ranks them. Node by node that is ~1,000 filter answers a
pod even when each is remembered (`check`'s memo), and every node again for a pod that fits nowhere, to count its
refusals. Between two pods of one shape only the nodes the change log names have changed, so the shape's answers are
kept per node (`ShapeAnswers`): whether the node fits, and its answer as a refusal counts it, with their sums. A
cycle asks again only the nodes changed since the shape's last cycle (a node changed into a content another node had,
`NodeNumbering`, is answered from memory), and takes the sample as a slice of the fitting nodes kept in the
tree's order.

What this keeps of the walk node by node, exactly (the same node, the same refusal, the same next start;
`tests/scheduler/test_engine_sampling.py` holds the two against each other on generated traces):

* the feasible nodes are the first `sample` ones that fit in the node tree's order (zone by zone in turn) from
  `_next_start`, and the next sample starts after the last one found, or where this one started when fewer were;
* the ranking (`_rank_sampled`): each score plugin's raw scores over the feasible nodes normalized and weighed as
  `_rank` does them, per distinct raw score (kube-scheduler's normalizations read only the least and the greatest
  and map each score alone), summed in the same order; the best node is the first of the sample with the best total;
* a pod that fits nowhere is refused with each node counted under its own answer, as `_refused` counts them;
* ranking every node (`_every_node_by_shape`), the feasible nodes come in the capacity index's order, as the walk
  finds them, and ties go to the first.

Pods and clusters for which a node's answer may not be its own are walked node by node (`_samples_by_shape`): pods
whose filters read a node's name, other pods (inter-pod rules, topology spread) or host ports, pods with claims or
preferred node affinity; any pod while a node is held for a preempting pod or gang or is not live, or when a third
party added a filter or a score; a pod whose class-wide unresolvable answer would pass over a node that fits, and
a refused pod where such an answer came from what is in use (`_refused_like` then counts the others otherwise);
and a pod ranked on every node whose refusal leaves out the nodes the capacity index passed over (`explain` false).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from itertools import compress
from operator import add
from typing import Any

from kubegpu.core.models import PodRequest
from kubegpu.core.status import Code, Status
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import kubefilters, scoring
from kubegpu.scheduler.engine.memos import ShapeAnswers
from kubegpu.scheduler.engine.records import Decision, NodeRecord, Plan, summarize_reasons
from kubegpu.scheduler.engine.reserving import Reserving
from kubegpu.scheduler.index import CapacityIndex

# The built-in node filters whose answers are the node's own: they read its labels but the hostname (a plan reading
# that is not `settles`), its taints, readiness, allocatable and usage, never other pods or its ports.
OWN_FILTERS = (
    kubefilters.NodeUnschedulable,
    kubefilters.NodeReady,
    kubefilters.TaintToleration,
    kubefilters.NodeAffinity,
    kubefilters.NodeResourcesFit,
)
SHAPES_REMEMBERED = 256
CONTENTS_NUMBERED = 1 << 16  # distinct node contents numbered; past it, numbered afresh
_UNASKED: Any = object()


class Sampling(Reserving):
    """kube-scheduler's sample from every node's remembered answer to the pod's shape (module docstring)."""

    def _sample_by_shape(
        self, pod: PodRequest, plan: Plan, sample: int, index: CapacityIndex, resource: str, need: int
    ) -> Decision | tuple[NodeRecord, Plan] | None:
        """`_schedule_sampled`'s answer from the shape's answers (`ShapeAnswers`), the candidates those `index`
        offers at least `need` of `resource`; None where the answers may not give it exactly (`_samples_by_shape`,
        and the settled classes below): the caller then walks node by node."""
        nodes = self.nodes
        order = self._tree.order()
        count = len(order)
        if count != len(nodes) or not self._samples_by_shape(pod, plan):
            return None
        book = self._shape_answers(pod, plan, index, resource, need)
        if book.unresolvable and any(n and book.fitting[klass] for klass, n in book.unresolvable.items()):
            return None  # the walk would pass over the fitting nodes of a class another's answer settled
        start = self._next_start % count
        if book.ordered is not order:
            book.positions = list(compress(range(count), map(book.fits.__getitem__, order)))
            book.in_order = list(map(order.__getitem__, book.positions))
            book.ordered = order
        positions, in_order = book.positions, book.in_order
        # The first `sample` that fit from `start` on, round the tree's order.
        at = bisect_left(positions, start)
        feasible = in_order[at : at + sample]
        last = at + len(feasible) - 1  # where the sample ends among `positions`
        if len(feasible) < sample:  # round the order: the fitting nodes before `start`
            last = min(at, sample - len(feasible)) - 1
            feasible += in_order[: last + 1]
        if not feasible:
            refused = self._refused_by_shape(pod, plan, book, count)
            if refused is not None:
                self._next_start = start
            return refused
        if len(feasible) >= sample:
            self._next_start = (positions[last] + 1) % count
        else:
            self._next_start = start
        if len(feasible) == 1:
            return nodes[feasible[0]], plan
        return nodes[self._rank_sampled(feasible, pod, plan)], plan

    def _every_node_by_shape(
        self, pod: PodRequest, plan: Plan, index: CapacityIndex, resource: str, need: int
    ) -> Decision | tuple[NodeRecord, Plan] | None:
        """The cycle of a pod that ranks every feasible node (`percentageOfNodesToScore: 100`, or a cluster no
        larger than kube-scheduler's count) from the shape's answers: the feasible nodes in the capacity index's
        order, as `Cycle._decide` finds them, ranked as `_rank` ranks them; a pod no node fits refused as
        `_refused` and `_explain_skipped` count every node. None where the answers may not give that exactly."""
        nodes = self.nodes
        if not nodes or not self._samples_by_shape(pod, plan):
            return None
        book = self._shape_answers(pod, plan, index, resource, need)
        if book.unresolvable and any(n and book.fitting[klass] for klass, n in book.unresolvable.items()):
            return None
        fits = book.fits
        candidates = index.groups_at_least(need, ascending=self.policy == "binpack")
        feasible: list[str] = []
        fit = fits.__getitem__
        for _, members in candidates:
            feasible += compress(members, map(fit, members))
        if not feasible:
            return self._refused_by_shape(pod, plan, book, len(nodes))
        best = feasible[0] if len(feasible) == 1 else self._rank_sampled(feasible, pod, plan)
        return nodes[best], plan

    def _refused_by_shape(self, pod: PodRequest, plan: Plan, book: ShapeAnswers, total: int) -> Decision | None:
        """A pod no node fits, each node counted under its own answer (`_settled_alike`: else None)."""
        if book.by_usage and not self._settled_alike(pod, plan, book):
            return None
        code = Code.UNSCHEDULABLE if book.resolvable else Code.UNRESOLVABLE
        return Decision(pod.key, False, reason=summarize_reasons(total, +book.reasons), code=code)

    def _samples_by_shape(self, pod: PodRequest, plan: Plan) -> bool:
        """Whether each node's answer to the pod is its own, remembered per shape (module docstring)."""
        if not plan.settles or pod.host_ports or pod.preferred_node_affinity or self._added_scores:
            return False
        if self._dead or self.nominated or self.nominated_gangs:
            return False
        return all(isinstance(getattr(rule, "__self__", None), OWN_FILTERS) for rule in plan.node_rules) and all(
            isinstance(getattr(rule, "__self__", None), OWN_FILTERS) for rule in plan.usage_rules
        )

    def _shape_answers(
        self, pod: PodRequest, plan: Plan, index: CapacityIndex, resource: str, need: int
    ) -> ShapeAnswers:
        """The shape's answers (`ShapeAnswers`), brought up to date with the nodes changed since its last cycle."""
        key = (id(plan.local), resource)
        book = self._shape_memo.get(key)
        changed: Iterable[str] | None = None
        if book is not None and book.local is plan.local and book.need == need:
            changed = self.changed_since(book.generation)
        numbering = self._numbering
        if len(numbering.numbers) + len(self.nodes) > CONTENTS_NUMBERED:
            numbering.numbers.clear()
            numbering.by_node.clear()
            numbering.current.clear()
            numbering.generation = -1
            numbering.epoch += 1
        if book is None or changed is None:
            if len(self._shape_memo) >= SHAPES_REMEMBERED:
                self._shape_memo.clear()
            book = self._shape_memo[key] = ShapeAnswers(plan.local, resource, need, self.generation)
            changed = self.nodes.keys()
        if book.numbering != numbering.epoch:
            book.alike.clear()
            book.numbering = numbering.epoch
        alike = book.alike
        numbers = self._numbers_of_nodes()
        if not book.finals:
            return self._every_answer(book, pod, plan, index, need, numbers)
        # `book.positions` follow `fits` where they are in the tree's order now (`_sample_by_shape` makes them again
        # otherwise).
        positions = self._tree_positions() if book.ordered is self._tree.order() else None
        nodes, fits, finals = self.nodes, book.fits, book.finals
        reasons, fitting, unresolvable = book.reasons, book.fitting, book.unresolvable
        short, by_class = book.short, book.by_class
        free_of, unresolvable_code, answer_of = index.get, Code.UNRESOLVABLE, self._answer
        resolvable = by_usage_count = 0  # what `book.resolvable` and `book.by_usage` gain, added after the loop
        try:  # the sums stay whole should an answer raise
            for name in changed:
                record = nodes.get(name)
                old = finals.get(name)
                answer: tuple[Status, int, bool, bool] | None = None
                if record is not None:
                    number = numbers[name]
                    answer = alike.get(number) if number is not None else None
                    if answer is None:
                        answer = answer_of(record, pod, plan, free_of, need, short, by_class)
                        if number is not None:
                            alike[number] = answer
                    if old is not None and (old is answer or old == answer):
                        continue  # the same answer: the sums, `fits` and `book.positions` hold it already
                if old is not None:
                    status, klass, fit, by_usage = old
                    for reason in status.reasons:
                        reasons[reason] -= 1
                    if status.code is unresolvable_code:
                        unresolvable[klass] -= 1
                    else:
                        resolvable -= 1
                    fitting[klass] -= fit
                    by_usage_count -= by_usage
                if answer is None:  # the node is gone
                    if old is not None:
                        del finals[name], fits[name]
                    book.ordered = None
                    continue
                status, klass, fit, by_usage = answer
                for reason in status.reasons:
                    reasons[reason] += 1
                if status.code is unresolvable_code:
                    unresolvable[klass] += 1
                else:
                    resolvable += 1
                fitting[klass] += fit
                by_usage_count += by_usage
                fits[name] = fit
                if positions is not None:
                    at = positions.get(name)
                    if at is None:
                        book.ordered = positions = None
                    else:
                        _keep_fitting(book, at, name, fit)
                finals[name] = answer
        finally:
            book.resolvable += resolvable
            book.by_usage += by_usage_count
        book.generation = self.generation
        return book

    def _answer(
        self,
        record: NodeRecord,
        pod: PodRequest,
        plan: Plan,
        free_of: Callable[[str], int | None],
        need: int,
        short: Status,
        by_class: dict[int, Status | None],
    ) -> tuple[Status, int, bool, bool]:
        """One node's answer to the shape (`ShapeAnswers.finals`): `check`'s answer (a shape sampled has no
        cluster-wide filter, no dead node: `_samples_by_shape`), asked of the filters themselves, since the node
        changed since its memo was written; those that read only the node asked once per node class
        (`ShapeAnswers.by_class`), and `free_of` (what the capacity index offers on a node) only where they pass."""
        klass = record.klass
        status = by_class.get(klass, _UNASKED)
        if status is _UNASKED:
            status = by_class[klass] = self._node_fit(record, pod, plan)
        if status is not None:
            return (status, klass, False, False)
        for rule in plan.usage_rules:  # `_usage_fit`, then the device fit
            status = rule(self, record, pod, plan)
            if status is not None:
                break
        else:
            status = self._device_fit(record, pod, plan)
        if record.nominees and status.ok:  # `check`'s rule (unreached: `_samples_by_shape` walks held nodes in turn)
            status = self._nominee_refusal(record, pod, plan) or status
        code = status.code
        if code is Code.SUCCESS:
            free = free_of(record.name)
            return (short, klass, free is not None and free >= need, False)
        return (status, klass, False, code is Code.UNRESOLVABLE)

    def _every_answer(
        self,
        book: ShapeAnswers,
        pod: PodRequest,
        plan: Plan,
        index: CapacityIndex,
        need: int,
        numbers: dict[str, int | None],
    ) -> ShapeAnswers:
        """A book with no answer yet (`_shape_answers`) filled with every node's: asked once per content number,
        as the loop node by node asks, and summed once per distinct answer with its count (in the order of their
        first nodes, so that the sums hold their keys in the same order)."""
        alike, fits, finals, by_class = book.alike, book.fits, book.finals, book.by_class
        short = book.short
        free_of = index.get
        for name, record in self.nodes.items():
            number = numbers[name]
            answer = alike.get(number) if number is not None else None
            if answer is None:
                answer = self._answer(record, pod, plan, free_of, need, short, by_class)
                if number is not None:
                    alike[number] = answer
            fits[name] = answer[2]
            finals[name] = answer
        first = {id(answer): answer for answer in finals.values()}
        counts = Counter(map(id, finals.values()))  # in the order of their first nodes, as `first`
        reasons, fitting, unresolvable = book.reasons, book.fitting, book.unresolvable
        for key, count in counts.items():
            status, klass, fit, by_usage = first[key]
            for reason in status.reasons:
                reasons[reason] += count
            if status.code is Code.UNRESOLVABLE:
                unresolvable[klass] += count
            else:
                book.resolvable += count
            fitting[klass] += fit * count
            book.by_usage += by_usage * count
        book.ordered = None
        book.generation = self.generation
        return book

    def _numbers_of_nodes(self) -> dict[str, int | None]:
        """Each node's content number now (`_content_number`), kept current from the change log
        (`NodeNumbering.current`): a node is numbered once per change, not once per shape asking about it."""
        numbering = self._numbering
        generation = self.generation
        current = numbering.current
        if numbering.generation == generation:
            return current
        changed: Iterable[str] | None = self.changed_since(numbering.generation) if numbering.generation >= 0 else None
        nodes = self.nodes
        if changed is None:
            current.clear()
            changed = nodes.keys()
        for name in changed:
            record = nodes.get(name)
            if record is None:
                current.pop(name, None)
            else:
                current[name] = self._content_number(record)
        numbering.generation = generation
        return current

    def _tree_positions(self) -> dict[str, int]:
        """Each node's position in the node tree's order now (`NodeTree.order()`), made once per order."""
        order = self._tree.order()
        known = self._positions
        if known[0] is not order:
            known = self._positions = (order, {name: at for at, name in enumerate(order)})
        return known[1]

    def _content_number(self, record: NodeRecord) -> int | None:
        """The number of what a node's answers to a pod read of it (`NodeNumbering`): its scoring content (its class,
        usage and device states: `Scoring.scoring_content`), its plugin problems, and what it offers in each capacity
        index; None for a node whose content is its own (a plugin state without one). Remembered per node version."""
        numbering = self._numbering
        known = numbering.by_node.get(record.name)
        if known is not None and known[0] is record and known[1] == record.version:
            return known[2]
        content = self.scoring_content(record)
        number = None
        if content is not None:
            name = record.name
            key = (
                content,
                tuple(sorted(record.problems.items())) if record.problems else (),
                tuple([index.get(name) for index in self._index.values()]),
                tuple(self._index),
            )
            number = numbering.numbers.setdefault(key, len(numbering.numbers))
        numbering.by_node[record.name] = (record, record.version, number)
        return number

    def _settled_alike(self, pod: PodRequest, plan: Plan, book: ShapeAnswers) -> bool:
        """Whether, in a cycle no node fits, each class an unresolvable answer by what is in use settles counts its
        nodes under their own answers, as the walk would: every such answer in the class is one (whichever node the
        walk meets first), and each other node of the class answers it or is refused by what is in use
        (`_refused_like`)."""
        finals, nodes = book.finals, self.nodes
        for klass, count in book.unresolvable.items():
            if not count:
                continue
            members = self._class_nodes.get(klass, {})
            settling: tuple[Code, tuple[str, ...]] | None = None
            for name in members:
                status, _, _, by_usage = finals[name]
                if by_usage:
                    if settling is None:
                        settling = (status.code, status.reasons)
                    elif settling != (status.code, status.reasons):
                        return False
            if settling is None:
                continue
            for name in members:
                status = finals[name][0]
                # The filters that read only the node pass all of the class (one answered by what is in use): the
                # node's answer is its own where what is in use refuses it.
                if settling != (status.code, status.reasons) and self._usage_fit(nodes[name], pod, plan) is None:
                    return False
        return True

    def _rank_sampled(self, feasible: list[str], pod: PodRequest, plan: Plan) -> str:
        """`_rank`'s choice (module docstring), each plugin's normalization and weight applied once per distinct raw
        score; a plugin that reads more than the node and has something to say ranks node by node (`_rank`)."""
        prescored = {
            at: plugin.prescore(self, pod, plan) for at, (plugin, _) in enumerate(self._scorers) if not plugin.local
        }
        if any(state is not None for state in prescored.values()):
            return self._rank(feasible, pod, plan, prescored)  # each PreScore asked once (InterPodAffinity's is dear)
        if not self._local_scorers:
            return feasible[0]
        # Nodes alike in every raw score total alike: each content's raw scores (`_local_by_content`), or each tuple
        # of raw scores (nodes alike in content share one object, `LocalRaws.by_number`), each once. Which are best
        # reads no order among them: the node chosen is the first of the sample (or in the tie order) of the best.
        by_content = self._local_by_content(feasible, pod, plan)
        alike: list[int]  # each node's content number, or its raw scores' identity
        kinds: Collection[int]  # each of those once, `distinct` their raw scores in that order
        if by_content is not None:
            alike, kinds, distinct = by_content
        else:
            raws = self._local_raw(feasible, None, pod, plan)
            alike = list(map(id, raws))
            first = dict(zip(alike, raws, strict=True))
            kinds, distinct = first, list(first.values())
        packs = self.packs_ties(pod, plan)
        if len(kinds) == 1:
            return min(feasible, key=scores.tie_order) if packs else feasible[0]
        columns = list(zip(*distinct, strict=True))
        summed: list[list[float]] = []  # each plugin's weighed scores, summed in the profile's order where needed
        # Where KubegpuFragmentation leads (`Scoring.fragmentation_leads`), as `_rank` ranks: its whole points, then
        # (binpack) the other scores but the policy's and `scoring.NOT_TIE_BREAKERS`, then the tie order, or
        # (else) the policy's score, then those other scores.
        leads = packs or self.fragmentation_leads(pod, plan)
        lead: list[int] | None = None
        policy: list[float] | None = None
        others: list[float] | None = None
        policy_name = scores.policy_plugin(self.policy)
        # Packing ties ranks by the lead and the other scores alone: the policy's and `NOT_TIE_BREAKERS` unread.
        unread = {policy_name, *scoring.NOT_TIE_BREAKERS} if packs and self._scores_fragmentation else ()
        column = 0
        for plugin, weight in self._scorers:
            if not plugin.local:
                continue
            values = list(columns[column])
            column += 1
            if leads and plugin.name == scores.FRAGMENTATION:
                lead = list(map(int, values))
            if plugin.name in unread or min(values) == max(values):
                continue
            normalized = plugin.normalize(True, values)
            if normalized is not values and min(normalized) == max(normalized):
                continue
            weighed = normalized if weight == 1 else [weight * value for value in normalized]
            summed.append(weighed)
            if plugin.name == policy_name:
                policy = normalized
            elif plugin.name not in scoring.NOT_TIE_BREAKERS:
                others = weighed if others is None else list(map(add, others, weighed))
        if packs and lead is not None:  # the first in the tie order among the nodes of the best distinct tuples
            packed = list(zip(lead, others or [0.0] * len(distinct), strict=True))
            top_packed = max(packed)
            chosen = {kind for kind, key in zip(kinds, packed, strict=True) if key == top_packed}
            return min(compress(feasible, map(chosen.__contains__, alike)), key=scores.tie_order)
        if not summed:
            return feasible[0]
        if lead is not None and min(lead) != max(lead):
            ties = policy or [0.0] * len(distinct)
            keys = list(zip(lead, ties, others or ties, strict=True))
            best = max(keys)
            chosen = {kind for kind, key in zip(kinds, keys, strict=True) if key == best}
        else:
            totals = summed[0]
            for weighed in summed[1:]:
                totals = list(map(add, totals, weighed))
            top = max(totals)
            chosen = {kind for kind, total in zip(kinds, totals, strict=True) if total == top}
        # The first node of the sample whose content is among the best.
        return next(compress(feasible, map(chosen.__contains__, alike)))


def _keep_fitting(book: ShapeAnswers, at: int, name: str, fit: bool) -> None:
    """Node `name`, at position `at` of the tree's order, among `book`'s fitting nodes (`ShapeAnswers.positions`)
    where it `fit`s, out of them where not."""
    positions = book.positions
    i = bisect_left(positions, at)
    there = i < len(positions) and positions[i] == at
    if fit and not there:
        positions.insert(i, at)
        book.in_order.insert(i, name)
    elif there and not fit:
        del positions[i], book.in_order[i]
