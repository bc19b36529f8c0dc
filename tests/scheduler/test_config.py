"""`--config FILE`: a KubeSchedulerConfiguration an operator already has, read as kube-scheduler reads it.

Each case is a file a platform team might write: turn a score off, weigh node affinity up, choose spread by
enabling NodeResourcesLeastAllocated, disable a filter; and the mistakes they make, refused with the field named.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.core.models import SpreadConstraint
from kubegpu.scheduler import scores
from kubegpu.scheduler.config import ConfigError, _GoYamlLoader, load_config, parse_config

HEAD = {"apiVersion": "kubescheduler.config.k8s.io/v1beta1", "kind": "KubeSchedulerConfiguration"}


def profile(**plugins: Any) -> dict[str, Any]:
    return {**HEAD, "profiles": [{"schedulerName": "kubegpu", "plugins": plugins}]}


def test_no_plugins_section_is_kube_schedulers_default_profile_with_kubegpus_scores() -> None:
    config = parse_config(HEAD)
    assert config.profile == scores.Profile.default("binpack")
    assert dict(config.profile.weights) == {
        "NodeResourcesBalancedAllocation": 1,
        "NodeAffinity": 1,
        "TaintToleration": 1,
        "InterPodAffinity": 1,
        "PodTopologySpread": 2,
        "KubegpuDevices": 1,
        "KubegpuFragmentation": 5,
        "ImageLocality": 1,
        "NodePreferAvoidPods": 10000,
        "NodeResourcesMostAllocated": 1,
    }
    assert config.policy is None and config.scheduler_name is None


@pytest.mark.parametrize(
    ("score", "expected"),
    [
        ({"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}, {"NodeResourcesBalancedAllocation": 0}),
        ({"enabled": [{"name": "NodeAffinity", "weight": 5}]}, {"NodeAffinity": 5, "PodTopologySpread": 2}),
        ({"disabled": [{"name": "*"}], "enabled": [{"name": "NodeAffinity"}]},
         {"NodeAffinity": 1, "TaintToleration": 0}),
        ({"disabled": [{"name": "ImageLocality"}, {"name": "NodePreferAvoidPods"}]}, {"InterPodAffinity": 1}),
        ({"disabled": [{"name": "PodTopologySpread"}], "enabled": [{"name": "PodTopologySpread", "weight": 7}]},
         {"PodTopologySpread": 7}),
    ],
    ids=["disable-one", "reweigh-a-default", "disable-all-then-enable", "disable-what-kubegpu-lacks", "re-enable"],
)  # fmt: skip
def test_score_plugins_merge_as_kube_scheduler_merges_them(score: dict[str, Any], expected: dict[str, int]) -> None:
    weights = parse_config(profile(score=score)).profile
    assert {name: weights.weight(name) for name in expected} == expected


def test_enabling_least_allocated_chooses_spread_and_replaces_binpacks_score() -> None:
    config = parse_config(profile(score={"enabled": [{"name": "NodeResourcesLeastAllocated"}]}))
    assert config.policy == "spread"
    assert config.profile.weight(scores.LEAST_ALLOCATED) == 1 and config.profile.weight(scores.MOST_ALLOCATED) == 0


def test_filters_can_be_turned_off_by_name_or_all_at_once() -> None:
    config = parse_config(profile(filter={"disabled": [{"name": "NodePorts"}, {"name": "VolumeZone"}]}))
    assert config.profile.filters_off == {"NodePorts"}
    everything = parse_config(profile(filter={"disabled": [{"name": "*"}], "enabled": [{"name": "NodeResourcesFit"}]}))
    assert "NodeResourcesFit" not in everything.profile.filters_off and "NodeAffinity" in everything.profile.filters_off


def test_other_settings_are_read() -> None:
    document = {
        **HEAD,
        "percentageOfNodesToScore": 30,
        "podInitialBackoffSeconds": 2,
        "podMaxBackoffSeconds": 20,
        "clientConnection": {"qps": 100},
        "profiles": [{"plugins": {"queueSort": {"enabled": [{"name": "PrioritySort"}]}},
                      "pluginConfig": [{"name": "InterPodAffinity", "args": {"hardPodAffinityWeight": 3}}]}],
    }  # fmt: skip
    config = parse_config(document)
    assert config.profile.percentage_of_nodes_to_score == 30 and config.profile.hard_pod_affinity_weight == 3
    assert (config.initial_backoff, config.max_backoff) == (2.0, 20.0)


def spread_args(**args: Any) -> dict[str, Any]:
    return {**HEAD, "profiles": [{"pluginConfig": [{"name": "PodTopologySpread", "args": args}]}]}


ZONE_SOFT = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
RACK_HARD = {"maxSkew": 1, "topologyKey": "example.com/rack", "whenUnsatisfiable": "DoNotSchedule"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, scores.SYSTEM_DEFAULT_SPREAD),
        ({"defaultingType": "System"}, scores.SYSTEM_DEFAULT_SPREAD),
        ({"defaultConstraints": []}, scores.SYSTEM_DEFAULT_SPREAD),  # 1.20: no defaultingType and no list is System
        ({"defaultingType": "List"}, ()),
        ({"defaultingType": "List", "defaultConstraints": []}, ()),
        (
            {"defaultConstraints": [ZONE_SOFT, RACK_HARD]},
            (
                SpreadConstraint(2, "topology.kubernetes.io/zone", "ScheduleAnyway", None),
                SpreadConstraint(1, "example.com/rack", "DoNotSchedule", None),
            ),
        ),
    ],
    ids=["absent", "system", "empty-list-alone", "list-without-constraints", "list-empty", "a-list"],
)
def test_pod_topology_spread_default_constraints_are_read_as_kube_scheduler_1_20_reads_them(
    args: dict[str, Any], expected: tuple[SpreadConstraint, ...]
) -> None:
    assert parse_config(spread_args(**args)).profile.default_spread == expected
    assert parse_config(HEAD).profile.default_spread == scores.SYSTEM_DEFAULT_SPREAD


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"defaultingType": "System", "defaultConstraints": [ZONE_SOFT]}, "args.defaultingType: System takes no"),
        ({"defaultingType": "Custom"}, "args.defaultingType"),
        ({"defaultConstraints": [{**ZONE_SOFT, "maxSkew": 0}]}, "args.defaultConstraints[0].maxSkew"),
        ({"defaultConstraints": [{**ZONE_SOFT, "topologyKey": "no spaces"}]},
         "args.defaultConstraints[0].topologyKey: 'no spaces' is not a valid label name"),
        ({"defaultConstraints": [{**ZONE_SOFT, "topologyKey": f"{'a' * 254}/zone"}]},
         "args.defaultConstraints[0].topologyKey: 'aaaa"),
        ({"defaultConstraints": [{**ZONE_SOFT, "whenUnsatisfiable": "Never"}]},
         "args.defaultConstraints[0].whenUnsatisfiable"),
        ({"defaultConstraints": [{**ZONE_SOFT, "labelSelector": {"matchLabels": {"app": "web"}}}]},
         "args.defaultConstraints[0].labelSelector: must not be set"),
        ({"defaultConstraints": [ZONE_SOFT, {**ZONE_SOFT, "maxSkew": 3}]},
         "args.defaultConstraints[1]: a second constraint for topology.kubernetes.io/zone with ScheduleAnyway"),
        ({"defaultConstraints": [ZONE_SOFT], "defaultSpread": True}, "args.defaultSpread"),
    ],
    ids=["system-with-a-list", "unknown-type", "zero-skew", "bad-key", "long-prefix", "bad-action", "a-selector",
         "repeated", "unknown-arg"],
)  # fmt: skip
def test_pod_topology_spread_args_mistakes_name_the_field(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(spread_args(**args))
    assert f"KubeSchedulerConfiguration.profiles[0].pluginConfig[0].{message}" in str(refused.value)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({**HEAD, "apiVersion": "kubescheduler.config.k8s.io/v1alpha1"},
         "apiVersion: 'kubescheduler.config.k8s.io/v1alpha1' is not one kubegpu reads"),
        ({**HEAD, "profile": []}, "profile"),
        (profile(score={"enabled": [{"name": "NodeAfinity"}]}),
         "profiles[0].plugins.score.enabled[0].name: unknown score plugin 'NodeAfinity'"),
        (profile(score={"enabled": [{"name": "SelectorSpread"}]}),
         "profiles[0].plugins.score.enabled[0].name: kubegpu does not implement the score plugin 'SelectorSpread'"),
        (profile(score={"disabled": [{"name": "Nope"}]}), "profiles[0].plugins.score.disabled[0].name"),
        (profile(score={"enabled": [{"name": "NodeAffinity", "weight": -1}]}), "weight"),
        (profile(score={"enabled": [{"name": "NodeAffinity", "weight": 2**31}]}), "weight"),
        (profile(score={"enabled": [{"name": "NodeResourcesLeastAllocated"}, {"name": "NodeResourcesMostAllocated"}]}),
         "exclude each other"),
        (profile(filter={"disabled": [{"name": "NodePort"}]}),
         "profiles[0].plugins.filter.disabled[0].name: unknown filter plugin 'NodePort'"),
        (profile(filter={"enabled": [{"name": "NodeLabel"}]}), "profiles[0].plugins.filter.enabled[0].name"),
        (profile(sorce={}), "sorce"),
        ({**HEAD, "profiles": [{}, {}]}, "profiles"),
        ({**HEAD, "profiles": [{"pluginConfig": [{"name": "InterPodAffinity",
                                                  "args": {"hardPodAffinityWeight": 101}}]}]},
         "pluginConfig[0].args.hardPodAffinityWeight"),
        ({**HEAD, "podInitialBackoffSeconds": 5, "podMaxBackoffSeconds": 2}, "podMaxBackoffSeconds"),
        ([], "expected a KubeSchedulerConfiguration object"),
        ({**HEAD, "parallelism": 99999999999}, "parallelism"),
        ({**HEAD, "parallelism": 0}, "parallelism"),
    ],
    ids=["api-version", "unknown-field", "unknown-score", "unimplemented-score", "unknown-disabled", "negative-weight",
         "weight-over-int32", "two-policies", "unknown-filter", "enable-unimplemented-filter",
         "unknown-extension-point", "two-profiles", "plugin-args", "backoff-order", "not-an-object",
         "parallelism-over-int32", "parallelism-zero"],
)  # fmt: skip
def test_mistakes_are_refused_naming_the_field(document: Any, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(document)
    assert message in str(refused.value)


def test_a_file_and_policy_flag_must_agree(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(profile(score={"enabled": [{"name": "NodeResourcesLeastAllocated"}]})))
    assert load_config(path, None)[1] == "spread"
    assert load_config(path, "spread")[1] == "spread"
    with pytest.raises(ConfigError, match="--policy binpack"):
        load_config(path, "binpack")
    path.write_text("apiVersion: [unclosed\n")
    with pytest.raises(ConfigError, match="line 2"):
        load_config(path)
    with pytest.raises(ConfigError, match="No such file"):
        load_config(tmp_path / "missing.yaml")


def test_simulate_reads_the_same_file(tmp_path: Path) -> None:
    """A profile that weighs node affinity at zero makes the simulator ignore a preference, as the live scheduler
    would with the same file."""
    nodes = [
        {"kind": "Node", "metadata": {"name": name, "labels": {"zone": zone}},
         "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "10"}}}
        for name, zone in (("a1", "a"), ("b1", "b"))
    ]  # fmt: skip
    preference = {
        "weight": 10,
        "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    }
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "m"}], "affinity": {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [preference]}}}}  # fmt: skip
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump_all([*nodes, pod]))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(profile(score={"disabled": [{"name": "NodeAffinity"}]})))

    def placed(*extra: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "kubegpu", "simulate", "--json", *extra, str(cluster)],
            capture_output=True, text=True, check=True, env={"KUBEGPU_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": ""},
        )  # fmt: skip
        return str(yaml.safe_load(run.stdout)["node"])

    assert placed() == "b1"
    assert placed("--config", str(config)) == "a1"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(profile(score={"enabled": [{"name": "Nope"}]})))
    refused = subprocess.run(
        [sys.executable, "-m", "kubegpu", "simulate", "--config", str(bad), str(cluster)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "unknown score plugin 'Nope'" in refused.stderr


def kubegpu_args(name: str, args: dict[str, Any], version: str = "v1beta1") -> dict[str, Any]:
    head = {**HEAD, "apiVersion": f"kubescheduler.config.k8s.io/{version}"}
    return {**head, "profiles": [{"pluginConfig": [{"name": name, "args": args}]}]}


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2", "v1beta3", "v1"])
def test_the_share_policy_and_the_mix_of_pods_are_read_from_kubegpus_plugin_args(version: str) -> None:
    """KubegpuDevices' `sharePolicy` and KubegpuFragmentation's `mix`, in every version kubegpu reads."""
    mix = [
        {"gpus": 1, "gpuMilli": 500, "cpuMilli": 4000, "weight": 3},
        {"gpus": 8, "weight": 1},
        {"gpus": 0, "cpuMilli": 16000, "weight": 2},  # a cpu-only pod: the FGD paper counts those too
    ]
    devices = parse_config(kubegpu_args("KubegpuDevices", {"sharePolicy": "bestfit"}, version))
    fragmentation = parse_config(kubegpu_args("KubegpuFragmentation", {"mix": mix}, version))
    assert devices.profile.share_policy == "bestfit"
    assert fragmentation.profile.fragmentation_mix == ((1, 500, 4000, 3.0), (8, 1000, 0, 1.0), (0, 1000, 16000, 2.0))
    assert fragmentation.profile.fragmentation_lead is True  # the default
    weighed = parse_config(kubegpu_args("KubegpuFragmentation", {"lead": False}, version))
    assert weighed.profile.fragmentation_lead is False
    assert fragmentation.profile.fragmentation_model_access is False  # the default
    access = parse_config(kubegpu_args("KubegpuFragmentation", {"modelAccess": True}, version))
    assert access.profile.fragmentation_model_access is True


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("KubegpuDevices", {"sharePolicy": "worstfit"}, "args.sharePolicy"),
        ("KubegpuFragmentation", {"mix": [{"gpus": 1, "weight": 0}]}, "args.mix[0].weight"),
        ("KubegpuFragmentation", {"mix": [{"gpus": 1, "gpuMilli": 1500, "weight": 1}]}, "args.mix[0].gpuMilli"),
        ("KubegpuFragmentation", {"mix": [{"gpus": 2, "gpuMilli": 500, "weight": 1}]}, "args.mix[0].gpuMilli"),
        ("KubegpuFragmentation", {"mix": [{"gpus": -1, "weight": 1}]}, "args.mix[0].gpus"),
        ("KubegpuFragmentation", {"mix": [{"gpus": 0, "gpuMilli": 500, "weight": 1}]}, "args.mix[0].gpuMilli"),
        ("KubegpuFragmentation", {"mix": [{"gpus": 1, "weight": 1, "memory": 5}]}, "args.mix[0].memory"),
        ("KubegpuFragmentation", {"mix": [{"gpus": 1, "weight": 1}] * 257}, "args.mix"),
        ("KubegpuFragmentation", {"lead": "yes"}, "args.lead"),
        ("KubegpuFragmentation", {"modelAccess": "true"}, "args.modelAccess"),
        ("KubegpuFragmentation", {"modelAccess": True, "mix": [{"gpus": 1, "weight": 1}]}, "args.modelAccess"),
    ],
    ids=[
        "unknown-policy",
        "zero-weight",
        "over-a-gpu",
        "several-gpus-shared",
        "fewer-than-no-gpu",
        "cpu-only-with-a-share",
        "unknown-field",
        "too-many",
        "lead-not-a-bool",
        "model-access-not-a-bool",
        "model-access-with-a-mix",
    ],
)
def test_kubegpu_plugin_args_mistakes_name_the_field(name: str, args: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(kubegpu_args(name, args))
    assert f"KubeSchedulerConfiguration.profiles[0].pluginConfig[0].{message}" in str(refused.value)


V1 = {**HEAD, "apiVersion": "kubescheduler.config.k8s.io/v1"}


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({**HEAD, "percentageOfNodesToScore": "16"}, "percentageOfNodesToScore"),
        ({**HEAD, "percentageOfNodesToScore": 16.0}, "percentageOfNodesToScore"),
        ({**HEAD, "podInitialBackoffSeconds": True}, "podInitialBackoffSeconds"),
        ({**HEAD, "parallelism": "16"}, "parallelism"),
        (profile(score={"enabled": [{"name": "NodeAffinity", "weight": True}]}),
         "profiles[0].plugins.score.enabled[0].weight"),
        ({**V1, "profiles": [{"percentageOfNodesToScore": 16.0}]}, "profiles[0].percentageOfNodesToScore"),
        ({**V1, "profiles": [{"plugins": {"multiPoint": {"enabled": [{"name": "NodeAffinity", "weight": "2"}]}}}]},
         "profiles[0].plugins.multiPoint.enabled[0].weight"),
        (kubegpu_args("InterPodAffinity", {"hardPodAffinityWeight": True}),
         "profiles[0].pluginConfig[0].args.hardPodAffinityWeight"),
        (kubegpu_args("KubegpuFragmentation", {"mix": [{"gpus": 1.0, "weight": 1}]}),
         "profiles[0].pluginConfig[0].args.mix[0].gpus"),
        (kubegpu_args("InterPodAffinity", {"ignorePreferredTermsOfExistingPods": "false"}, "v1"),
         "profiles[0].pluginConfig[0].args.ignorePreferredTermsOfExistingPods"),
    ],
    ids=["percentage-string", "percentage-float", "backoff-bool", "parallelism-string", "weight-bool",
         "profile-percentage-float", "multipoint-weight-string", "args-int-bool", "mix-gpus-float", "args-bool-string"],
)  # fmt: skip
def test_integers_and_booleans_are_read_strictly_as_kube_scheduler_reads_them(document: Any, field: str) -> None:
    """kube-scheduler decodes its configuration strictly: `true`, `"16"` or `16.0` where an integer belongs (and
    `"true"` where a boolean does) stops it with the field named; kubegpu took them as 1, 16 and 16."""
    with pytest.raises(ConfigError) as refused:
        parse_config(document)
    assert f"KubeSchedulerConfiguration.{field}" in str(refused.value)


def test_a_float_setting_takes_an_integer() -> None:
    """A float field (a mix kind's `weight`) takes `3` as JSON and kube-scheduler's decoding do."""
    config = parse_config(kubegpu_args("KubegpuFragmentation", {"mix": [{"gpus": 1, "weight": 3}]}))
    assert config.profile.fragmentation_mix == ((1, 1000, 0, 3.0),)


YAML_HEAD = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"


@pytest.mark.parametrize(
    ("body", "percentage", "weight"),
    [
        ("percentageOfNodesToScore: 16.0\n", 16, 2),
        ("percentageOfNodesToScore: 1e1\nparallelism: 1.6E+1\npodMaxBackoffSeconds: 2.0e1\n", 10, 2),
        ("profiles:\n- plugins:\n    score:\n      enabled:\n      - {name: NodeAffinity, weight: 3.0}\n", 0, 3),
        ("percentageOfNodesToScore: null\nprofiles:\n- schedulerName: null\n  plugins: {score: null}\n"
         "  pluginConfig:\n  - {name: InterPodAffinity, args: {hardPodAffinityWeight: null}}\n", 0, 2),
    ],
    ids=["integral-float", "exponents", "weight-float", "nulls"],
)  # fmt: skip
def test_a_yaml_file_kube_scheduler_reads_is_read(tmp_path: Path, body: str, percentage: int, weight: int) -> None:
    """kube-scheduler turns a YAML file into JSON before its strict decoding (sigs.k8s.io/yaml): `16.0` and `1e1`
    are numbers there, written to JSON as `16` and `10`, which an integer field takes; and a JSON `null` leaves a
    field as omitted (Go's encoding/json). kubegpu refused all four with "Input should be a valid integer"."""
    path = tmp_path / "config.yaml"
    path.write_text(YAML_HEAD + body)
    config, _ = load_config(path)
    assert (config.profile.percentage_of_nodes_to_score or 0) == percentage
    assert dict(config.profile.weights)["NodeAffinity"] == weight


def test_a_json_file_is_decoded_as_json_strictly(tmp_path: Path) -> None:
    """A file that is JSON (it starts with `{`) is decoded as JSON, where `16.0` is no integer (kube-scheduler
    refuses it too); an unknown field set to `null` is still unknown."""
    path = tmp_path / "config.json"
    path.write_text('{"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration", '
                    '"percentageOfNodesToScore": 16.0}')  # fmt: skip
    with pytest.raises(ConfigError, match="percentageOfNodesToScore: Input should be a valid integer"):
        load_config(path)
    path.write_text(YAML_HEAD + "percentageOfNodeToScore: null\n")
    with pytest.raises(ConfigError, match="percentageOfNodeToScore"):
        load_config(path)


@pytest.mark.parametrize(
    "body",
    [YAML_HEAD + "percentageOfNodesToScore: 10\npercentageOfNodesToScore: 20\n",
     YAML_HEAD + "profiles:\n- schedulerName: gpu\n  plugins: {}\n  schedulerName: kubegpu\n"],
    ids=["top-level", "in-a-profile"],
)  # fmt: skip
def test_a_field_given_twice_is_refused_as_kube_scheduler_refuses_it(tmp_path: Path, body: str) -> None:
    """kube-scheduler's strict decoding refuses a key set twice in a mapping (`key "..." already set in map`);
    kubegpu took the last one, so the file ran with whichever value its author did not notice."""
    path = tmp_path / "config.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError, match="given twice"):
        load_config(path)


@pytest.mark.parametrize(
    ("body", "read", "expected"),
    [
        ("profiles:\n- pluginConfig:\n  - {name: KubegpuFragmentation, args: {lead: n}}\n",
         lambda c: c.profile.fragmentation_lead, False),
        ("profiles:\n- pluginConfig:\n  - {name: InterPodAffinity, args: {ignorePreferredTermsOfExistingPods: N}}\n",
         lambda c: c.profile.hard_pod_affinity_weight, 1),
        ("profiles:\n- schedulerName: 2024-01-02\n", lambda c: c.scheduler_name, "2024-01-02"),
        ("percentageOfNodesToScore: 08\n", lambda c: c.profile.percentage_of_nodes_to_score, 8),
        ("percentageOfNodesToScore: 0o17\n", lambda c: c.profile.percentage_of_nodes_to_score, 15),
        ("profiles: [null]\n", lambda c: c == parse_config(V1), True),
        ("profiles:\n- plugins:\n    score:\n      disabled: [null, {name: ''}, {name: ImageLocality}]\n"
         "  pluginConfig: [null]\n", lambda c: "ImageLocality" in c.profile.weights, False),
    ],
    ids=["bool-n", "bool-N", "date-string", "leading-zero-decimal", "octal-0o", "null-profile", "unnamed-no-ops"],
)  # fmt: skip
def test_yaml_1_1_scalars_and_null_items_are_read_as_kube_scheduler_reads_them(
    tmp_path: Path, body: str, read: Any, expected: Any
) -> None:
    """kube-scheduler reads YAML with go-yaml v2 (YAML 1.1, through sigs.k8s.io/yaml) and where PyYAML differs, as
    go-yaml does: `y`, `Y`, `n` and `N` are booleans, a date is a string (go-yaml leaves it one in an untyped
    document), `08` is the number 8 and `0o17` is 15 (Go's number syntax), and a `null` list item is the item left
    empty (Go's decoding leaves it its zero value), so `profiles: [null]` is the default profile, and a disabled
    plugin or a plugin configuration of no name changes nothing. kubegpu refused each (`Input should be a valid
    boolean`, `... a valid string`, `... a valid integer`, `... a valid dictionary`). kube-scheduler 1.20.2 read
    each of these files so (`--write-config-to`: `percentageOfNodesToScore: 8`, `15`, `schedulerName: "2024-01-02"`,
    `default-scheduler`), and ran with the no-ops."""
    path = tmp_path / "config.yaml"
    path.write_text(YAML_HEAD + body)
    config, _ = load_config(path)
    assert read(config) == expected


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("profiles:\n- schedulerName: y\n", "profiles[0].schedulerName"),
        ("profiles:\n- schedulerName: 123\n", "profiles[0].schedulerName"),
        ("percentageOfNodesToScore: 1:10\n", "percentageOfNodesToScore"),
        ("enableProfiling: .inf\n", "enableProfiling"),
        ("profiles:\n- plugins:\n    ~: {}\n", "profiles[0].plugins"),
        ("profiles:\n- plugins:\n    score:\n      enabled: [null]\n", "profiles[0].plugins.score.enabled[0].name"),
        ("profiles:\n- pluginConfig: [null, {args: {}}]\n", "profiles[0].pluginConfig[1].name"),
    ],
    ids=["bool-for-a-string", "number-for-a-string", "sexagesimal", "infinity", "null-key", "null-enabled-plugin",
         "two-unnamed-plugin-configs"],
)  # fmt: skip
def test_yaml_kube_scheduler_refuses_is_refused_naming_the_field(tmp_path: Path, body: str, field: str) -> None:
    """What kube-scheduler refuses when it reads the file: `y` is a boolean, which no string field takes (kubegpu
    took the scheduler name `y`); `1:10` is a string to go-yaml, not YAML 1.1's sexagesimal 70 (kubegpu scored 70 %
    of the nodes); `.inf` and a `null` key cannot be written as JSON (kubegpu ignored them). A `null` item is read
    as the item left empty, which is refused where an empty one is: a plugin of no name enabled, two plugin
    configurations of no name. kube-scheduler 1.20.2 refused each of these files (`ReadString: expects " or n, but
    found t`, `readUint32: unexpected character`, `json: unsupported value: +Inf`, `Unsupported map key of type:
    <nil>`, `ScorePlugin "" does not exist`, `repeated config for plugin `)."""
    path = tmp_path / "config.yaml"
    path.write_text(YAML_HEAD + body)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert f"config.yaml.{field}:" in str(refused.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("y", True), ("Y", True), ("yes", True), ("ON", True), ("n", False), ("N", False), ("off", False),
     ("~", None), ("", None), ("Null", None), ("1_000", 1000), ("0x1F", 31), ("-0x1f", -31), ("0o17", 15),
     ("017", 15), ("0_7", 7), ("0b101", 5), ("-0b101", -5), ("+12", 12), ("08", 8.0), ("09.5", 9.5), ("1e3", 1e3),
     ("1.5E-3", 1.5e-3), (".5", 0.5), ("+.5", 0.5), ("1.", 1.0), ("1_0.5", 10.5), ("+.inf", float("inf")),
     ("-.Inf", float("-inf")), ("1:30", "1:30"), ("2001-12-14", "2001-12-14"), ("2001-12-14T21:59:43Z",
     "2001-12-14T21:59:43Z"), ("1e400", "1e400"), ("0x1p3", "0x1p3"), ("+.nan", "+.nan"), ("._5", "._5"),
     ("=", "="), ("0x", "0x"), ("yes please", "yes please")],
)  # fmt: skip
def test_a_plain_scalar_resolves_as_go_yaml_v2_resolves_it(text: str, value: Any) -> None:
    """go-yaml v2's `resolve` (kube-scheduler's YAML reader) scalar by scalar: its words, Go's integer and float
    syntax once underscores are out, and a string for anything else (a timestamp, a sexagesimal number, a float past
    float64's range)."""
    read = yaml.load(f"v: {text}\n", Loader=_GoYamlLoader)["v"]  # a SafeLoader
    assert read == value and type(read) is type(value), (text, read)
