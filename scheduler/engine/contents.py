"""What the local score plugins read of a node (`scoring_content`), and each node's content numbered, kept current
from the change log (`_numbers_now`): nodes alike in it share one computation of a shape's raw scores
(`Scoring._local_raw`) and of its filter answers (`Sampling._content_number`). Also the device plugins' own scores
of a node that the local score plugins read (`device_scores`, `fragmentation_scores`), each plugin's hook called
through `KubegpuPluginManager.bound`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import PLUGIN_ERRORS, PluginHookError
from kubegpu.scheduler.engine.filtering import STATE_POD_PREPARED, Filtering
from kubegpu.scheduler.engine.records import FRAGMENTATION_HOOK, NodeRecord, Plan, log

SCORE_HOOK = "kubegpu_scheduler_score"
_FRAGMENTATION_NAMES = ("state", "pod", "prepared", "free")
_UNASKED: Any = object()
CONTENTS_REMEMBERED = 1 << 16  # contents numbered, entries of `_contents`, of a shape's `by_number`: past it, dropped


class Contents(Filtering):
    """Nodes' contents as the local scores read them, numbered."""

    def _numbers_now(self) -> dict[str, int | None]:
        """Each node's scoring content's number now (`memos.ScoreNumbers`; None: the node is scored alone), kept
        current from the change log: only the nodes it names since the last call are numbered again."""
        book = self._score_numbers
        generation = self.generation
        if book.generation == generation:
            return book.by_name
        changed: Iterable[str] | None = self.changed_since(book.generation) if book.generation >= 0 else None
        numbers, by_name, nodes = book.numbers, book.by_name, self.nodes
        if changed is None or len(numbers) + len(nodes) > CONTENTS_REMEMBERED:
            numbers.clear()
            by_name.clear()
            book.epoch += 1
            changed = nodes.keys()
        for name in changed:
            record = nodes.get(name)
            if record is None:
                by_name.pop(name, None)
                continue
            content = self.scoring_content(record)
            by_name[name] = None if content is None else numbers.setdefault(content, len(numbers))
        book.generation = generation
        return by_name

    def scoring_content(self, record: NodeRecord) -> tuple[object, ...] | None:
        """What the local score plugins read of a node besides its name: its class (`NodeCache._klass`: labels but
        the hostname, allocatable, taints), its usage, and each of its device plugins' states' `scoring_content()`
        (a plugin state that has none, or whose content is the state itself, `(state,)`, is scored alone: None; the
        state's identity stays one key while its books change, so answers remembered by it went stale). Remembered
        per node version (`_contents`)."""
        known = self._contents.get(record.name)
        if known is not None and known[0] is record and known[1] == record.version:
            return known[2]
        parts: list[tuple[str, object]] | None = []
        for plugin, state in record.states.items():
            method = getattr(state, "scoring_content", None)
            if method is None:
                parts = None
                break
            try:
                part = method()
                hash(part)  # numbered by `_numbers_now`: a plugin's list (of its holders, say) cannot be one
                if type(part) is tuple and len(part) == 1 and part[0] is state:
                    parts = None  # the state is its own content (the kit's shared books): one key while it changes
                    break
            except PLUGIN_ERRORS as exc:  # a plugin's own method: it costs its node the sharing, not the cycle
                log.error("node %s: plugin %s: scoring_content() is no key, the node is scored alone: %r",
                          record.name, plugin, exc)  # fmt: skip
                parts = None
                break
            parts.append((plugin, part))  # type: ignore[union-attr]  # a list until None
        content = None
        if parts is not None:
            content = (
                record.klass,
                tuple(sorted(record.used.items())),
                record.nonzero_cpu,
                record.nonzero_memory,
                tuple(parts),
            )
        if len(self._contents) >= CONTENTS_REMEMBERED:
            self._contents.clear()
        self._contents[record.name] = (record, record.version, content)
        return content

    # -- the device plugins' scores of a node, which the local score plugins read ---------------------------------

    def device_score(self, record: NodeRecord, pod: PodRequest) -> float:
        """The device plugins' mean topology score (0..100) on the node (KubegpuDevices); 0 when the pod asks for no
        device the node has. A plugin that fails scores 0, logged naming it."""
        return self.device_scores((record,), pod)[0]

    def device_scores(self, records: Sequence[NodeRecord], pod: PodRequest) -> list[float]:
        """`device_score` on each node, the pod's plugins and their `prepared` looked up once."""
        routes = [plugin for plugin in self._route(pod) if plugin]
        prepared, out = self.plan(pod).prepared if routes else {}, []
        bound = self.plugins.bound
        calls = [(plugin, bound(plugin, SCORE_HOOK, STATE_POD_PREPARED), prepared.get(plugin)) for plugin in routes]
        if len(calls) == 1:  # the mean of one score: the score, as the loop below makes it
            plugin, call, ask = calls[0]
            for record in records:
                state = record.states.get(plugin)
                if state is None:
                    out.append(0.0)
                    continue
                try:
                    score = float(call(state, pod, ask) or 0.0)
                except PluginHookError as exc:
                    log.error("node %s: %s", record.name, exc)
                    score = 0.0
                out.append(100.0 if score > 100.0 else score if score > 0.0 else 0.0)
            return out
        for record in records:
            states = record.states
            device_scores: list[float] = []
            for plugin, call, ask in calls:
                state = states.get(plugin)
                if state is None:
                    continue
                try:
                    score = call(state, pod, ask)
                except PluginHookError as exc:
                    log.error("node %s: %s", record.name, exc)
                    score = 0.0
                device_scores.append(min(100.0, max(0.0, float(score or 0.0))))
            out.append(sum(device_scores) / len(device_scores) if device_scores else 0.0)
        return out

    def device_usage(self, record: NodeRecord, pod: PodRequest) -> float | None:
        """The mean used share (0..1) of the node's devices of the plugins the pod asks for (the policy's score);
        None when the pod asks for no device the node has."""
        utilization = [
            record.headroom[plugin].utilization for plugin in self._route(pod) if plugin and plugin in record.states
        ]
        return sum(utilization) / len(utilization) if utilization else None

    def fragmentation_score(self, record: NodeRecord, pod: PodRequest, plan: Plan) -> float:
        """KubegpuFragmentation's raw score (0..100): 100 x sigmoid(-d), d the devices the pod would strand on the node
        summed over the plugins with a state there (`kubegpu_scheduler_fragmentation`; a cpu-only pod included), as
        the FGD paper scores: 50 for none, 27 for one more, 73 for one fewer, every difference kept in order."""
        return self.fragmentation_scores((record,), pod, plan)[0]

    def fragmentation_scores(self, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan) -> list[float]:
        """`fragmentation_score` on each node, which plugins measure asked once per plugin."""
        # Per plugin: its fragmentation hook (`bound`) and prepared request, or None where it measures none.
        measures: dict[str, tuple[Callable[..., Any], object] | None] = {}
        prepared = plan.prepared
        out = []
        exp = math.exp
        for record in records:
            states = record.states
            if not states:
                out.append(50.0)
                continue
            allocatable, used = record.info.allocatable, record.used
            free = {
                "cpu": allocatable.get("cpu", 0) - used["cpu"],
                "memory": allocatable.get("memory", 0) - used["memory"],
            }
            stranded = 0.0
            for plugin, state in states.items():
                measure = measures.get(plugin, _UNASKED)
                if measure is _UNASKED:
                    measure = measures[plugin] = (
                        (self.plugins.bound(plugin, FRAGMENTATION_HOOK, _FRAGMENTATION_NAMES), prepared.get(plugin))
                        if self.plugins.implements(plugin, FRAGMENTATION_HOOK)
                        else None
                    )
                if measure is None:
                    continue
                try:
                    grown = measure[0](state, pod, measure[1], free)
                except PluginHookError as exc:
                    log.error("node %s: %s", record.name, exc)
                    continue
                if grown:
                    stranded += grown
            out.append(100.0 / (1.0 + exp(stranded if stranded < 50.0 else 50.0)))
        return out
