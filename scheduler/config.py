"""`--config FILE`: kube-scheduler's KubeSchedulerConfiguration, read for what kubegpu's engine can honour.

`kubegpu scheduler --config FILE` and `kubegpu simulate --config FILE` read the same file, so a profile tried in the
simulator behaves the same live. The format is kube-scheduler 1.20's (`kubescheduler.config.k8s.io/v1beta1`), with
one profile:

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
```

Plugins merge as kube-scheduler merges them: the defaults (`kubegpu.scheduler.scores.DEFAULT_WEIGHTS` and the
policy's plugin) minus the disabled ones, an enabled default taking the weight given, then the other enabled ones.
Enabling NodeResourcesMostAllocated or NodeResourcesLeastAllocated chooses the policy (binpack or spread) and
replaces the other; `--policy`, when given too, must agree. Plugin names kubegpu does not know are refused;
kube-scheduler plugins kubegpu does not implement (SelectorSpread, RequestedToCapacityRatio, volume limits, ...) may be
disabled, never enabled. PodTopologySpread's `defaultConstraints` and `defaultingType` read as 1.20 reads them with
DefaultPodTopologySpread on: without `defaultingType`, an empty list means `System` (kube-scheduler's defaults,
`scores.SYSTEM_DEFAULT_SPREAD`) and a list means `List`; `defaultingType: List` with no constraints turns defaulting
off. The other extension points (queueSort, preFilter, bind, ...) and client settings
(clientConnection, leaderElection, ...) are accepted and ignored: kubegpu has its own flags for those. Every error
names the field: `profiles[0].plugins.score.enabled[1].name: unknown score plugin 'NodeAfinity'`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubegpu.core.errors import InputError, describe_validation_error, shorten
from kubegpu.core.models import SpreadConstraint
from kubegpu.scheduler import scores

__all__ = ["ConfigError", "SchedulerConfig", "load_config", "parse_config"]

API_VERSION = "kubescheduler.config.k8s.io/v1beta1"
# A label name: an optional DNS subdomain prefix and `/`, then up to 63 alphanumerics, `-`, `_`, `.` (alphanumeric at
# both ends).
_LABEL_NAME = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
KIND = "KubeSchedulerConfiguration"
MAX_CONFIG_BYTES = 1 << 20


Policy = Literal["binpack", "spread"]


class ConfigError(InputError):
    """A configuration file kubegpu cannot use; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Plugin(_Strict):
    name: str = Field(min_length=1)
    weight: int | None = Field(default=None, ge=1, le=1000)


class _PluginSet(_Strict):
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


class _PluginConfig(_Strict):
    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class _InterPodAffinityArgs(_Strict):
    hardPodAffinityWeight: int = Field(default=1, ge=0, le=100)
    apiVersion: str | None = None
    kind: str | None = None


class _DefaultConstraint(_Strict):
    maxSkew: int = Field(ge=1, le=2**31 - 1)
    topologyKey: str = Field(min_length=1, max_length=317)  # a qualified label name: prefix/name
    whenUnsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    labelSelector: Any = None


class _PodTopologySpreadArgs(_Strict):
    defaultConstraints: list[_DefaultConstraint] = Field(default_factory=list, max_length=64)
    defaultingType: Literal["System", "List"] | None = None
    apiVersion: str | None = None
    kind: str | None = None


class _Profile(_Strict):
    schedulerName: str | None = Field(default=None, min_length=1)
    plugins: _Plugins = _Plugins()
    pluginConfig: list[_PluginConfig] = Field(default_factory=list)


class _Configuration(_Strict):
    apiVersion: Literal["kubescheduler.config.k8s.io/v1beta1"]
    kind: Literal["KubeSchedulerConfiguration"]
    profiles: list[_Profile] = Field(default_factory=lambda: [_Profile()], max_length=1)
    percentageOfNodesToScore: int = Field(default=0, ge=0, le=100)
    podInitialBackoffSeconds: int = Field(default=1, ge=1)
    podMaxBackoffSeconds: int = Field(default=10, ge=1)
    # kube-scheduler's process settings: kubegpu takes these from its flags.
    clientConnection: Any = None
    leaderElection: Any = None
    healthzBindAddress: Any = None
    metricsBindAddress: Any = None
    enableProfiling: Any = None
    enableContentionProfiling: Any = None
    parallelism: Any = None
    extenders: Any = None


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """What a configuration file sets: the score profile, the policy it chose (None: `--policy` decides), the
    profile's scheduler name and the queue's backoff."""

    profile: scores.Profile
    policy: Policy | None = None
    scheduler_name: str | None = None
    initial_backoff: float = 1.0
    max_backoff: float = 10.0


POLICY_PLUGINS: dict[str, Policy] = {scores.MOST_ALLOCATED: "binpack", scores.LEAST_ALLOCATED: "spread"}


def _merge_scores(plugins: _PluginSet, policy: str, where: str) -> tuple[dict[str, int], Policy | None]:
    disabled = {p.name for p in plugins.disabled}
    for i, plugin in enumerate(plugins.disabled):
        if (
            plugin.name != "*"
            and plugin.name not in scores.SCORE_PLUGINS
            and plugin.name not in scores.UNSUPPORTED_SCORES
        ):
            raise ConfigError(f"{where}.disabled[{i}].name: unknown score plugin {shorten(plugin.name)!r}")
    chosen: Policy | None = None
    for i, plugin in enumerate(plugins.enabled):
        here = f"{where}.enabled[{i}].name"
        if plugin.name in scores.UNSUPPORTED_SCORES:
            raise ConfigError(
                f"{here}: kubegpu does not implement the score plugin {plugin.name!r}; disable it instead"
            )
        if plugin.name not in scores.SCORE_PLUGINS:
            known = ", ".join(scores.SCORE_PLUGINS)
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
        weights[plugin.name] = plugin.weight or defaults.get(plugin.name, 1)
    return weights, chosen


def _merge_filters(plugins: _PluginSet, where: str) -> frozenset[str]:
    for i, plugin in enumerate(plugins.enabled):
        if plugin.name not in scores.FILTER_PLUGINS:
            raise ConfigError(
                f"{where}.enabled[{i}].name: {shorten(plugin.name)!r} is not a filter kubegpu runs (known: "
                f"{', '.join(scores.FILTER_PLUGINS)}); every filter kubegpu runs is on by default"
            )
    off: set[str] = set()
    for i, plugin in enumerate(plugins.disabled):
        if plugin.name == "*":
            off.update(scores.FILTER_PLUGINS)
        elif plugin.name in scores.FILTER_PLUGINS:
            off.add(plugin.name)
        elif plugin.name not in scores.UNSUPPORTED_FILTERS:
            raise ConfigError(f"{where}.disabled[{i}].name: unknown filter plugin {shorten(plugin.name)!r}")
    return frozenset(off - {p.name for p in plugins.enabled})


def _default_spread(document: dict[str, Any], where: str) -> tuple[SpreadConstraint, ...]:
    """PodTopologySpreadArgs, validated as kube-scheduler 1.20 validates them, into the profile's default
    constraints (their selectors None: each pod's owners give it)."""
    try:
        args = _PodTopologySpreadArgs.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, where)) from None
    constraints = args.defaultConstraints
    defaulting = args.defaultingType or ("List" if constraints else "System")
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


def parse_config(document: Any, policy: str = "binpack", where: str = "KubeSchedulerConfiguration") -> SchedulerConfig:
    """A loaded YAML document -> `SchedulerConfig`; `policy` is the one `--policy` gives (or the default)."""
    if not isinstance(document, dict):
        raise ConfigError(f"{where}: expected a KubeSchedulerConfiguration object")
    try:
        config = _Configuration.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, where)) from None
    if config.podMaxBackoffSeconds < config.podInitialBackoffSeconds:
        raise ConfigError(f"{where}.podMaxBackoffSeconds: must be at least podInitialBackoffSeconds")
    profile = config.profiles[0] if config.profiles else _Profile()
    here = f"{where}.profiles[0].plugins"
    weights, chosen = _merge_scores(profile.plugins.score, policy, f"{here}.score")
    filters_off = _merge_filters(profile.plugins.filter, f"{here}.filter")
    hard_weight = 1
    default_spread: tuple[SpreadConstraint, ...] = scores.SYSTEM_DEFAULT_SPREAD
    for i, entry in enumerate(profile.pluginConfig):
        name = entry.name
        if name not in scores.SCORE_PLUGINS and name not in scores.FILTER_PLUGINS and name != "DefaultPreemption":
            raise ConfigError(f"{where}.profiles[0].pluginConfig[{i}].name: unknown plugin {shorten(name)!r}")
        if name == scores.INTER_POD_AFFINITY:
            try:
                args = _InterPodAffinityArgs.model_validate(entry.args)
            except ValidationError as exc:
                raise ConfigError(
                    describe_validation_error(exc, f"{where}.profiles[0].pluginConfig[{i}].args")
                ) from None
            hard_weight = args.hardPodAffinityWeight
        if name == scores.SPREAD:
            default_spread = _default_spread(entry.args, f"{where}.profiles[0].pluginConfig[{i}].args")
    return SchedulerConfig(
        scores.Profile(weights, filters_off, config.percentageOfNodesToScore, hard_weight, default_spread),
        policy=chosen,
        scheduler_name=profile.schedulerName,
        initial_backoff=float(config.podInitialBackoffSeconds),
        max_backoff=float(config.podMaxBackoffSeconds),
    )


def load_config(path: str | Path, policy: str | None = None) -> tuple[SchedulerConfig, Policy]:
    """Read `--config FILE`; returns the configuration and the policy to run (`--policy` when given, which must agree
    with a policy plugin the file enables)."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a scheduler configuration")
    try:
        document = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{line} not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {shorten(str(exc))}") from None
    config = parse_config(document, policy or "binpack", str(path))
    if policy is not None and config.policy is not None and policy != config.policy:
        raise ConfigError(
            f"{path}: the profile enables the {config.policy} policy's plugin but --policy {policy} was given"
        )
    return config, config.policy or cast(Policy, policy or "binpack")
