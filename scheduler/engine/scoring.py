"""The PreScore/Score extension points: every enabled score plugin's raw scores over the feasible nodes,
normalized and weighed (`kubegpu.scheduler.scores` has the rules), the device plugins' topology score among them; and
how many feasible nodes a cycle finds before scoring (`_sample_size`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kubegpu.core.models import (
    PodRequest,
)
from kubegpu.core.plugin_manager import PluginHookError
from kubegpu.scheduler import podindex, scores
from kubegpu.scheduler.engine.filtering import Filtering
from kubegpu.scheduler.engine.records import NodeRecord, Plan, log, make_room


class Scoring(Filtering):
    """Scoring and ranking the feasible nodes."""

    def _device_scores(
        self, record: NodeRecord, pod: PodRequest, routes: dict[str, list[str]]
    ) -> tuple[float, float | None]:
        """The device plugins' mean topology score (0..100) on the node, and the mean used share of their devices
        there (None when the pod asks for no device the node has)."""
        device_scores: list[float] = []
        utilization: list[float] = []
        for plugin in routes:
            state = record.states.get(plugin) if plugin else None
            if state is None:
                continue
            try:
                prepared = self.plan(pod).prepared.get(plugin)
                score = self.plugins.call(plugin, "kubegpu_scheduler_score", state=state, pod=pod, prepared=prepared)
            except PluginHookError as exc:
                log.error("node %s: %s", record.name, exc)
                score = 0.0
            device_scores.append(min(100.0, max(0.0, float(score or 0.0))))
            utilization.append(record.headroom[plugin].utilization)
        device_score = sum(device_scores) / len(device_scores) if device_scores else 0.0
        return device_score, (sum(utilization) / len(utilization) if utilization else None)

    def _score(self, record: NodeRecord, pod: PodRequest, routes: dict[str, list[str]]) -> float:
        device_score, used = self._device_scores(record, pod, routes)
        if used is None:
            allocatable = record.info.allocatable.get("cpu", 0)
            used = record.used["cpu"] / allocatable if allocatable else 0.0
        policy_score = 100.0 * (used if self.policy == "binpack" else 1.0 - used)
        return device_score + policy_score

    def _local_scores(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> tuple[float, ...]:
        """The raw scores that depend only on the node and the pod's spec (`scores`: BalancedAllocation,
        NodeAffinity, TaintToleration, the policy, the devices), remembered per node version and pod signature."""
        memo = record.last_raw
        remembered = memo.get(id(plan.local))
        if remembered is not None and remembered[0] == record.version and remembered[1] is plan.local:
            return remembered[2]
        info = record.info
        cpu, memory = scores.nonzero_requests(pod)
        cpu, memory = cpu + record.nonzero_cpu, memory + record.nonzero_memory
        cpu_capacity, memory_capacity = info.allocatable.get("cpu", 0), info.allocatable.get("memory", 0)
        device_score, used = self._device_scores(record, pod, self._route(pod))
        binpack = self.policy == "binpack"
        if used is not None:
            policy = 100.0 * (used if binpack else 1.0 - used)
        else:
            allocated = scores.most_allocated if binpack else scores.least_allocated
            policy = float((allocated(cpu, cpu_capacity) + allocated(memory, memory_capacity)) // 2)
        raw = (
            float(scores.balanced_allocation(cpu, memory, cpu_capacity, memory_capacity)),
            float(scores.node_affinity_raw(pod, info.name, info.labels)) if pod.preferred_node_affinity else 0.0,
            float(scores.taint_raw(pod, info.taints)) if info.name in self._soft_tainted else 0.0,
            policy,
            device_score,
        )
        make_room(memo, id(plan.local))
        memo[id(plan.local)] = (record.version, plan.local, raw)
        return raw

    def _rank(self, feasible: list[str], pod: PodRequest, plan: Plan) -> str:
        """kube-scheduler's score phase over the feasible nodes: every enabled plugin's raw scores normalized over
        them and weighed (`kubegpu.scheduler.scores`); the best node, the first in candidate order on a tie."""
        profile, nodes = self.scoring, self.nodes
        records = [nodes[name] for name in feasible]
        local = [self._local_scores(record, pod, plan) for record in records]
        weighed: list[list[float]] = []  # each plugin's weighed scores, in plugin order; summed per node at the end

        def add(plugin: str, values: Iterable[float]) -> None:
            column = values if isinstance(values, list) else list(values)
            if min(column) == max(column):
                return  # the same for every node: it cannot change which node is best
            weight = profile.weight(plugin)
            weighed.append(column if weight == 1 else [weight * value for value in column])

        columns = (
            (scores.BALANCED, None),
            (scores.NODE_AFFINITY, False),
            (scores.TAINTS, True),
            (scores.policy_plugin(self.policy), None),
            (scores.DEVICES, None),
        )
        for column, (plugin, reverse) in enumerate(columns):
            if profile.weight(plugin):
                values = [raw[column] for raw in local]
                if min(values) == max(values):
                    continue  # normalized alike too
                add(plugin, values if reverse is None else scores.normalize_default(values, reverse=reverse))
        preferred = bool(pod.preferred_affinity or pod.preferred_anti_affinity)
        if profile.weight(scores.INTER_POD_AFFINITY) and (preferred or self._drawn(pod)):
            table = podindex.affinity_scores(pod, self._placed, self._labels, profile.hard_pod_affinity_weight)
            if table:
                raw_scores = scores.affinity_raws(table, [record.info.labels for record in records])
                if min(raw_scores) != max(raw_scores):  # else normalized alike too
                    add(scores.INTER_POD_AFFINITY, scores.normalize_affinity(raw_scores))
        soft = plan.soft_spread  # the pod's own or, when it has none, the defaults its owners give it
        if profile.weight(scores.SPREAD) and soft:
            state = podindex.spread_scores(
                pod,
                self._placed,
                [(record.name, record.info.labels) for record in records],
                self._spread_domains(pod, soft),
                soft,
            )
            if state is not None:
                raw_scores = scores.spread_raws(state, pod, [(r.name, r.info.labels) for r in records])
                add(scores.SPREAD, scores.normalize_spread(raw_scores, [r.name in state.ignored for r in records]))
        # NodePreferAvoidPods and ImageLocality, used as they are; skipped where every node would score alike.
        avoiding = self._avoiding(pod)
        if avoiding is not None and profile.weight(scores.PREFER_AVOID):
            none: frozenset[tuple[str, str]] = frozenset()
            avoided = [scores.prefer_avoid_score(avoiding, self._avoid.get(r.name, none)) for r in records]
            add(scores.PREFER_AVOID, map(float, avoided))
        images = self._listed_images(pod)
        if images and profile.weight(scores.IMAGE_LOCALITY):
            listed, count = self._image_nodes, len(nodes)
            held = [scores.image_locality(images, r.info.images, listed, count) for r in records]
            add(scores.IMAGE_LOCALITY, map(float, held))
        if not weighed:
            return feasible[0]
        totals = list(map(sum, zip(*weighed, strict=True))) if len(weighed) > 1 else weighed[0]
        return feasible[max(range(len(records)), key=totals.__getitem__)]

    def _avoiding(self, pod: PodRequest) -> tuple[str, str] | None:
        """The pod's controller (kind, UID) when some node's preferAvoidPods names it (NodePreferAvoidPods), else
        None."""
        if not self._avoided:
            return None
        key = scores.avoidance_key(pod)
        return key if key is not None and self._avoided[key] > 0 else None

    def _listed_images(self, pod: PodRequest) -> tuple[str, ...]:
        """The pod's images, normalized, when some node lists one of them (ImageLocality), else ()."""
        if not self._image_nodes or not pod.images:
            return ()
        images = tuple(scores.normalized_image(image) for image in pod.images)
        return images if any(image in self._image_nodes for image in images) else ()

    def _images_matter(self, pod: PodRequest) -> bool:
        """Whether ImageLocality may tell nodes apart for the pod: one of its images is listed by some nodes but not
        all, or by all at different sizes, and what the nodes could hold of them, scaled as the score scales it,
        passes the score's floor."""
        images = self._listed_images(pod)
        if not images or not self.scoring.weight(scores.IMAGE_LOCALITY):
            return False
        total = len(self.nodes)
        counts = [self._image_nodes[image] for image in images]
        sizes = [self._image_sizes.get(image) or Counter() for image in images]
        if all(c == 0 or (c == total and len(s) == 1) for c, s in zip(counts, sizes, strict=True)):
            return False
        most = sum(int(max(s, default=0) * (c / total)) for s, c in zip(sizes, counts, strict=True))
        return most > scores.IMAGE_FLOOR

    def _drawn(self, pod: PodRequest) -> bool:
        """Whether an affinity term of a placed pod selects `pod` (so that InterPodAffinity scores it)."""
        return self._placed.drawn(pod)

    def _sample_size(self, pod: PodRequest, plan: Plan) -> int:
        """How many feasible nodes to find before scoring. Without preferences the candidates come in policy order,
        best first, so `sample` do; when scores read labels, taints or other pods (or a configuration sets
        `percentageOfNodesToScore`), as many as kube-scheduler finds."""
        percentage = self.scoring.percentage_of_nodes_to_score
        if (
            percentage
            or pod.preferred_node_affinity
            or pod.preferred_affinity
            or pod.preferred_anti_affinity
            or self._drawn(pod)
            or self._soft_tainted
            or plan.soft_spread
            or (self._avoiding(pod) is not None and self.scoring.weight(scores.PREFER_AVOID))
            or self._images_matter(pod)
        ):
            return max(self.sample, scores.feasible_to_find(len(self.nodes), percentage))
        return self.sample

    def score_node(self, name: str, pod: PodRequest, plan: Plan | None = None) -> float:
        """The device score (0..200) of a node that passed the filter: plugin topology score plus the policy score
        (the extender's prioritize: kube-scheduler adds its own scores; `schedule` ranks with every score plugin).

        Remembered like `check`'s answer, per node version and pod signature.
        """
        record = self.nodes[name]
        signature = (plan or self.plan(pod)).signature
        remembered = record.last_score
        if remembered is not None and remembered[0] == record.version and remembered[1] is signature:
            return remembered[2]
        score = self._score(record, pod, self._route(pod))
        record.last_score = (record.version, signature, score)
        return score
