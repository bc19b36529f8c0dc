"""The rules a plugin adds through `kubegpu_scheduler_rules`, guarded: each `FilterRule` becomes a `NodeFilter`,
each `ScoreRule` a local `ScorePlugin`, and a rule that raises or answers what its contract does not allow costs only
itself. An embedder's own rules (`Engine(filters=..., score_plugins=..., pre_enqueue=...)`) are guarded alike
(`guard_embedders`), their failures counted under `embedder`; a PreEnqueue rule that fails keeps its pod out of the
queue with a reason naming it. `SystemExit` is caught too (`PLUGIN_ERRORS`): a rule's library that exits on a bad
setting must not end the scheduler.

A filter that fails refuses the node with an error naming the plugin and the rule (a policy a rule holds must not
fail open); a score that fails scores the node 0. Either failure is counted per plugin and rule
(`KubegpuPluginManager.failed`, the custom scheduler's `kubegpu_scheduler_plugin_failures_total`) and logged once
per rule; every other rule and plugin keeps working. A rule named like a built-in rule, or like a rule added before
it, is left out with an error naming it; so is a plugin whose hook fails.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from numbers import Real

from kubegpu.core import plugin_manager
from kubegpu.core.answers import WrongAnswer, rule_filter_answer, rule_score_answer
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import PLUGIN_ERRORS, KubegpuPluginManager, PluginHookError
from kubegpu.core.scheduler_hooks import FilterRule, ScoreRule
from kubegpu.core.status import Status
from kubegpu.core.text import safe_text
from kubegpu.scheduler.engine.framework import (
    FilterContext,
    NodeFilter,
    PreEnqueuePlugin,
    ScoreContext,
    ScorePlugin,
)
from kubegpu.scheduler.engine.records import NodeRecord, Plan, log

RULES_HOOK = "kubegpu_scheduler_rules"
EMBEDDER = "embedder"  # whose failures an embedder's rules count under (`KubegpuPluginManager.failed`)


class GuardedFilter:
    """A plugin's `FilterRule` as a node filter: asked for every pod, after kube-scheduler's node filters."""

    reads_usage = False

    def __init__(self, plugins: KubegpuPluginManager, plugin: str, rule: FilterRule) -> None:
        self.plugins, self.plugin, self.rule, self.name = plugins, plugin, rule, rule.name
        self.where = f"rule {rule.name} (filter)"

    def applies(self, pod: PodRequest) -> bool:
        return True

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        began = time.perf_counter()
        try:
            return rule_filter_answer(self.rule.filter(record.info, pod))
        except PLUGIN_ERRORS as exc:
            error = _failed(self.plugins, self.plugin, self.where, exc)
            return Status.error(str(error), plugin=self.plugin)
        finally:
            _timed(self.plugins, self.plugin, self.where, began)


class GuardedScore:
    """A plugin's `ScoreRule` as a local score plugin: its raw score is used as it is."""

    local = True

    def __init__(self, plugins: KubegpuPluginManager, plugin: str, rule: ScoreRule) -> None:
        self.plugins, self.plugin, self.rule, self.name = plugins, plugin, rule, rule.name
        self.where = f"rule {rule.name} (score)"

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return True

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        return True

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        out = []
        for record in records:
            began = time.perf_counter()
            try:
                out.append(rule_score_answer(self.rule.score(record.info, pod)))
            except PLUGIN_ERRORS as exc:
                _failed(self.plugins, self.plugin, self.where, exc)
                out.append(0.0)
            _timed(self.plugins, self.plugin, self.where, began)
        return out

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return raw


class EmbedderFilter:
    """An embedder's `NodeFilter`, guarded: one that fails refuses the node to that pod with an error naming the
    rule (a policy must not fail open); a PreFilter (`applies`) that fails lets the filter be asked."""

    def __init__(self, plugins: KubegpuPluginManager, rule: NodeFilter) -> None:
        self.plugins, self.rule, self.name, self.reads_usage = plugins, rule, rule.name, rule.reads_usage
        self.where = f"rule {rule.name} (filter)"

    def applies(self, pod: PodRequest) -> bool:
        try:
            return bool(self.rule.applies(pod))
        except PLUGIN_ERRORS as exc:
            _failed(self.plugins, EMBEDDER, self.where, exc)
            return True

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None:
        return _status_answer(self, lambda: self.rule.filter(engine, record, pod, plan))


class EmbedderScore:
    """An embedder's `ScorePlugin`, guarded: one that fails scores the pod's nodes 0 (its PreScore: skipped, every
    node alike), counted and logged once."""

    def __init__(self, plugins: KubegpuPluginManager, rule: ScorePlugin) -> None:
        self.plugins, self.rule, self.name, self.local = plugins, rule, rule.name, rule.local
        self.where = f"rule {rule.name} (score)"

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        try:
            return bool(self.rule.matters(engine, pod, plan))
        except PLUGIN_ERRORS as exc:
            _failed(self.plugins, EMBEDDER, self.where, exc)
            return False

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        try:
            return self.rule.prescore(engine, pod, plan)
        except PLUGIN_ERRORS as exc:
            _failed(self.plugins, EMBEDDER, self.where, exc)
            return None

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        return self._checked(lambda: self.rule.score(engine, state, records, pod, plan), len(records))

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return self._checked(lambda: self.rule.normalize(state, raw), len(raw))

    def _checked(self, answer: Callable[[], Iterable[float]], count: int) -> list[float]:
        """The rule's `count` scores, or 0 for every node where it fails or answers no finite number for each."""
        try:
            scored = list(answer())
        except PLUGIN_ERRORS as exc:
            _failed(self.plugins, EMBEDDER, self.where, exc)
            return [0.0] * count
        wrong = _wrong_scores(scored, count)
        if wrong is not None:
            _failed(self.plugins, EMBEDDER, self.where, wrong)
            return [0.0] * count
        return scored


def _wrong_scores(scores: list[float], count: int) -> WrongAnswer | None:
    """Why a score plugin's answer is not `count` finite numbers (None when it is): a None or a string among them
    ended the engine's cycle comparing them, a NaN or infinity decided the node."""
    if len(scores) != count:
        return WrongAnswer(f"returned {len(scores)} scores for {count} nodes")
    for value in scores:
        if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value):
            return WrongAnswer(f"returned {safe_text(repr(value), 60)} ({type(value).__name__}); finite numbers")
    return None


class EmbedderPreEnqueue:
    """An embedder's `PreEnqueuePlugin`, guarded: one that fails keeps its pod out of the queue, with a reason naming
    the rule, until an update to the pod lets every rule answer (as a gate would)."""

    def __init__(self, plugins: KubegpuPluginManager, rule: PreEnqueuePlugin) -> None:
        self.plugins, self.rule, self.name = plugins, rule, rule.name
        self.where = f"rule {rule.name} (preEnqueue)"

    def pre_enqueue(self, pod: PodRequest) -> Status | None:
        return _status_answer(self, lambda: self.rule.pre_enqueue(pod))


def _status_answer(guard: EmbedderFilter | EmbedderPreEnqueue, answer: Callable[[], object]) -> Status | None:
    """An embedder rule's answer (None or a Status: `rule_filter_answer`), or an error Status naming the rule where
    it fails or answers anything else, counted and logged once."""
    try:
        return rule_filter_answer(answer())
    except PLUGIN_ERRORS as exc:
        return Status.error(safe_text(str(_failed(guard.plugins, EMBEDDER, guard.where, exc))), plugin=guard.name)


def guard_embedders(
    plugins: KubegpuPluginManager,
    filters: Sequence[NodeFilter],
    score_plugins: Sequence[ScorePlugin],
    pre_enqueue: Sequence[PreEnqueuePlugin],
) -> tuple[tuple[NodeFilter, ...], tuple[ScorePlugin, ...], tuple[PreEnqueuePlugin, ...]]:
    """An embedder's rules, each guarded (`EmbedderFilter`, `EmbedderScore`, `EmbedderPreEnqueue`)."""
    return (
        tuple(EmbedderFilter(plugins, rule) for rule in filters),
        tuple(EmbedderScore(plugins, rule) for rule in score_plugins),
        tuple(EmbedderPreEnqueue(plugins, rule) for rule in pre_enqueue),
    )


def _timed(plugins: KubegpuPluginManager, plugin: str, where: str, began: float) -> None:
    """Report a plugin's rule call that began at `began` (`time.perf_counter`) if it took longer than a hook may
    (`KubegpuPluginManager.slow`): the engine waits for each, so every pod waits meanwhile."""
    if (took := time.perf_counter() - began) > plugin_manager.SLOW_HOOK_SECONDS:
        plugins.slow(plugin, where, took)


def _failed(plugins: KubegpuPluginManager, plugin: str, where: str, exc: BaseException) -> PluginHookError:
    error = plugins.failed(plugin, where, exc)
    plugins.warn_once(plugin, where, f"{error} (counted; logged once per rule)")
    return error


def plugin_rules(
    plugins: KubegpuPluginManager, taken: set[str]
) -> tuple[tuple[NodeFilter, ...], tuple[ScorePlugin, ...]]:
    """Every plugin's `kubegpu_scheduler_rules`, guarded; `taken` are the names already in use (a filter's and a
    score's names are separate, as in a profile). A rule whose name is taken is left out, logged."""
    node_filters: list[NodeFilter] = []
    score_plugins: list[ScorePlugin] = []
    filter_names, score_names = set(taken), set(taken)
    for plugin in plugins.names:
        if not plugins.implements(plugin, RULES_HOOK):
            continue
        try:
            rules = plugins.call(plugin, RULES_HOOK)
        except PluginHookError as exc:
            log.error("%s; its rules are left out", exc)
            continue
        for rule in rules:
            for method, names in (("filter", filter_names), ("score", score_names)):
                if not callable(getattr(rule, method, None)):
                    continue
                if rule.name in names:
                    log.error("plugin %r: its %s rule %r is left out: the name is taken", plugin, method, rule.name)
                    continue
                names.add(rule.name)
                if method == "filter":
                    node_filters.append(GuardedFilter(plugins, plugin, rule))
                else:
                    score_plugins.append(GuardedScore(plugins, plugin, rule))
    return tuple(node_filters), tuple(score_plugins)


def rule_names(plugins: KubegpuPluginManager) -> tuple[frozenset[str], frozenset[str]]:
    """The names of the filter rules and of the score rules plugins add, for a configuration file that names them
    (`config.RuleNames`); a plugin whose hook fails adds none (the engine logs it when it is built)."""
    filters: set[str] = set()
    scores: set[str] = set()
    for plugin in plugins.names:
        if not plugins.implements(plugin, RULES_HOOK):
            continue
        try:
            rules = plugins.call(plugin, RULES_HOOK)
        except PluginHookError:
            continue
        for rule in rules:
            name = getattr(rule, "name", None)
            if not isinstance(name, str):
                continue
            if callable(getattr(rule, "filter", None)):
                filters.add(name)
            if callable(getattr(rule, "score", None)):
                scores.add(name)
    return frozenset(filters), frozenset(scores)
