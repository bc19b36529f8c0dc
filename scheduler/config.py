"""`--config FILE`: kube-scheduler's KubeSchedulerConfiguration, read for what kubegpu's engine can honour.

`kubegpu scheduler --config FILE` and `kubegpu simulate --config FILE` read the same file, so a profile tried in the
simulator behaves the same live. Four versions are read, each as the kube-scheduler that has it reads it, with one
profile: `kubescheduler.config.k8s.io/v1beta1` (1.20), `v1beta2`, `v1beta3` and `v1` (1.25 on; a file a 1.34
kube-scheduler writes with `--write-config-to` is its default profile here). In v1beta1:

```yaml
apiVersion: kubescheduler.config.k8s.io/v1beta1
kind: KubeSchedulerConfiguration
percentageOfNodesToScore: 50          # optional; 0 or absent: kube-scheduler's adaptive default
podInitialBackoffSeconds: 1           # optional, the queue's backoff
podMaxBackoffSeconds: 10
profiles:
- schedulerName: kubegpu-scheduler    # optional; --scheduler-name wins when given
  plugins:
    score:
      disabled: [{name: NodeResourcesBalancedAllocation}]      # or [{name: "*"}] for all of them
      enabled: [{name: NodeAffinity, weight: 5}, {name: NodeResourcesLeastAllocated}]
    filter:
      disabled: [{name: NodePorts}]
  pluginConfig:
  - name: InterPodAffinity
    args: {hardPodAffinityWeight: 2}
  - name: PodTopologySpread           # constraints for pods that set none (selectors: from the pod's owners)
    args:
      defaultConstraints: [{maxSkew: 2, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]
  - name: KubegpuDevices              # how a node's shared GPUs are chosen: fgd (default) or bestfit
    args: {sharePolicy: bestfit}
  - name: KubegpuFragmentation        # the pods to expect, instead of the mix learned from the pods placed
    args:
      mix: [{gpus: 1, gpuMilli: 500, cpuMilli: 4000, weight: 3}, {gpus: 8, cpuMilli: 64000, weight: 1}]
```

Plugins merge as kube-scheduler merges them: the defaults (`kubegpu.scheduler.scores.DEFAULT_WEIGHTS` and the policy's
plugin) minus the disabled ones, an enabled default taking the weight given, then the other enabled ones. Enabling
NodeResourcesMostAllocated or NodeResourcesLeastAllocated chooses the policy (binpack or spread) and replaces the other;
`--policy`, when given too, must agree. Plugin names kubegpu does not know are refused; kube-scheduler plugins kubegpu
does not implement (SelectorSpread, RequestedToCapacityRatio, NodeLabel, ...) may be disabled, never enabled; its
default filters kubegpu has nothing to run for (volume limits and zones, NodeName) may be named in either list, as the
file kube-scheduler writes names them. PodTopologySpread's `defaultConstraints` and `defaultingType` read as 1.20 reads
them with DefaultPodTopologySpread on: without `defaultingType`, an empty list means `System` (kube-scheduler's
defaults, `scores.SYSTEM_DEFAULT_SPREAD`) and a list means `List`; `defaultingType: List` with no constraints turns
defaulting off. `queueSort` names the one QueueSort plugin (PrioritySort, kubegpu's only one: disabling it without
enabling another is refused as kube-scheduler refuses it, "no queue sort plugin is enabled", and a file whose profiles
differ in it with "has to match for all profiles"); from v1beta2 on `preEnqueue` may disable SchedulingGates (a gated
pod is then tried, and a 1.26+ API server refuses its Binding, as behind kube-scheduler). The other extension points
(preFilter, bind, ...) and client settings (clientConnection, leaderElection, ...) are accepted and ignored: kubegpu
has its own flags for those. The rules installed plugins add (`kubegpu_scheduler_rules`) are named like
kube-scheduler's plugins: a filter rule in `filter` (on unless disabled), a score rule in `score` with its weight
(1 unless given); the caller passes their names (`RuleNames`), and any other name is refused. Every error names the
field: `profiles[0].plugins.score.enabled[1].name: unknown score plugin 'NodeAfinity'`.

From v1beta2 on, NodeResourcesFit scores too: its `scoringStrategy` type MostAllocated chooses binpack and
LeastAllocated spread (at NodeResourcesFit's score weight), and the Least/MostAllocated and RequestedToCapacityRatio
plugins are gone. v1beta2 merges each extension point with its defaults (1.20's weights, NodePreferAvoidPods no
longer among them). v1beta3 and v1 list the defaults once, in `multiPoint` (TaintToleration 3, NodeAffinity 2,
PodTopologySpread 2, InterPodAffinity 2, NodeResourcesFit, NodeResourcesBalancedAllocation and ImageLocality 1,
kubegpu's KubegpuDevices 1), and a plugin enabled or disabled at `score` or `filter` overrides its `multiPoint`
entry; a weight absent or 0 is 1, as kube-scheduler's framework reads it. PodTopologySpread's `defaultingType`
defaults to System, which takes no list. NodePreferAvoidPods and SelectorSpread are gone from v1beta3, EBSLimits,
GCEPDLimits, AzureDiskLimits and CinderLimits from v1: naming one is refused, as is an argument kubegpu does not
implement (NodeAffinity `addedAffinity`, NodeResourcesFit `ignoredResources`/`ignoredResourceGroups`, a
RequestedToCapacityRatio strategy, resources other than cpu and memory in equal parts, InterPodAffinity
`ignorePreferredTermsOfExistingPods: true`, VolumeBinding `shape`): never accepted and ignored. DefaultPreemption's
candidate counts and VolumeBinding's `bindTimeoutSeconds` are validated and have nothing to change in kubegpu
(its preemption weighs every node; it binds no volumes).
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, cast, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

from kubegpu.core.errors import InputError, describe_validation_error, shorten
from kubegpu.core.models import SpreadConstraint
from kubegpu.scheduler import scores

__all__ = ["ConfigError", "RuleNames", "SchedulerConfig", "load_config", "load_topology", "parse_config"]

GROUP = "kubescheduler.config.k8s.io"
V1BETA1, V1BETA2, V1BETA3, V1 = (f"{GROUP}/{v}" for v in ("v1beta1", "v1beta2", "v1beta3", "v1"))
VERSIONS = (V1BETA1, V1BETA2, V1BETA3, V1)
API_VERSION = V1BETA1
# A label name: an optional DNS subdomain prefix and `/`, then up to 63 alphanumerics, `-`, `_`, `.` (alphanumeric at
# both ends).
_LABEL_NAME = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
KIND = "KubeSchedulerConfiguration"
MAX_CONFIG_BYTES = 1 << 20
INT32_MAX = 2**31 - 1

Policy = Literal["binpack", "spread"]


class ConfigError(InputError):
    """A configuration file kubegpu cannot use; the message names the file and the field."""


class _Strict(BaseModel):
    # kube-scheduler decodes its configuration strictly: an unknown field, `true`, `"16"` or `16.0` for an integer
    # and `"true"` for a boolean stop it, naming the field; a float field takes an integer (JSON's numbers).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    _unnamed_ignored: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _null_is_omitted(cls, data: Any) -> Any:
        """A field set to `null` is left as omitted (Go's encoding/json leaves a field alone on `null`, or sets a
        pointer, map or slice to nil, which defaulting then fills); an unknown field is refused whatever its value.
        A `null` list item is the item left empty (`{}`, `""`, `0`, `false`): the decoder leaves a new item its zero
        value on `null`, so `profiles: [null]` is one default profile, and an item refused empty is refused so. An
        item of no name in a list of `_unnamed_ignored` (a disabled plugin of no name) changes nothing in
        kube-scheduler: it is dropped."""
        if not isinstance(data, dict):
            return data
        if None in data.values():
            data = {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}
        for name in cls._unnamed_ignored:
            items = data.get(name)
            if isinstance(items, list) and any(map(_unnamed, items)):
                data = {**data, name: [item for item in items if not _unnamed(item)]}
        for name, zero in _list_zeros(cls).items():
            items = data.get(name)
            if isinstance(items, list) and any(item is None for item in items):
                data = {**data, name: [zero() if item is None else item for item in items]}
        return data


def _unnamed(item: Any) -> bool:
    """A list item of no name as kube-scheduler decodes it: `null`, or an object whose `name` is absent, `null` or
    empty."""
    return item is None or (isinstance(item, dict) and item.get("name") in (None, ""))


_ZEROS: dict[type[BaseModel], dict[str, Callable[[], Any]]] = {}


def _list_zeros(model: type[BaseModel]) -> dict[str, Callable[[], Any]]:
    """The model's list fields, each with a maker of its items' zero value (an empty object for a model)."""
    zeros = _ZEROS.get(model)
    if zeros is None:
        zeros = {}
        for name, info in model.model_fields.items():
            lists = [a for a in (info.annotation, *get_args(info.annotation)) if get_origin(a) is list]
            if lists:
                (item,) = get_args(lists[0])
                model_item = isinstance(item, type) and issubclass(item, BaseModel)
                zeros[name] = (
                    dict if model_item else {str: str, int: int, float: float, bool: bool}.get(item, type(None))
                )
        _ZEROS[model] = zeros
    return zeros


# ---------------------------------------------------------------------------------------------------------------
# The document, per version
# ---------------------------------------------------------------------------------------------------------------


class _Named(_Strict):
    name: str = Field(min_length=1)


class _Plugin(_Named):
    # kube-scheduler bounds a weight only by int32 and the total score's int64: 1.20's `--write-config-to` writes
    # NodePreferAvoidPods' 10000, and `weight: 0` (absent: the default weight) for the plugins that do not score.
    weight: int | None = Field(default=None, ge=0, le=INT32_MAX)


class _PluginSet(_Strict):
    _unnamed_ignored = ("disabled",)
    enabled: list[_Plugin] = Field(default_factory=list)
    disabled: list[_Plugin] = Field(default_factory=list)


class _Plugins(_Strict):
    score: _PluginSet = _PluginSet()
    filter: _PluginSet = _PluginSet()
    # Accepted and ignored: kubegpu's queue, binder and preemption are its own.
    queueSort: _PluginSet | None = None
    preFilter: _PluginSet | None = None
    postFilter: _PluginSet | None = None
    preScore: _PluginSet | None = None
    reserve: _PluginSet | None = None
    permit: _PluginSet | None = None
    preBind: _PluginSet | None = None
    bind: _PluginSet | None = None
    postBind: _PluginSet | None = None


class _ModernPlugin(_Named):
    # 0 or absent: 1, as kube-scheduler's framework reads it (`--write-config-to` writes `weight: 0` for plugins
    # that do not score).
    weight: int | None = Field(default=None, ge=0, le=INT32_MAX)


class _ModernPluginSet(_Strict):
    _unnamed_ignored = ("disabled",)
    enabled: list[_ModernPlugin] = Field(default_factory=list)
    disabled: list[_ModernPlugin] = Field(default_factory=list)


class _ModernPlugins(_Strict):
    """v1beta2 and later. `multiPoint` (v1beta3 and later) is checked per version in `_modern_plugins`."""

    score: _ModernPluginSet = _ModernPluginSet()
    filter: _ModernPluginSet = _ModernPluginSet()
    multiPoint: _ModernPluginSet | None = None
    preEnqueue: _ModernPluginSet | None = None
    queueSort: _ModernPluginSet | None = None
    preFilter: _ModernPluginSet | None = None
    postFilter: _ModernPluginSet | None = None
    preScore: _ModernPluginSet | None = None
    reserve: _ModernPluginSet | None = None
    permit: _ModernPluginSet | None = None
    preBind: _ModernPluginSet | None = None
    bind: _ModernPluginSet | None = None
    postBind: _ModernPluginSet | None = None


class _PluginConfig(_Strict):
    name: str = ""  # none (`null` item, `{args: ...}`): configures nothing, as in kube-scheduler (once per profile)
    args: dict[str, Any] | None = None


class _Profile(_Strict):
    schedulerName: str | None = Field(default=None, min_length=1)
    plugins: _Plugins = _Plugins()
    pluginConfig: list[_PluginConfig] = Field(default_factory=list)


class _ModernProfile(_Strict):
    schedulerName: str | None = Field(default=None, min_length=1)
    percentageOfNodesToScore: int | None = Field(default=None, ge=0, le=100)  # v1beta3 and later
    plugins: _ModernPlugins = _ModernPlugins()
    pluginConfig: list[_PluginConfig] = Field(default_factory=list)


class _Common(_Strict):
    kind: Literal["KubeSchedulerConfiguration"]
    percentageOfNodesToScore: int = Field(default=0, ge=0, le=100)
    podInitialBackoffSeconds: int = Field(default=1, ge=1)
    podMaxBackoffSeconds: int = Field(default=10, ge=1)
    # kube-scheduler's process settings: kubegpu takes these from its flags.
    clientConnection: Any = None
    leaderElection: Any = None
    enableProfiling: Any = None
    enableContentionProfiling: Any = None
    parallelism: int | None = Field(default=None, gt=0, le=2**31 - 1)  # kube-scheduler's: a positive int32
    extenders: Any = None


class _Configuration(_Common):
    apiVersion: Literal["kubescheduler.config.k8s.io/v1beta1"]
    profiles: list[_Profile] = Field(default_factory=lambda: [_Profile()], max_length=1)
    healthzBindAddress: Any = None
    metricsBindAddress: Any = None


class _ConfigurationV1beta2(_Common):
    apiVersion: Literal["kubescheduler.config.k8s.io/v1beta2"]
    profiles: list[_ModernProfile] = Field(default_factory=lambda: [_ModernProfile()], max_length=1)
    healthzBindAddress: Any = None  # removed in v1beta3
    metricsBindAddress: Any = None


class _ConfigurationV1(_Common):
    apiVersion: Literal["kubescheduler.config.k8s.io/v1beta3", "kubescheduler.config.k8s.io/v1"]
    profiles: list[_ModernProfile] = Field(default_factory=lambda: [_ModernProfile()], max_length=1)
    delayCacheUntilActive: Any = None  # v1 (1.28)


MAX_MIX_KINDS = 256  # kinds a configured mix may list (a learned one keeps up to `nvidia.sharing.MAX_KINDS`)
MAX_MIX_GPUS = 64
MAX_MIX_CPU_MILLI = 1 << 40

# Plugin arguments. Every field kube-scheduler reads is named; one kubegpu cannot honour is refused where it is read
# (`_plugin_args`), never silently ignored.


class _Args(_Strict):
    apiVersion: str | None = None
    kind: str | None = None


class _InterPodAffinityArgs(_Args):
    hardPodAffinityWeight: int = Field(default=1, ge=0, le=100)
    ignorePreferredTermsOfExistingPods: bool = False  # v1beta3 and later (1.26)


class _DefaultConstraint(_Strict):
    maxSkew: int = Field(ge=1, le=2**31 - 1)
    topologyKey: str = Field(min_length=1, max_length=317)  # a qualified label name: prefix/name
    whenUnsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    labelSelector: Any = None


class _PodTopologySpreadArgs(_Args):
    defaultConstraints: list[_DefaultConstraint] = Field(default_factory=list, max_length=64)
    defaultingType: Literal["System", "List"] | None = None


class _NodeAffinityArgs(_Args):
    addedAffinity: Any = None


class _ResourceSpec(_Strict):
    name: str = Field(min_length=1, max_length=317)
    weight: int = Field(default=0, ge=0, le=100)  # 0: 1


class _ScoringStrategy(_Strict):
    type: Literal["LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"] = "LeastAllocated"
    resources: list[_ResourceSpec] = Field(default_factory=list, max_length=64)
    requestedToCapacityRatio: Any = None


class _NodeResourcesFitArgs(_Args):
    ignoredResources: list[str] = Field(default_factory=list)
    ignoredResourceGroups: list[str] = Field(default_factory=list)
    scoringStrategy: _ScoringStrategy | None = None  # v1beta2 and later


class _ResourcesArgs(_Args):
    """NodeResourcesBalancedAllocationArgs (v1beta2 and later), v1beta1's NodeResourcesLeast/MostAllocatedArgs."""

    resources: list[_ResourceSpec] = Field(default_factory=list, max_length=64)


class _DefaultPreemptionArgs(_Args):
    minCandidateNodesPercentage: int = Field(default=10, ge=0, le=100)
    minCandidateNodesAbsolute: int = Field(default=100, ge=0)


class _VolumeBindingArgs(_Args):
    bindTimeoutSeconds: int = Field(default=600, ge=0)
    shape: Any = None


class _DynamicResourcesArgs(_Args):
    filterTimeout: Any = None


class _DevicesArgs(_Args):
    """kubegpu's KubegpuDevices: how device plugins that share a device choose among a node's devices."""

    sharePolicy: Literal["fgd", "bestfit"] | None = None


class _MixKind(_Strict):
    """One kind of pod KubegpuFragmentation should expect: `gpus` devices (0: a cpu-only pod, which can use none
    of a node's free devices), `gpuMilli` thousandths of each (below 1000: a share of one device), `cpuMilli`
    millicores, and how often it comes relative to the others."""

    gpus: int = Field(ge=0, le=MAX_MIX_GPUS)
    gpuMilli: int = Field(default=1000, ge=1, le=1000)
    cpuMilli: int = Field(default=0, ge=0, le=MAX_MIX_CPU_MILLI)
    weight: float = Field(gt=0, le=1e9, allow_inf_nan=False, strict=False)


class _FragmentationArgs(_Args):
    """kubegpu's KubegpuFragmentation: the mix of pods to measure against instead of the one learned, whether it
    ranks first where a pod may reach shared devices (`lead`, the default) or is weighed with the other scores, and
    whether the mix learned keeps the GPU models each kind may use (`modelAccess`, off by default)."""

    mix: list[_MixKind] = Field(default_factory=list, max_length=MAX_MIX_KINDS)
    lead: StrictBool = True
    modelAccess: StrictBool = False


# ---------------------------------------------------------------------------------------------------------------
# Plugins per version
# ---------------------------------------------------------------------------------------------------------------

FIT = "NodeResourcesFit"
# v1beta2 and later score the policy through NodeResourcesFit's scoringStrategy; these plugins are gone.
RESOURCE_SCORES = frozenset({scores.MOST_ALLOCATED, scores.LEAST_ALLOCATED, "RequestedToCapacityRatio"})
# kube-scheduler's plugins with nothing to run in kubegpu: the queue, binder and preemption are kubegpu's own,
# `spec.nodeName` is always obeyed, volume limits and zones are not checked (README). They
# are in kube-scheduler's default multiPoint set, so a configuration copied from it names them.
NOTHING_TO_RUN = frozenset(
    {"DefaultPreemption", "DefaultBinder", "NodeName", "VolumeRestrictions",
     "NodeVolumeLimits", "VolumeZone", "EBSLimits", "GCEPDLimits", "AzureDiskLimits",
     "CinderLimits"}
)  # fmt: skip
# kube-scheduler's PreEnqueue and QueueSort plugins, each kubegpu's too (`kubegpu.scheduler.engine.enqueue`).
PRE_ENQUEUE_PLUGINS = (scores.SCHEDULING_GATES,)
QUEUE_SORT_PLUGINS = (scores.PRIORITY_SORT,)
QUEUE_PLUGINS = frozenset({*PRE_ENQUEUE_PLUGINS, *QUEUE_SORT_PLUGINS})
# kube-scheduler's default filters kubegpu has nothing to run for (README: volume limits and zones are not checked;
# every pod with `spec.nodeName` obeys it). NodeLabel and ServiceAffinity filter by their arguments: never moot.
DEFAULT_MOOT_FILTERS = frozenset(
    {"NodeName", "VolumeRestrictions", "EBSLimits", "GCEPDLimits", "NodeVolumeLimits", "AzureDiskLimits", "VolumeZone"}
)
# Plugins a version no longer has, with what replaced them: naming one is refused.
REMOVED: dict[str, dict[str, str]] = {
    V1BETA2: {
        scores.MOST_ALLOCATED: "use NodeResourcesFit's scoringStrategy type MostAllocated",
        scores.LEAST_ALLOCATED: "use NodeResourcesFit's scoringStrategy type LeastAllocated",
        "RequestedToCapacityRatio": "use NodeResourcesFit's scoringStrategy",
        "NodeLabel": "use NodeAffinity",
        "ServiceAffinity": "use InterPodAffinity",
    },
}
REMOVED[V1BETA3] = {
    **REMOVED[V1BETA2],
    "NodePreferAvoidPods": "use node taints (kube-scheduler removed the plugin in 1.24)",
    "SelectorSpread": "PodTopologySpread's system defaults spread the same pods",
}
REMOVED[V1] = {
    **REMOVED[V1BETA3],
    **{name: "kube-scheduler 1.34 refuses it in v1; NodeVolumeLimits covers it"
       for name in ("EBSLimits", "GCEPDLimits", "AzureDiskLimits", "CinderLimits")},
}  # fmt: skip
MODERN_SCORES = (
    scores.BALANCED, scores.NODE_AFFINITY, scores.TAINTS, scores.INTER_POD_AFFINITY, scores.SPREAD, FIT,
    scores.DEVICES, scores.FRAGMENTATION, scores.IMAGE_LOCALITY, scores.PREFER_AVOID,
)  # fmt: skip
# kube-scheduler's default score weights per version, kubegpu's device (1) and fragmentation (5) scores added.
# v1beta3 raised TaintToleration to 3 and NodeAffinity and InterPodAffinity to 2; its defaults are one multiPoint set.
V1BETA2_SCORES: Mapping[str, int] = {
    scores.BALANCED: 1, scores.IMAGE_LOCALITY: 1, scores.INTER_POD_AFFINITY: 1, FIT: 1, scores.NODE_AFFINITY: 1,
    scores.SPREAD: 2, scores.TAINTS: 1, scores.DEVICES: 1, scores.FRAGMENTATION: 5,
}  # fmt: skip
V1_MULTI_POINT: tuple[tuple[str, int], ...] = (
    ("SchedulingGates", 0), ("PrioritySort", 0), ("NodeUnschedulable", 0), ("NodeName", 0), (scores.TAINTS, 3),
    (scores.NODE_AFFINITY, 2), ("NodePorts", 0), (FIT, 1), ("VolumeRestrictions", 0), ("NodeVolumeLimits", 0),
    ("VolumeBinding", 0), ("VolumeZone", 0), ("DynamicResources", 0), (scores.SPREAD, 2),
    (scores.INTER_POD_AFFINITY, 2),
    ("DefaultPreemption", 0), (scores.BALANCED, 1), (scores.IMAGE_LOCALITY, 1), ("DefaultBinder", 0),
    (scores.DEVICES, 1), (scores.FRAGMENTATION, 5),
)  # fmt: skip


POLICY_PLUGINS: dict[str, Policy] = {scores.MOST_ALLOCATED: "binpack", scores.LEAST_ALLOCATED: "spread"}
STRATEGY_POLICIES: dict[str, Policy] = {"MostAllocated": "binpack", "LeastAllocated": "spread"}


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """What a configuration file sets: the score profile, the policy it chose (None: `--policy` decides), the
    profile's scheduler name and the queue's backoff."""

    profile: scores.Profile
    policy: Policy | None = None
    scheduler_name: str | None = None
    initial_backoff: float = 1.0
    max_backoff: float = 10.0


@dataclass(frozen=True, slots=True)
class RuleNames:
    """The names of the rules installed plugins add (`kubegpu_scheduler_rules`: `engine.rules.rule_names`): a
    profile may enable, weigh and disable them as it does kube-scheduler's own plugins."""

    filters: frozenset[str] = frozenset()
    scores: frozenset[str] = frozenset()


NO_RULES = RuleNames()


def _rule_settings(
    rules: RuleNames,
    score_sets: Sequence[_PluginSet | _ModernPluginSet],
    filter_sets: Sequence[_PluginSet | _ModernPluginSet],
) -> tuple[dict[str, int], frozenset[str], frozenset[str]]:
    """A third party's rules as the profile's sets leave them: each is on (weight 1) unless a set disables it (by name
    or `*`), a later set (an extension point's over multiPoint) overriding an earlier one. Returns the weights of
    the score rules enabled with one, the score rules off and the filter rules off."""

    def state(name: str, sets: Sequence[_PluginSet | _ModernPluginSet]) -> tuple[bool, int | None]:
        on, weight = True, None
        for plugin_set in sets:
            if "*" in {p.name for p in plugin_set.disabled} or name in {p.name for p in plugin_set.disabled}:
                on, weight = False, None
            for plugin in plugin_set.enabled:
                if plugin.name == name:
                    on, weight = True, plugin.weight
        return on, weight

    weights: dict[str, int] = {}
    scores_off: set[str] = set()
    for name in rules.scores:
        on, weight = state(name, score_sets)
        if not on:
            scores_off.add(name)
        elif weight:
            weights[name] = weight
    filters_off = {name for name in rules.filters if not state(name, filter_sets)[0]}
    return weights, frozenset(scores_off), frozenset(filters_off)


def _queue_plugins(
    queue_sort: _PluginSet | _ModernPluginSet | None,
    pre_enqueue: _ModernPluginSet | None,
    multi: Sequence[tuple[str, int | None]] | None,
    where: str,
) -> tuple[str, frozenset[str]]:
    """The QueueSort plugin and the PreEnqueue plugins turned off, merged as kube-scheduler merges them: the defaults
    (v1beta3 and v1: what `multiPoint` leaves of them) less the disabled ones, then the enabled ones. Exactly one
    QueueSort plugin must be left, as kube-scheduler requires."""
    if multi is None:
        sort_defaults: Sequence[str] = QUEUE_SORT_PLUGINS
        gate_defaults: Sequence[str] = PRE_ENQUEUE_PLUGINS
    else:
        sort_defaults = [name for name, _ in multi if name in QUEUE_SORT_PLUGINS]
        gate_defaults = [name for name, _ in multi if name in PRE_ENQUEUE_PLUGINS]
    for point, plugin_set, known in (
        ("queueSort", queue_sort, QUEUE_SORT_PLUGINS), ("preEnqueue", pre_enqueue, PRE_ENQUEUE_PLUGINS),
    ):  # fmt: skip
        if plugin_set is None:
            continue
        for list_name, plugins in (("enabled", plugin_set.enabled), ("disabled", plugin_set.disabled)):
            for i, plugin in enumerate(plugins):
                if plugin.name not in known and not (list_name == "disabled" and plugin.name == "*"):
                    raise ConfigError(
                        f"{where}.{point}.{list_name}[{i}].name: unknown {point} plugin {shorten(plugin.name)!r} "
                        f"(known: {', '.join(known)})"
                    )
    empty = _ModernPluginSet()
    sorts = [name for name, _ in _merge_set([(n, None) for n in sort_defaults], queue_sort or empty)]
    if not sorts:
        raise ConfigError(f"{where}.queueSort: no queue sort plugin is enabled")
    if len(sorts) > 1:
        raise ConfigError(f"{where}.queueSort: only one queue sort plugin can be enabled")
    gates = {name for name, _ in _merge_set([(n, None) for n in gate_defaults], pre_enqueue or empty)}
    return sorts[0], frozenset(PRE_ENQUEUE_PLUGINS) - gates


def _same_queue_sort(document: Mapping[str, Any], where: str) -> None:
    """kube-scheduler requires one QueueSort for all profiles; kubegpu reads one profile, and a file with several
    whose queueSort differs is refused with kube-scheduler's reason first."""
    profiles = document.get("profiles")
    if not isinstance(profiles, list) or len(profiles) < 2:
        return

    def queue_sort(profile: object) -> object:
        plugins = profile.get("plugins") if isinstance(profile, Mapping) else None
        return plugins.get("queueSort") if isinstance(plugins, Mapping) else None

    first = queue_sort(profiles[0])
    for i, profile in enumerate(profiles[1:], 1):
        if queue_sort(profile) != first:
            raise ConfigError(f"{where}.profiles[{i}].plugins.queueSort: has to match for all profiles")


def _merge_scores(
    plugins: _PluginSet, policy: str, where: str, rules: RuleNames = NO_RULES
) -> tuple[dict[str, int], Policy | None]:
    disabled = {p.name for p in plugins.disabled}
    for i, plugin in enumerate(plugins.disabled):
        if (
            plugin.name != "*"
            and plugin.name not in scores.SCORE_PLUGINS
            and plugin.name not in scores.UNSUPPORTED_SCORES
            and plugin.name not in rules.scores
        ):
            raise ConfigError(f"{where}.disabled[{i}].name: unknown score plugin {shorten(plugin.name)!r}")
    chosen: Policy | None = None
    for i, plugin in enumerate(plugins.enabled):
        here = f"{where}.enabled[{i}].name"
        if plugin.name in scores.UNSUPPORTED_SCORES:
            raise ConfigError(
                f"{here}: kubegpu does not implement the score plugin {plugin.name!r}; disable it instead"
            )
        if plugin.name in rules.scores:
            continue
        if plugin.name not in scores.SCORE_PLUGINS:
            known = ", ".join((*scores.SCORE_PLUGINS, *sorted(rules.scores)))
            raise ConfigError(f"{here}: unknown score plugin {shorten(plugin.name)!r} (known: {known})")
        if plugin.name in POLICY_PLUGINS:
            if chosen is not None and chosen != POLICY_PLUGINS[plugin.name]:
                raise ConfigError(
                    f"{here}: NodeResourcesMostAllocated (binpack) and NodeResourcesLeastAllocated (spread) exclude "
                    "each other; enable one"
                )
            chosen = POLICY_PLUGINS[plugin.name]
    defaults = dict(scores.DEFAULT_WEIGHTS)
    defaults[scores.policy_plugin(chosen or policy)] = scores.POLICY_WEIGHT
    weights: dict[str, int] = {}
    if "*" not in disabled:
        weights = {name: weight for name, weight in defaults.items() if name not in disabled}
    for plugin in plugins.enabled:
        if plugin.name not in rules.scores:
            weights[plugin.name] = plugin.weight or defaults.get(plugin.name, 1)
    return weights, chosen


def _merge_filters(
    plugins: _PluginSet | _ModernPluginSet,
    where: str,
    ignorable: frozenset[str] = scores.UNSUPPORTED_FILTERS,
    version: str = V1BETA1,
    rules: RuleNames = NO_RULES,
) -> frozenset[str]:
    """The filters turned off; `ignorable` are the names a disabled list may hold besides kubegpu's filters. An
    enabled list may name kubegpu's filters and kube-scheduler's filters kubegpu has nothing to run for (its
    default profile names them: a file it wrote enables VolumeZone and the volume limits)."""
    moot = DEFAULT_MOOT_FILTERS
    enabled: Sequence[_Named] = plugins.enabled
    disabled: Sequence[_Named] = plugins.disabled
    for i, plugin in enumerate(enabled):
        if plugin.name in REMOVED.get(version, {}):
            raise ConfigError(f"{where}.enabled[{i}].name: {version} has no plugin {plugin.name!r}")
        if plugin.name not in scores.FILTER_PLUGINS and plugin.name not in moot and plugin.name not in rules.filters:
            known = ", ".join((*scores.FILTER_PLUGINS, *sorted(rules.filters)))
            raise ConfigError(
                f"{where}.enabled[{i}].name: {shorten(plugin.name)!r} is not a filter kubegpu runs (known: "
                f"{known}); every filter kubegpu runs is on by default"
            )
    off: set[str] = set()
    for i, plugin in enumerate(disabled):
        if plugin.name == "*":
            off.update(scores.FILTER_PLUGINS)
        elif plugin.name in scores.FILTER_PLUGINS:
            off.add(plugin.name)
        elif plugin.name not in ignorable and plugin.name not in rules.filters:
            raise ConfigError(f"{where}.disabled[{i}].name: unknown filter plugin {shorten(plugin.name)!r}")
    return frozenset(off - {p.name for p in enabled})


def _check_modern_name(name: str, version: str, here: str, *, score: bool = False, rules: RuleNames = NO_RULES) -> None:
    """A plugin a v1beta2-or-later profile enables: refused when the version removed it, when kubegpu does not
    implement it, or when it is unknown."""
    removed = REMOVED[version].get(name)
    if removed is not None:
        raise ConfigError(f"{here}: {version} has no plugin {name!r}; {removed}")
    if name in scores.UNSUPPORTED_SCORES or name in RESOURCE_SCORES:
        raise ConfigError(f"{here}: kubegpu does not implement the plugin {name!r}; disable it instead")
    if score and name not in MODERN_SCORES and name not in rules.scores:
        known = ", ".join((*MODERN_SCORES, *sorted(rules.scores)))
        raise ConfigError(f"{here}: {shorten(name)!r} is not a score plugin kubegpu runs (known: {known})")
    if (
        name not in MODERN_SCORES
        and name not in scores.FILTER_PLUGINS
        and name not in NOTHING_TO_RUN
        and name not in QUEUE_PLUGINS
        and name not in rules.filters
        and name not in rules.scores
    ):
        raise ConfigError(f"{here}: unknown plugin {shorten(name)!r}")


def _merge_set(
    defaults: Sequence[tuple[str, int | None]], custom: _PluginSet | _ModernPluginSet
) -> list[tuple[str, int | None]]:
    """kube-scheduler's mergePluginSet: the defaults less the disabled ones (all with `*`), a default the custom set
    enables again taking its place (and its weight), then the other enabled ones."""
    disabled = {p.name for p in custom.disabled}
    enabled = {p.name: p for p in custom.enabled}
    merged: list[tuple[str, int | None]] = []
    replaced: set[str] = set()
    if "*" not in disabled:
        for name, weight in defaults:
            if name in disabled:
                continue
            if name in enabled:
                weight = enabled[name].weight
                replaced.add(name)
            merged.append((name, weight))
    merged.extend((p.name, p.weight) for p in custom.enabled if p.name not in replaced)
    return merged


def _modern_plugins(
    plugins: _ModernPlugins, version: str, where: str, rules: RuleNames = NO_RULES
) -> tuple[dict[str, int], frozenset[str], list[tuple[str, int | None]] | None]:
    """The score weights (NodeResourcesFit's under its own name), the filters turned off and, for v1beta3 and v1,
    the merged `multiPoint` set, from a v1beta2 or later profile: v1beta2 merges each extension point with its
    defaults; v1beta3 and v1 merge `multiPoint` with the default set, and a plugin an extension point enables or
    disables there overrides `multiPoint`."""
    sets: tuple[tuple[str, _ModernPluginSet | None], ...] = (
        ("score", plugins.score), ("filter", plugins.filter), ("multiPoint", plugins.multiPoint),
    )  # fmt: skip
    ignorable = frozenset(
        {*NOTHING_TO_RUN, *QUEUE_PLUGINS, *scores.UNSUPPORTED_SCORES, *scores.UNSUPPORTED_FILTERS, *REMOVED[version],
         *MODERN_SCORES, *rules.scores, *rules.filters}
    )  # fmt: skip
    for point, plugin_set in sets:
        if plugin_set is None:
            continue
        if point != "filter":  # the filters are checked by `_merge_filters`
            for i, plugin in enumerate(plugin_set.enabled):
                here = f"{where}.{point}.enabled[{i}].name"
                _check_modern_name(plugin.name, version, here, score=point == "score", rules=rules)
        for i, plugin in enumerate(plugin_set.disabled):
            if plugin.name != "*" and plugin.name not in scores.FILTER_PLUGINS and plugin.name not in ignorable:
                raise ConfigError(f"{where}.{point}.disabled[{i}].name: unknown plugin {shorten(plugin.name)!r}")
    filters_off = _merge_filters(plugins.filter, f"{where}.filter", ignorable, version, rules)
    if version == V1BETA2:
        if plugins.multiPoint is not None:
            raise ConfigError(f"{where}.multiPoint: v1beta3 and later have multiPoint; {version} does not")
        merged = _merge_set(tuple(V1BETA2_SCORES.items()), plugins.score)
        return {name: weight or 1 for name, weight in merged if name not in rules.scores}, filters_off, None
    multi = _merge_set(V1_MULTI_POINT, plugins.multiPoint or _ModernPluginSet())
    score_off = {p.name for p in plugins.score.disabled}
    score_on = {p.name for p in plugins.score.enabled}
    weights: dict[str, int] = {}
    if "*" not in score_off:
        for name, weight in multi:
            if name in MODERN_SCORES and name not in score_off and name not in score_on:
                weights[name] = weight or 1
    for plugin in plugins.score.enabled:
        if plugin.name not in rules.scores:
            weights[plugin.name] = plugin.weight or 1
    filter_set = plugins.filter
    filter_off = {p.name for p in filter_set.disabled}
    from_multi = set()
    if "*" not in filter_off:
        from_multi = {name for name, _ in multi if name in scores.FILTER_PLUGINS and name not in filter_off}
    running = from_multi | {p.name for p in filter_set.enabled}
    return weights, frozenset(scores.FILTER_PLUGINS) - running, multi


def _default_spread(document: dict[str, Any], where: str, version: str = V1BETA1) -> tuple[SpreadConstraint, ...]:
    """PodTopologySpreadArgs, validated as kube-scheduler validates them, into the profile's default constraints
    (their selectors None: each pod's owners give it). 1.20 (v1beta1) reads a list without `defaultingType` as
    List; later versions default `defaultingType` to System, which takes no list."""
    try:
        args = _PodTopologySpreadArgs.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, where)) from None
    constraints = args.defaultConstraints
    if version == V1BETA1:
        defaulting = args.defaultingType or ("List" if constraints else "System")
    else:
        defaulting = args.defaultingType or "System"
    if defaulting == "System":
        if constraints:
            raise ConfigError(f"{where}.defaultingType: System takes no defaultConstraints; set List to use them")
        return scores.SYSTEM_DEFAULT_SPREAD
    seen: set[tuple[str, str]] = set()
    for j, c in enumerate(constraints):
        here = f"{where}.defaultConstraints[{j}]"
        if c.labelSelector is not None:
            raise ConfigError(f"{here}.labelSelector: must not be set: each pod's selector comes from its owners")
        prefix, _, name = c.topologyKey.rpartition("/")
        if not _LABEL_NAME.fullmatch(c.topologyKey) or len(name) > 63 or len(prefix) > 253:
            raise ConfigError(f"{here}.topologyKey: {shorten(c.topologyKey)!r} is not a valid label name")
        if (c.topologyKey, c.whenUnsatisfiable) in seen:
            raise ConfigError(f"{here}: a second constraint for {c.topologyKey} with {c.whenUnsatisfiable}")
        seen.add((c.topologyKey, c.whenUnsatisfiable))
    return tuple(SpreadConstraint(c.maxSkew, c.topologyKey, c.whenUnsatisfiable, None) for c in constraints)


def _check_resources(resources: list[_ResourceSpec], where: str) -> None:
    """kubegpu scores cpu and memory in equal parts (and the devices a pod asks for): a resource list must say the
    same (empty: kube-scheduler's default, cpu and memory with weight 1)."""
    names = [r.name for r in resources]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{where}[{i}].name: {shorten(name)!r} is listed twice")
    weights = {r.weight or 1 for r in resources}
    if resources and (sorted(names) != ["cpu", "memory"] or len(weights) != 1):
        raise ConfigError(
            f"{where}: kubegpu scores cpu and memory with equal weights (and the devices a pod asks for); other "
            "resources or weights are not implemented"
        )


@dataclass(slots=True)
class _PluginArgs:
    """What a profile's pluginConfig set."""

    hard_weight: int = 1
    default_spread: tuple[SpreadConstraint, ...] = scores.SYSTEM_DEFAULT_SPREAD
    strategy: Policy | None = None
    share_policy: str | None = None
    mix: tuple[tuple[int, int, int, float], ...] = ()
    lead: bool = True
    model_access: bool = False


ARGS_MODELS: dict[str, type[_Args]] = {
    scores.INTER_POD_AFFINITY: _InterPodAffinityArgs,
    scores.NODE_AFFINITY: _NodeAffinityArgs,
    FIT: _NodeResourcesFitArgs,
    scores.BALANCED: _ResourcesArgs,
    scores.MOST_ALLOCATED: _ResourcesArgs,
    scores.LEAST_ALLOCATED: _ResourcesArgs,
    "DefaultPreemption": _DefaultPreemptionArgs,
    "VolumeBinding": _VolumeBindingArgs,
    "DynamicResources": _DynamicResourcesArgs,
    scores.DEVICES: _DevicesArgs,
    scores.FRAGMENTATION: _FragmentationArgs,
}
# Arguments each version has (v1beta1 is kube-scheduler 1.20's).
V1BETA1_ARGS = frozenset(
    {scores.INTER_POD_AFFINITY, scores.NODE_AFFINITY, FIT, scores.MOST_ALLOCATED, scores.LEAST_ALLOCATED,
     "DefaultPreemption", "VolumeBinding", scores.SPREAD, scores.DEVICES, scores.FRAGMENTATION}
)  # fmt: skip
MODERN_ARGS = frozenset(
    {scores.INTER_POD_AFFINITY, scores.NODE_AFFINITY, FIT, scores.BALANCED, "DefaultPreemption", "VolumeBinding",
     scores.SPREAD, "DynamicResources", scores.DEVICES, scores.FRAGMENTATION}
)  # fmt: skip


def _plugin_args(entries: list[_PluginConfig], version: str, where: str, rules: RuleNames = NO_RULES) -> _PluginArgs:
    """Each pluginConfig entry's arguments, validated as kube-scheduler validates them; an argument kubegpu does
    not implement is refused naming it (never accepted and ignored)."""
    found = _PluginArgs()
    seen: set[str] = set()
    takes_args = V1BETA1_ARGS if version == V1BETA1 else MODERN_ARGS
    for i, entry in enumerate(entries):
        name, here = entry.name, f"{where}[{i}]"
        if name in seen:
            raise ConfigError(f"{here}.name: a second pluginConfig for {shorten(name)!r}")
        seen.add(name)
        if not name:
            continue
        if version == V1BETA1:
            known = name in scores.SCORE_PLUGINS or name in scores.FILTER_PLUGINS or name in QUEUE_PLUGINS
            if not known and name != "DefaultPreemption" and name not in rules.filters and name not in rules.scores:
                raise ConfigError(f"{here}.name: unknown plugin {shorten(name)!r}")
        else:
            _check_modern_name(name, version, f"{here}.name", rules=rules)
        document = entry.args or {}
        here = f"{here}.args"
        kind = document.get("kind")
        if kind is not None and kind != f"{name}Args":
            raise ConfigError(f"{here}.kind: {shorten(str(kind))!r} is not {name}Args")
        if name not in takes_args:
            extra = sorted(set(document) - {"apiVersion", "kind"})
            if extra:
                raise ConfigError(f"{here}.{shorten(extra[0])}: {name} takes no arguments in {version}")
            continue
        if name == scores.SPREAD:
            found.default_spread = _default_spread(document, here, version)
            continue
        try:
            args = ARGS_MODELS[name].model_validate(document)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, here)) from None
        if isinstance(args, _InterPodAffinityArgs):
            if version == V1BETA1 and "ignorePreferredTermsOfExistingPods" in document:
                raise ConfigError(f"{here}.ignorePreferredTermsOfExistingPods: not in {version}")
            if args.ignorePreferredTermsOfExistingPods:
                raise ConfigError(f"{here}.ignorePreferredTermsOfExistingPods: kubegpu does not implement it")
            found.hard_weight = args.hardPodAffinityWeight
        elif isinstance(args, _NodeAffinityArgs):
            if args.addedAffinity is not None:
                raise ConfigError(
                    f"{here}.addedAffinity: kubegpu does not implement it; put the affinity in the pods (a "
                    "mutating webhook or the workloads' templates)"
                )
        elif isinstance(args, _NodeResourcesFitArgs):
            for field in ("ignoredResources", "ignoredResourceGroups"):
                if getattr(args, field):
                    raise ConfigError(
                        f"{here}.{field}: kubegpu does not implement it; every resource a pod requests is checked"
                    )
            strategy = args.scoringStrategy
            if strategy is not None:
                if version == V1BETA1:
                    raise ConfigError(f"{here}.scoringStrategy: v1beta2 and later have it; {version} does not")
                if strategy.type == "RequestedToCapacityRatio" or strategy.requestedToCapacityRatio is not None:
                    raise ConfigError(
                        f"{here}.scoringStrategy.type: kubegpu does not implement RequestedToCapacityRatio; use "
                        "MostAllocated (binpack) or LeastAllocated (spread)"
                    )
                _check_resources(strategy.resources, f"{here}.scoringStrategy.resources")
                found.strategy = STRATEGY_POLICIES[strategy.type]
        elif isinstance(args, _ResourcesArgs):
            _check_resources(args.resources, f"{here}.resources")
        elif isinstance(args, _DevicesArgs):
            found.share_policy = args.sharePolicy
        elif isinstance(args, _FragmentationArgs):
            for j, kind in enumerate(args.mix):
                if kind.gpus > 1 and kind.gpuMilli < 1000:
                    raise ConfigError(
                        f"{here}.mix[{j}].gpuMilli: a kind of {kind.gpus} GPUs takes them whole (1000); a share "
                        "kind asks for one GPU"
                    )
                if kind.gpus == 0 and kind.gpuMilli < 1000:
                    raise ConfigError(f"{here}.mix[{j}].gpuMilli: a kind of 0 GPUs (a cpu-only pod) asks for none")
            found.mix = tuple((k.gpus, k.gpuMilli, k.cpuMilli, k.weight) for k in args.mix)
            found.lead = args.lead
            if args.modelAccess and args.mix:
                raise ConfigError(
                    f"{here}.modelAccess: it has the mix learned keep each kind's GPU models; a mix given names none. "
                    "Give one or the other"
                )
            found.model_access = args.modelAccess
        elif isinstance(args, _VolumeBindingArgs) and args.shape is not None:
            raise ConfigError(f"{here}.shape: kubegpu does not score volumes")
    return found


def parse_config(
    document: Any, policy: str = "binpack", where: str = "KubeSchedulerConfiguration", rules: RuleNames = NO_RULES
) -> SchedulerConfig:
    """A loaded YAML document -> `SchedulerConfig`; `policy` is the one `--policy` gives (or the default); `rules`
    the names of the rules installed plugins add, which the profile may name besides kube-scheduler's plugins."""
    if not isinstance(document, dict):
        raise ConfigError(f"{where}: expected a KubeSchedulerConfiguration object")
    version = document.get("apiVersion")
    if version not in VERSIONS:
        raise ConfigError(
            f"{where}.apiVersion: {shorten(str(version))!r} is not one kubegpu reads ({', '.join(VERSIONS)})"
        )
    model: type[_Configuration | _ConfigurationV1beta2 | _ConfigurationV1] = (
        _Configuration if version == V1BETA1 else _ConfigurationV1beta2 if version == V1BETA2 else _ConfigurationV1
    )
    _same_queue_sort(document, where)
    try:
        config = model.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, where)) from None
    if config.podMaxBackoffSeconds < config.podInitialBackoffSeconds:
        raise ConfigError(f"{where}.podMaxBackoffSeconds: must be at least podInitialBackoffSeconds")
    here = f"{where}.profiles[0]"
    percentage = config.percentageOfNodesToScore
    if isinstance(config, _Configuration):
        profile = config.profiles[0] if config.profiles else _Profile()
        plugins = profile.plugins
        weights, chosen = _merge_scores(plugins.score, policy, f"{here}.plugins.score", rules)
        filters_off = _merge_filters(plugins.filter, f"{here}.plugins.filter", rules=rules)
        args = _plugin_args(profile.pluginConfig, version, f"{here}.pluginConfig", rules)
        sort, gates_off = _queue_plugins(plugins.queueSort, None, None, f"{here}.plugins")
        rule_weights, rules_off, rule_filters_off = _rule_settings(rules, [plugins.score], [plugins.filter])
        name = profile.schedulerName
    else:
        modern = config.profiles[0] if config.profiles else _ModernProfile()
        if modern.percentageOfNodesToScore is not None:
            if version == V1BETA2:
                raise ConfigError(f"{here}.percentageOfNodesToScore: v1beta3 and later have it; {version} does not")
            percentage = modern.percentageOfNodesToScore
        plugins_ = modern.plugins
        weights, filters_off, multi = _modern_plugins(plugins_, version, f"{here}.plugins", rules)
        args = _plugin_args(modern.pluginConfig, version, f"{here}.pluginConfig", rules)
        sort, gates_off = _queue_plugins(plugins_.queueSort, plugins_.preEnqueue, multi, f"{here}.plugins")
        multi_set = [plugins_.multiPoint] if plugins_.multiPoint is not None else []
        rule_weights, rules_off, rule_filters_off = _rule_settings(
            rules, [*multi_set, plugins_.score], [*multi_set, plugins_.filter]
        )
        chosen = args.strategy
        # NodeResourcesFit scores with the policy: kubegpu's MostAllocated (binpack) or LeastAllocated (spread).
        fit = weights.pop(FIT, 0)
        if fit:
            weights[scores.policy_plugin(chosen or policy)] = fit
        name = modern.schedulerName
    return SchedulerConfig(
        scores.Profile(
            {**weights, **rule_weights},
            filters_off | rule_filters_off,
            percentage,
            args.hard_weight,
            args.default_spread,
            scores_off=rules_off,
            pre_enqueue_off=gates_off,
            queue_sort=sort,
            share_policy=args.share_policy,
            fragmentation_mix=args.mix,
            fragmentation_lead=args.lead,
            fragmentation_model_access=args.model_access,
        ),
        policy=chosen,
        scheduler_name=name,
        initial_backoff=float(config.podInitialBackoffSeconds),
        max_backoff=float(config.podMaxBackoffSeconds),
    )


class _GoYamlLoader(yaml.SafeLoader):
    """YAML as kube-scheduler's reader resolves it (go-yaml v2, in sigs.k8s.io/yaml), where PyYAML's YAML 1.1
    differs: its implicit resolvers are go-yaml's (below), and a key given twice in a mapping is refused (its strict
    decoding: `key "..." already set in map`; PyYAML keeps the last)."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}  # go-yaml's only, set below
    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{shorten(str(key))!r} given twice in one mapping", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_go_int(self, node: yaml.ScalarNode) -> int:
        """Go's integer syntax (`strconv.ParseInt`, base 0) once go-yaml has taken the underscores out: `0x1f`,
        `0o17`, `0b101`, and `017` octal as in YAML 1.1; no sexagesimal `1:30` (a string to go-yaml)."""
        text = str(self.construct_scalar(node)).replace("_", "")
        digits = text.lstrip("+-")
        if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
            value = int(digits, 8)
            return -value if text.startswith("-") else value
        return int(text, 0)

    def construct_go_float(self, node: yaml.ScalarNode) -> float | str:
        """Go's `strconv.ParseFloat` after go-yaml's resolution; a number past float64's range fails to parse
        there, and go-yaml keeps the text as a string."""
        text = str(self.construct_scalar(node))
        special = _GO_FLOAT_WORDS.get(text)
        if special is not None:
            return special
        value = float(text.replace("_", ""))
        return text if math.isinf(value) else value

    def construct_go_timestamp(self, node: yaml.ScalarNode) -> str:
        """A `!!timestamp` stays its text: go-yaml leaves a timestamp a string in an untyped document."""
        return str(self.construct_scalar(node))


def _digits(klass: str, *, optional: bool = False) -> str:
    """One or more of `klass` (none too if `optional`), with underscores anywhere between (go-yaml takes them all
    out before it parses a number)."""
    return f"(?:_*{klass}){'*' if optional else '+'}"


# go-yaml v2's resolution of a plain scalar (its `resolve`), as PyYAML implicit resolvers, tried in this order for
# the scalar's first character: its table of words (YAML 1.1's booleans with `y`, `Y`, `n`, `N`; nulls; `.inf`,
# `.nan`; `<<`), then for a scalar starting with a digit or a sign Go's integer syntax and then its float syntax
# (`[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, underscores taken out first), for one starting with `.`
# Go's float syntax. Anything else is a string: a timestamp too (go-yaml leaves it one in an untyped document).
_GO_FLOAT_WORDS = {
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
}
_DECIMAL, _MORE_DECIMAL = _digits("[0-9]"), _digits("[0-9]", optional=True)
_GO_RESOLVERS: tuple[tuple[str, str, str], ...] = (
    ("bool", r"y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF", "yYnNtTfFoO"),
    ("null", r"~|null|Null|NULL", "~nN"),
    ("float", "|".join(re.escape(word) for word in _GO_FLOAT_WORDS), "+-."),
    ("merge", "<<", "<"),
    (
        "int",
        rf"[-+]?_*(?:0_*[bB]{_digits('[01]')}|0_*[oO]{_digits('[0-7]')}|0_*[xX]{_digits('[0-9a-fA-F]')}"
        rf"|0{_digits('[0-7]', optional=True)}|[1-9]{_MORE_DECIMAL})_*",
        "+-0123456789",
    ),
    (
        "float",
        rf"[-+]?_*(?:\.{_DECIMAL}|[0-9]{_MORE_DECIMAL}(?:_*\.{_MORE_DECIMAL})?)(?:_*[eE]_*[-+]?{_DECIMAL})?_*",
        "+-0123456789",
    ),
    ("float", r"\.[0-9]+(?:[eE][-+]?[0-9]+)?", "."),
)
for _tag, _pattern, _first in _GO_RESOLVERS:
    _GoYamlLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"), [*_first])
_GoYamlLoader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile("^$"), [""])  # an empty scalar
_GoYamlLoader.add_constructor("tag:yaml.org,2002:int", _GoYamlLoader.construct_go_int)
_GoYamlLoader.add_constructor("tag:yaml.org,2002:float", _GoYamlLoader.construct_go_float)
_GoYamlLoader.add_constructor("tag:yaml.org,2002:timestamp", _GoYamlLoader.construct_go_timestamp)


FLOAT32_MAX = 3.4028234663852886e38


def _json_key(key: Any, where: str) -> str:
    """A mapping key as sigs.k8s.io/yaml writes it into JSON: a boolean or number as its text (a float as Go's
    `FormatFloat(f, 'g', -1, 32)` writes it: float32's shortest digits, `e` past 6 digits left of the point or
    4 zeros right of it), any other key refused."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        if math.isnan(key) or abs(key) > FLOAT32_MAX:
            return ".nan" if math.isnan(key) else ".inf" if key > 0 else "-.inf"
        single = struct.unpack("f", struct.pack("f", key))[0]
        digits = next(
            n for n in range(1, 10) if struct.unpack("f", struct.pack("f", float(f"{single:.{n - 1}e}")))[0] == single
        )
        exponent = int(f"{single:.{digits - 1}e}".split("e")[1])
        if exponent < -4 or exponent >= 6:
            return f"{single:.{digits - 1}e}"
        return f"{single:.{max(digits - exponent - 1, 0)}f}"
    raise ConfigError(
        f"{where}: a key of {'null' if key is None else type(key).__name__} cannot be written as JSON "
        "(kube-scheduler turns the file into JSON first, and refuses it)"
    )


def _as_json(value: Any, where: str) -> Any:
    """A YAML document as kube-scheduler decodes it: turned into JSON first (sigs.k8s.io/yaml), where a float with
    no fraction (`16.0`, `1e3`) is written as an integer (Go's encoding/json: `16`), which an integer field takes;
    a key that is a number or boolean becomes its text; and what JSON cannot hold (`.inf`, `.nan`, a null key)
    stops kube-scheduler, naming the field here."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ConfigError(
                f"{where}: {value} cannot be written as JSON (kube-scheduler turns the file into JSON "
                "first, and refuses it)"
            )
        if value.is_integer() and abs(value) < 1e21:  # 1e21 and above: written `1e+21`
            return int(value)
    if isinstance(value, dict):
        converted = {}
        for key, item in value.items():
            name = _json_key(key, where)
            converted[name] = _as_json(item, f"{where}.{name}")
        return converted
    if isinstance(value, list):
        return [_as_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    return value


def _read_yaml(path: Path, what: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> Any:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not {what}")
    try:
        document = yaml.load(raw, Loader=loader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{line} not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {shorten(str(exc))}") from None
    # kube-scheduler decodes a file that starts with `{` as JSON (`16.0` is then no integer), any other as YAML.
    if loader is yaml.SafeLoader or raw.lstrip(b" \t\r\n").startswith(b"{"):
        return document
    return _as_json(document, str(path))


def load_topology(path: str | Path) -> tuple[str, ...]:
    """Read `--topology FILE`: a Kueue `Topology` document (kueue.x-k8s.io, `spec.levels[].nodeLabel`, widest
    first); returns its levels (docs/gangs.md)."""
    from kubegpu.scheduler.podgroups import topology_levels

    path = Path(path)
    document = _read_yaml(path, "a Topology")
    if not isinstance(document, Mapping) or document.get("kind") != "Topology":
        raise ConfigError(f"{path}: expected a Kueue Topology document (kind: Topology)")
    try:
        return topology_levels(document)
    except InputError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load_config(
    path: str | Path, policy: str | None = None, rules: RuleNames = NO_RULES
) -> tuple[SchedulerConfig, Policy]:
    """Read `--config FILE`; returns the configuration and the policy to run (`--policy` when given, which must agree
    with a policy plugin the file enables). `rules`: the names of the rules installed plugins add."""
    path = Path(path)
    document = _read_yaml(path, "a scheduler configuration", _GoYamlLoader)
    config = parse_config(document, policy or "binpack", str(path), rules)
    if policy is not None and config.policy is not None and policy != config.policy:
        raise ConfigError(
            f"{path}: the profile enables the {config.policy} policy's plugin but --policy {policy} was given"
        )
    return config, config.policy or cast(Policy, policy or "binpack")
