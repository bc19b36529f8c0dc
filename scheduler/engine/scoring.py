"""The PreScore/Score/NormalizeScore extension points: every enabled score plugin (`kubescores`, then a third
party's) over the feasible nodes, normalized and weighed; what the plugins read of the engine (`ScoreContext`); and
how many feasible nodes a cycle finds before scoring (`_sample_size`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence, Set
from itertools import compress, repeat
from operator import add, is_

from kubegpu.core.models import (
    PodRequest,
)
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine.contents import CONTENTS_REMEMBERED, Contents
from kubegpu.scheduler.engine.memos import LocalRaws
from kubegpu.scheduler.engine.records import (
    FRAGMENTATION_EPOCH_HOOK,
    NodeRecord,
    Plan,
    log,
)

_NONE: frozenset[tuple[str, str]] = frozenset()
# Left out of the weighed sum that breaks the ties the lead and the policy leave: fragmentation within a point, and
# balance, broke them worse than the order nodes were found in (sharing_bench, seeds 42-44: 94.1 % with them,
# 94.7 % without).
NOT_TIE_BREAKERS = frozenset({scores.FRAGMENTATION, scores.BALANCED})
_NOWHERE: Mapping[str, int] = {}


class Scoring(Contents):
    """Scoring and ranking the feasible nodes."""

    def fragmentation_matters(self, pod: PodRequest, plan: Plan) -> bool:
        """Whether KubegpuFragmentation may rank the pod's nodes otherwise than the policy's order, so that a cycle
        ranks kube-scheduler's adaptive count of feasible nodes, not the policy's first few: the pod may go to a node
        holding a state of a plugin that measures fragmentation (a pod without devices to any such node, a device pod
        to one holding its plugins' states too) and the profile sets `percentageOfNodesToScore`; or, with it unset, the
        pod may go to a node whose devices are shared (`kubegpu.core.kit.shares_devices`: GPU shares).

        Unset, whole devices keep the first few: the adaptive count for every pod that may reach a GPU or Neuron node
        cost 3.4x the engine time on `benchmarks/simulate_bench.py`, and still 4-5x once nodes alike shared their local
        scores (`LocalRaws.by_number`) and the kit's states had a scoring content. For shared GPUs the adaptive count is
        worth about 3.5 points of GPU capacity on the FGD paper's trace (`benchmarks/sharing_bench.py`: 88.8 % on the
        first 8 nodes, 92.1-92.4 % on kube-scheduler's count) for about 15 % of the replay's CPU time."""
        counts = self._fragmenting_nodes if self.scoring.percentage_of_nodes_to_score > 0 else self._sharing_nodes
        if not counts:
            return False
        if not plan.devices:
            return counts.get("", 0) > 0
        return any(counts.get(plugin, 0) > 0 for plugin, _ in plan.devices)

    def fragmentation_leads(self, pod: PodRequest, plan: Plan) -> bool:
        """Whether KubegpuFragmentation ranks the pod's nodes before the other scores: the pod may go to a node whose
        devices are shared (`kubegpu.core.kit.shares_devices`). There a node leads by a whole point of its raw score
        (100 x sigmoid(-d), d the devices stranded: about a twenty-fifth of a GPU where little is stranded), truncated
        as the FGD paper's integer score is. Under the binpack policy (`packs_ties`) the nodes tied on it, or all of
        them where it scores every node alike, are ranked by the other scores weighed as usual but the policy's and
        NodeResourcesBalancedAllocation (`NOT_TIE_BREAKERS`), then by the tie order (`scores.tie_order`): pods pack
        onto the same nodes, as the FGD paper's simulator packs them by name over every node, and whole GPUs and
        nodes stay free. Under another policy, ties go to the policy's score, then to those other scores, then to
        the order the nodes were found, and where it scores every node alike the weighed sum ranks as before.
        `benchmarks/sharing_bench.py`, seeds 42-51, adaptive count: ties to the policy, then the order found
        94.75 %; to the first by name 95.05 %; by the tie order 95.24 % (the paper's FGD 95.2 %). Pods that cannot
        reach a shared device are ranked as before (kube-scheduler's parity)."""
        if not self.scoring.fragmentation_lead:  # the profile's KubegpuFragmentation `lead: false`
            return False
        counts = self._sharing_nodes
        if not plan.devices:
            return counts[""] > 0
        return any(counts[plugin] > 0 for plugin, _ in plan.devices)

    def packs_ties(self, pod: PodRequest, plan: Plan) -> bool:
        """Whether the pod's ties on KubegpuFragmentation's whole points go to the first node in the tie order
        (`fragmentation_leads` under the binpack policy)."""
        return self.policy == "binpack" and self.fragmentation_leads(pod, plan)

    def fragmentation_epochs(self, plan: Plan | None = None) -> tuple[int | None, ...]:
        """Each fragmenting plugin's `kubegpu_scheduler_fragmentation_epoch` now, in `_fragmenters`' order (None: its
        answers follow from the node alone, or it failed, logged, or none of the nodes the pod may be ranked on holds
        its state: then no score of the pod's reads it). Asked once in every cycle that ranks nodes. With the pod's
        `plan`, only of the plugins whose states lie beside its first device plugin's (`_fragmenting_beside`: a device
        pod is ranked only where its plugins' states are); without one, or for a pod without devices, of every plugin
        with a node."""
        reach: Mapping[str, int] = self._fragmenting_nodes
        if plan is not None and plan.devices:
            reach = self._fragmenting_beside.get(plan.devices[0][0], _NOWHERE)
        askers = self._epoch_askers
        epochs: list[int | None] = []
        for plugin in self._fragmenters:
            if plugin not in askers or not reach.get(plugin):
                epochs.append(None)
                continue
            try:
                epoch = self.plugins.call(plugin, FRAGMENTATION_EPOCH_HOOK, shared=self._shared.setdefault(plugin, {}))
            except PluginHookError as exc:
                log.error("%s", exc)
                epoch = None
            epochs.append(epoch)
        return tuple(epochs)

    def score_epochs(self, plan: Plan) -> tuple[int | None, ...]:
        """The fragmentation epochs a cycle's memos of the pod's scores are keyed by: `fragmentation_epochs(plan)`,
        () while no node holds a fragmenting plugin's state."""
        return self.fragmentation_epochs(plan) if self._fragmenting_nodes.get("") else ()

    def _score(self, record: NodeRecord, pod: PodRequest) -> float:
        used = self.device_usage(record, pod)
        if used is None:
            allocatable = record.info.allocatable.get("cpu", 0)
            used = record.used["cpu"] / allocatable if allocatable else 0.0
        policy_score = 100.0 * (used if self.policy == "binpack" else 1.0 - used)
        return self.device_score(record, pod) + policy_score

    def _local_raw(
        self, names: list[str], records: Sequence[NodeRecord] | None, pod: PodRequest, plan: Plan
    ) -> list[tuple[float, ...]]:
        """The local score plugins' raw scores on each node (`names`, their `records`, or None to look up only the
        nodes scored here; a tuple in `_local_scorers`' order; 0 for a plugin with nothing to say of the pod),
        remembered per pod shape (`Plan.local`) and, while KubegpuFragmentation scores, the fragmenting plugins'
        epochs (`LocalRaws`): nodes alike in what the plugins read share one computation, remembered by the number
        of their content (`_numbers_now`), and the others are remembered by name until the change log names them."""
        # The epochs whether or not KubegpuFragmentation scores: a device score may read the learned mix too.
        epochs = self.score_epochs(plan)
        book = self._local_raws(plan, epochs)
        alone = book.raws
        # Nodes alike in all the local scores read share one computation (`_numbers_now`).
        numbered: list[int | None] | None = None
        by_number = book.by_number
        if not self._added_scores and not pod.preferred_node_affinity:
            numbers = self._numbers_now()
            if book.numbering != self._score_numbers.epoch:
                by_number.clear()
                book.numbering = self._score_numbers.epoch
            if len(by_number) > CONTENTS_REMEMBERED - len(names):
                by_number.clear()
            numbered = list(map(numbers.__getitem__, names))
            raws: list[tuple[float, ...] | None] = list(map(by_number.get, numbered))  # type: ignore[arg-type]
            if None not in raws:
                return raws  # type: ignore[return-value]  # none is None
            if None not in numbered:  # every node has a content: each one not remembered scored once, at its first
                missing = list(compress(range(len(raws)), map(is_, raws, repeat(None))))
                todo: dict[int, int] = {}  # number -> its first node (ordered by their last nodes, from the end)
                for i in reversed(missing):
                    todo[numbered[i]] = i  # type: ignore[index]  # none is None
                nodes = self.nodes
                fresh = self._local_columns(
                    [records[i] if records is not None else nodes[names[i]] for i in todo.values()], pod, plan
                )
                by_number.update(zip(todo, fresh, strict=True))
                for i in missing:
                    raws[i] = by_number[numbered[i]]  # type: ignore[index]  # none is None
                return raws  # type: ignore[return-value]  # every None was filled above
        else:
            raws = list(map(alone.get, names))
            if None not in raws:
                return raws  # type: ignore[return-value]  # none is None
        nodes = self.nodes
        asked: list[NodeRecord] = []  # the nodes to score: one per content not remembered, and those without one
        first: dict[int, int] = {}  # content number -> its node's position in `asked`
        waiting: list[tuple[int, int]] = []  # (position in names, position in asked)
        for i in [i for i, raw in enumerate(raws) if raw is None]:
            number = numbered[i] if numbered is not None else None
            if number is None:
                known = alone.get(names[i]) if numbered is not None else None
                if known is not None:
                    raws[i] = known
                    continue
                waiting.append((i, len(asked)))
            else:
                at = first.get(number)
                if at is not None:
                    waiting.append((i, at))
                    continue
                at = first[number] = len(asked)
                waiting.append((i, at))
            asked.append(records[i] if records is not None else nodes[names[i]])
        fresh = self._local_columns(asked, pod, plan) if asked else []
        for i, at in waiting:
            raw = raws[i] = fresh[at]
            number = numbered[i] if numbered is not None else None
            if number is None:
                alone[names[i]] = raw
            else:
                by_number[number] = raw
        return raws  # type: ignore[return-value]  # every None was filled above

    def _local_by_content(
        self, names: list[str], pod: PodRequest, plan: Plan
    ) -> tuple[list[int], dict[int, int], list[tuple[float, ...]]] | None:
        """`_local_raw` per distinct content: each node's content number (`_numbers_now`), each number's first node,
        and each number's raw scores in that dict's order, remembered as `_local_raw` remembers them; nodes not
        remembered are scored as there, once per content. None where a node has no content number (a state that is
        its own content) or the raw scores are not remembered by content (`_local_raw`)."""
        if self._added_scores or pod.preferred_node_affinity:
            return None
        book = self._local_raws(plan, self.score_epochs(plan))
        numbers = self._numbers_now()
        by_number, before = book.by_number, book.before
        if book.numbering != self._score_numbers.epoch:
            by_number.clear()
            before.clear()
            book.numbering = self._score_numbers.epoch
        if len(by_number) > CONTENTS_REMEMBERED - len(names):
            by_number.clear()
        numbered: list[int] = list(map(numbers.__getitem__, names))  # type: ignore[arg-type]  # None checked below
        first = dict(zip(reversed(numbered), range(len(numbered) - 1, -1, -1), strict=True))
        if None in first:
            return None
        raws: list[tuple[float, ...] | None] = list(map(by_number.get, first))
        if None in raws:
            todo = [number for number, raw in zip(first, raws, strict=True) if raw is None]
            nodes = self.nodes
            asked = [nodes[names[first[number]]] for number in todo]
            fresh = self._local_columns(asked, pod, plan, list(map(before.get, todo)) if before else None)
            by_number.update(zip(todo, fresh, strict=True))
            raws = list(map(by_number.__getitem__, first))
        return numbered, first, raws  # type: ignore[return-value]  # every None was filled above

    def _local_columns(
        self,
        asked: list[NodeRecord],
        pod: PodRequest,
        plan: Plan,
        before: list[tuple[float, ...] | None] | None = None,
    ) -> list[tuple[float, ...]]:
        """The local score plugins' raw scores on each of the `asked` nodes, a tuple per node. `before`: each node's
        raw scores under the fragmenting plugins' epochs before (`LocalRaws.before`) or None; the plugins whose
        score reads no mix (`reads_mix` false) are asked only of the nodes without."""
        columns: list[list[float]] = []
        for plugin in self._local_scorers:
            state = plugin.prescore(self, pod, plan)
            if state is None:
                columns.append([0.0] * len(asked))
                continue
            at = len(columns)
            if before is not None and not getattr(plugin, "reads_mix", True):
                missing = [i for i, row in enumerate(before) if row is None]
                column = [0.0 if row is None else row[at] for row in before]
                if missing:
                    scored = plugin.score(self, state, [asked[i] for i in missing], pod, plan)
                    for i, value in zip(missing, scored, strict=True):
                        column[i] = value
                columns.append(column)
                continue
            columns.append(plugin.score(self, state, asked, pod, plan))
        return list(zip(*columns, strict=True)) if columns else [() for _ in asked]

    def _local_raws(self, plan: Plan, epochs: tuple[int | None, ...]) -> LocalRaws:
        """The shape's remembered raw scores (`LocalRaws`), brought up to date with the change log."""
        key, generation = id(plan.local), self.generation
        known = self._raws.get(key)
        if known is not None and known.local is plan.local and known.epochs == epochs:
            if known.generation != generation and not known.raws:
                known.generation = generation
            elif known.generation != generation:
                changed = self.changed_since(known.generation)
                if changed is None:
                    known.raws.clear()
                else:
                    for name in changed:
                        known.raws.pop(name, None)
                known.generation = generation
            return known
        if len(self._raws) >= 256:
            self._raws.clear()
        fresh = self._raws[key] = LocalRaws(plan.local, epochs, generation)
        if known is not None and known.local is plan.local:  # the epochs moved: a mix was learned
            fresh.before, fresh.numbering = known.by_number or known.before, known.numbering
        return fresh

    def _rank(
        self, feasible: list[str], pod: PodRequest, plan: Plan, prescored: dict[int, object] | None = None
    ) -> str:
        """kube-scheduler's score phase over the feasible nodes: every enabled plugin's raw scores normalized over
        them and weighed; the best node, the first in candidate order on a tie. A plugin whose scores are the same on
        every node is skipped: it cannot change which node is best. `prescored`: the non-local plugins' PreScore
        states by the plugin's position in `_scorers`, where the caller has asked them already this cycle.

        The built-in local plugins' part of each node's total is worked out once per distinct tuple of their raw
        scores (nodes alike in content share one, `LocalRaws.by_number`; their normalizations read only the least and
        the greatest score and map each score alone), then summed with the other plugins' scores node by node in the
        same order as `_rank_by_node` sums them: the same floats, the same best node. Where KubegpuFragmentation
        leads, or a third party scores, `_rank_by_node` ranks."""
        if self._added_scores:
            return self._rank_by_node(feasible, pod, plan, prescored)
        nodes = self.nodes
        records = [nodes[name] for name in feasible]
        raws = self._local_raw(feasible, records, pod, plan) if self._local_scorers else []
        # Each distinct raw tuple (by identity) once, and each node's position among them.
        first = dict(zip(map(id, raws), raws, strict=True))  # a later duplicate keeps its first place
        distinct = list(first.values())
        slots = dict(zip(first, range(len(first)), strict=True))
        local_part: list[float] | None = None  # per distinct tuple: the local plugins' weighed scores summed
        columns = list(zip(*distinct, strict=True)) if distinct else []
        column = 0
        totals: list[float] | None = None  # per node
        for at, (plugin, weight) in enumerate(self._scorers):
            if plugin.local:
                values: Sequence[float] = columns[column]
                column += 1
                if plugin.name == scores.FRAGMENTATION and self.packs_ties(pod, plan):
                    return self._rank_by_node(feasible, pod, plan, prescored)
                if min(values) == max(values):
                    continue
                if plugin.name == scores.FRAGMENTATION and self.fragmentation_leads(pod, plan):
                    return self._rank_by_node(feasible, pod, plan, prescored)
                raw = list(values)
                normalized = plugin.normalize(True, raw)
                if normalized is not raw and min(normalized) == max(normalized):
                    continue
                weighed = normalized if weight == 1 else [weight * value for value in normalized]
                local_part = [0 + v for v in weighed] if local_part is None else list(map(add, local_part, weighed))
                continue
            state = plugin.prescore(self, pod, plan) if prescored is None else prescored[at]
            if state is None:
                continue
            normalized = plugin.normalize(state, plugin.score(self, state, records, pod, plan))
            if min(normalized) == max(normalized):
                continue
            if totals is None:
                totals = (
                    list(map(local_part.__getitem__, map(slots.__getitem__, map(id, raws))))
                    if local_part is not None
                    else [0] * len(records)
                )
            totals = list(map(add, totals, normalized if weight == 1 else [weight * v for v in normalized]))
        if totals is None:
            if local_part is None:
                return feasible[0]
            by_node = list(map(local_part.__getitem__, map(slots.__getitem__, map(id, raws))))
            return feasible[by_node.index(max(local_part))]
        return feasible[totals.index(max(totals))]

    def _rank_by_node(
        self, feasible: list[str], pod: PodRequest, plan: Plan, prescored: dict[int, object] | None = None
    ) -> str:
        """`_rank` node by node: each plugin's scores over the feasible nodes, weighed, summed per node; where
        KubegpuFragmentation leads (`fragmentation_leads`), its whole points first, then (under binpack,
        `packs_ties`) the other scores but the policy's and `NOT_TIE_BREAKERS`, then the tie order, or (else)
        the policy's score, then those other scores."""
        nodes = self.nodes
        records = [nodes[name] for name in feasible]
        # The local plugins' raw scores as columns, one per plugin in `_local_scorers`' order.
        local = list(zip(*self._local_raw(feasible, records, pod, plan), strict=True)) if self._local_scorers else []
        weighed: list[list[float]] = []  # each plugin's weighed scores; summed per node at the end
        lead: list[int] | None = None  # KubegpuFragmentation's whole points, where it leads (`fragmentation_leads`)
        policy: Sequence[float] = ()  # the policy's scores (NodeResourcesMostAllocated under binpack): lead's ties
        policy_name = scores.policy_plugin(self.policy)
        rest: list[int] = []  # positions in `weighed` of the scores that break the ties left (`NOT_TIE_BREAKERS`)
        packs = self.packs_ties(pod, plan)
        column = 0
        values: Sequence[float]
        for at, (plugin, weight) in enumerate(self._scorers):
            if plugin.local:
                values = local[column]
                column += 1
                if packs and plugin.name == scores.FRAGMENTATION:
                    lead = [int(value) for value in values]
                if min(values) == max(values):
                    continue
                state: object = True
                raw = list(values)
                if plugin.name == scores.FRAGMENTATION and self.fragmentation_leads(pod, plan):
                    lead = [int(value) for value in raw]
            else:
                state = plugin.prescore(self, pod, plan) if prescored is None else prescored[at]
                if state is None:
                    continue
                raw = plugin.score(self, state, records, pod, plan)
            values = plugin.normalize(state, raw)
            # A local plugin's raw scores differ (above): used as they are (the same list back), so do its scores.
            if not (plugin.local and values is raw) and min(values) == max(values):
                continue
            if plugin.name == policy_name:  # before KubegpuFragmentation in the profile's order
                policy = values
            elif plugin.name not in NOT_TIE_BREAKERS:
                rest.append(len(weighed))
            weighed.append(values if weight == 1 else [weight * value for value in values])
        if packs and lead is not None:
            summed = [float(sum(weighed[k][i] for k in rest)) for i in range(len(records))]
            return first_in_tie_order(feasible, list(zip(lead, summed, strict=True)))
        if not weighed:
            return feasible[0]
        if lead is not None and min(lead) != max(lead):
            ties = policy or [0.0] * len(records)
            others = [sum(weighed[k][i] for k in rest) for i in range(len(records))] if rest else ties
            return feasible[max(range(len(records)), key=lambda i: (lead[i], ties[i], others[i]))]
        totals = list(map(sum, zip(*weighed, strict=True))) if len(weighed) > 1 else weighed[0]
        return feasible[max(range(len(records)), key=totals.__getitem__)]

    # -- what the score plugins read (`framework.ScoreContext`) ------------------------------------------------------

    @property
    def soft_tainted(self) -> Set[str]:
        """The nodes with a PreferNoSchedule taint."""
        return self._soft_tainted

    @property
    def image_nodes(self) -> Mapping[str, int]:
        """How many nodes list each image name (ImageLocality)."""
        return self._image_nodes

    def avoided_on(self, name: str) -> frozenset[tuple[str, str]]:
        """The controllers (kind, UID) a node's preferAvoidPods annotation names."""
        return self._avoid.get(name, _NONE)

    def avoiding(self, pod: PodRequest) -> tuple[str, str] | None:
        """The pod's controller (kind, UID) when some node's preferAvoidPods names it (NodePreferAvoidPods), else
        None."""
        if not self._avoided:
            return None
        key = scores.avoidance_key(pod)
        return key if key is not None and self._avoided[key] > 0 else None

    def listed_images(self, pod: PodRequest) -> tuple[str, ...]:
        """The pod's images, normalized, when some node lists one of them (ImageLocality), else ()."""
        if not self._image_nodes or not pod.images:
            return ()
        images = tuple(scores.normalized_image(image) for image in pod.images)
        return images if any(image in self._image_nodes for image in images) else ()

    def images_matter(self, pod: PodRequest) -> bool:
        """Whether ImageLocality may tell nodes apart for the pod: one of its images is listed by some nodes but not
        all, or by all at different sizes, and what the nodes could hold of them, scaled as the score scales it,
        passes the score's floor."""
        images = self.listed_images(pod)
        if not images:
            return False
        total = len(self.nodes)
        counts = [self._image_nodes[image] for image in images]
        sizes = [self._image_sizes.get(image) or Counter() for image in images]
        if all(c == 0 or (c == total and len(s) == 1) for c, s in zip(counts, sizes, strict=True)):
            return False
        most = sum(int(max(s, default=0) * (c / total)) for s, c in zip(sizes, counts, strict=True))
        return most > scores.IMAGE_FLOOR

    def _sample_size(self, pod: PodRequest, plan: Plan) -> int:
        """How many feasible nodes to find before scoring. When no enabled score plugin may rank them otherwise than
        the policy's order the candidates come in (`ScorePlugin.matters`), `sample` do; else (or when a
        configuration sets `percentageOfNodesToScore`) as many as kube-scheduler finds."""
        percentage = self.scoring.percentage_of_nodes_to_score
        if not percentage:
            for plugin in self._sample_deciders:
                if plugin.matters(self, pod, plan):
                    break
            else:
                return self.sample
        return max(self.sample, scores.feasible_to_find(len(self.nodes), percentage))

    def score_node(
        self, name: str, pod: PodRequest, plan: Plan | None = None, *, epochs: tuple[int | None, ...] | None = None
    ) -> float:
        """The device score (0..200) of a node that passed the filter: plugin topology score plus the policy score
        (the extender's prioritize: kube-scheduler adds its own scores; `schedule` ranks with every score plugin).

        Remembered like `check`'s answer, per node version, pod signature and the fragmentation epochs: `epochs` as
        `score_epochs` answered for the pod in this cycle (a caller scoring many nodes asks once), else asked here.
        """
        record = self.nodes[name]
        plan = plan or self.plan(pod)
        signature = plan.signature
        if epochs is None:
            epochs = self.score_epochs(plan)
        remembered = record.last_score
        if (
            remembered is not None
            and remembered[0] == record.version
            and remembered[1] is signature
            and remembered[2] == epochs
        ):
            return remembered[3]
        score = self._score(record, pod)
        record.last_score = (record.version, signature, epochs, score)
        return score


def first_in_tie_order(feasible: Sequence[str], keys: Sequence[tuple[int, float]]) -> str:
    """The first node in the tie order (`scores.tie_order`) among those of the greatest key (KubegpuFragmentation's
    whole points, then the other scores' sum: `Scoring.packs_ties`)."""
    best = max(keys)
    return min((name for name, key in zip(feasible, keys, strict=True) if key == best), key=scores.tie_order)
