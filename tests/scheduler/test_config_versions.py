"""`--config FILE` in the versions after 1.20: v1beta2, v1beta3 and v1, as an operator copies them from a newer
kube-scheduler.

The first story is the file a 1.34 kube-scheduler writes with `--write-config-to` (hand-written here in that exact
shape: every default spelled out, `weight: 0` on the plugins that do not score, every plugin's default arguments):
kubegpu must read it as the same profile. Then the version differences a reader meets (NodeResourcesFit's
scoringStrategy in place of the Least/MostAllocated plugins, multiPoint, the weights raised in v1beta3, the plugins
each version removed, PodTopologySpread's defaulting) and each version's refusals, the field named.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.scheduler import scores
from kubegpu.scheduler.config import ConfigError, load_config, parse_config

V1BETA1, V1BETA2, V1BETA3, V1 = (
    f"kubescheduler.config.k8s.io/{v}" for v in ("v1beta1", "v1beta2", "v1beta3", "v1")
)  # fmt: skip

# What `kube-scheduler --write-config-to` prints in 1.34 for a configuration naming only a kubeconfig (fields in
# its order: sigs.k8s.io/yaml sorts keys).
KUBE_SCHEDULER_1_34 = """\
apiVersion: kubescheduler.config.k8s.io/v1
clientConnection:
  acceptContentTypes: ""
  burst: 100
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: /etc/kubernetes/scheduler.conf
  qps: 50
enableContentionProfiling: true
enableProfiling: true
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  leaseDuration: 15s
  renewDeadline: 10s
  resourceLock: leases
  resourceName: kube-scheduler
  resourceNamespace: kube-system
  retryPeriod: 2s
parallelism: 16
percentageOfNodesToScore: 0
podInitialBackoffSeconds: 1
podMaxBackoffSeconds: 10
profiles:
- pluginConfig:
  - args:
      apiVersion: kubescheduler.config.k8s.io/v1
      kind: DefaultPreemptionArgs
      minCandidateNodesAbsolute: 100
      minCandidateNodesPercentage: 10
    name: DefaultPreemption
  - args:
      apiVersion: kubescheduler.config.k8s.io/v1
      filterTimeout: 10s
      kind: DynamicResourcesArgs
    name: DynamicResources
  - args:
      apiVersion: kubescheduler.config.k8s.io/v1
      hardPodAffinityWeight: 1
      ignorePreferredTermsOfExistingPods: false
      kind: InterPodAffinityArgs
    name: InterPodAffinity
  - args:
      apiVersion: kubescheduler.config.k8s.io/v1
      kind: NodeAffinityArgs
    name: NodeAffinity
  - args:
      apiVersion: kubescheduler.config.k8s.io/v1
      kind: NodeResourcesBalancedAllocationArgs
      resources:
      - name: cpu
        weight: 1
      - name: memory
        weight: 1
    name: NodeResourcesBalancedAllocation
  - args:
      apiVersion: kubescheduler.config.k8s.io/v1
      kind: NodeResourcesFitArgs
      scoringStrategy:
        resources:
        - name: cpu
          weight: 1
        - name: memory
          weight: 1
        type: LeastAllocated
    name: NodeResourcesFit
  - args:
      apiVersion: kubescheduler.config.k8s.io/v1
      defaultingType: System
      kind: PodTopologySpreadArgs
    name: PodTopologySpread
  - args:
      apiVersion: kubescheduler.config.k8s.io/v1
      bindTimeoutSeconds: 600
      kind: VolumeBindingArgs
    name: VolumeBinding
  plugins:
    bind: {}
    filter: {}
    multiPoint:
      enabled:
      - name: SchedulingGates
        weight: 0
      - name: PrioritySort
        weight: 0
      - name: NodeUnschedulable
        weight: 0
      - name: NodeName
        weight: 0
      - name: TaintToleration
        weight: 3
      - name: NodeAffinity
        weight: 2
      - name: NodePorts
        weight: 0
      - name: NodeResourcesFit
        weight: 1
      - name: VolumeRestrictions
        weight: 0
      - name: NodeVolumeLimits
        weight: 0
      - name: VolumeBinding
        weight: 0
      - name: VolumeZone
        weight: 0
      - name: PodTopologySpread
        weight: 2
      - name: InterPodAffinity
        weight: 2
      - name: DynamicResources
        weight: 0
      - name: DefaultPreemption
        weight: 0
      - name: NodeResourcesBalancedAllocation
        weight: 1
      - name: ImageLocality
        weight: 1
      - name: DefaultBinder
        weight: 0
    permit: {}
    postBind: {}
    postFilter: {}
    preBind: {}
    preEnqueue: {}
    preFilter: {}
    preScore: {}
    queueSort: {}
    reserve: {}
    score: {}
  schedulerName: default-scheduler
"""

# kube-scheduler's default weights from v1beta3 on; kubegpu's device score added at 1.
V1_WEIGHTS = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
}


def head(version: str) -> dict[str, Any]:
    return {"apiVersion": version, "kind": "KubeSchedulerConfiguration"}


def with_profile(version: str, plugins: dict[str, Any] | None = None, *config: dict[str, Any]) -> dict[str, Any]:
    profile: dict[str, Any] = {"schedulerName": "kubegpu"}
    if plugins is not None:
        profile["plugins"] = plugins
    if config:
        profile["pluginConfig"] = list(config)
    return {**head(version), "profiles": [profile]}


def args(name: str, **values: Any) -> dict[str, Any]:
    return {"name": name, "args": values}


def strategy(kind: str, **more: Any) -> dict[str, Any]:
    return args("NodeResourcesFit", scoringStrategy={"type": kind, **more})


def test_a_configuration_written_by_kube_scheduler_1_34_is_its_default_profile(tmp_path: Path) -> None:
    path = tmp_path / "kube-scheduler.yaml"
    path.write_text(KUBE_SCHEDULER_1_34)
    config, policy = load_config(path)
    # NodeResourcesFit's LeastAllocated strategy is kubegpu's spread policy, at NodeResourcesFit's weight.
    assert policy == "spread" and config.policy == "spread"
    assert dict(config.profile.weights) == {
        **V1_WEIGHTS,
        scores.LEAST_ALLOCATED: 1,
        scores.DEVICES: 1,
        scores.FRAGMENTATION: 5,
    }
    assert config.profile.filters_off == frozenset()
    assert config.profile.default_spread == scores.SYSTEM_DEFAULT_SPREAD
    assert config.profile.hard_pod_affinity_weight == 1
    assert config.scheduler_name == "default-scheduler"
    with pytest.raises(ConfigError, match="--policy binpack"):
        load_config(path, "binpack")


@pytest.mark.parametrize("version", [V1BETA3, V1])
def test_no_plugins_section_gives_the_v1beta3_weights_and_leaves_the_policy_to_the_flag(version: str) -> None:
    config = parse_config(head(version), "binpack")
    assert config.policy is None
    assert dict(config.profile.weights) == {
        **V1_WEIGHTS,
        scores.MOST_ALLOCATED: 1,
        scores.DEVICES: 1,
        scores.FRAGMENTATION: 5,
    }


def test_v1beta2_keeps_the_1_20_weights_without_node_prefer_avoid_pods() -> None:
    weights = dict(parse_config(head(V1BETA2), "spread").profile.weights)
    assert weights == {
        "NodeResourcesBalancedAllocation": 1,
        "ImageLocality": 1,
        "InterPodAffinity": 1,
        scores.LEAST_ALLOCATED: 1,
        "NodeAffinity": 1,
        "PodTopologySpread": 2,
        "TaintToleration": 1,
        scores.DEVICES: 1,
        scores.FRAGMENTATION: 5,
    }


@pytest.mark.parametrize("version", [V1BETA2, V1BETA3, V1])
def test_most_allocated_strategy_chooses_binpack_at_node_resources_fits_weight(version: str) -> None:
    score = {"enabled": [{"name": "NodeResourcesFit", "weight": 5}]}
    config = parse_config(with_profile(version, {"score": score}, strategy("MostAllocated")), "spread")
    assert config.policy == "binpack"
    assert config.profile.weight(scores.MOST_ALLOCATED) == 5 and config.profile.weight(scores.LEAST_ALLOCATED) == 0


SORTED = {"queueSort": {"enabled": [{"name": "PrioritySort"}]}}


@pytest.mark.parametrize(
    ("plugins", "expected", "off"),
    [
        ({"multiPoint": {"disabled": [{"name": "TaintToleration"}]}}, {"TaintToleration": 0, "NodeAffinity": 2},
         {"TaintToleration"}),
        ({"score": {"disabled": [{"name": "TaintToleration"}]}}, {"TaintToleration": 0}, set()),
        ({"multiPoint": {"enabled": [{"name": "NodeAffinity", "weight": 7}]}}, {"NodeAffinity": 7}, set()),
        ({"score": {"enabled": [{"name": "NodeAffinity"}]}}, {"NodeAffinity": 1}, set()),
        ({"score": {"disabled": [{"name": "*"}], "enabled": [{"name": "ImageLocality", "weight": 4}]}},
         {"ImageLocality": 4, "TaintToleration": 0, scores.MOST_ALLOCATED: 0}, set()),
        # kube-scheduler needs its one QueueSort plugin back after `*` ("no queue sort plugin is enabled")
        ({"multiPoint": {"disabled": [{"name": "*"}]}, **SORTED}, {"TaintToleration": 0, scores.DEVICES: 0},
         set(scores.FILTER_PLUGINS)),
        ({"multiPoint": {"disabled": [{"name": "*"}]}, "filter": {"enabled": [{"name": "NodeResourcesFit"}]},
          **SORTED}, {}, set(scores.FILTER_PLUGINS) - {"NodeResourcesFit"}),
        ({"filter": {"disabled": [{"name": "NodePorts"}, {"name": "VolumeZone"}]}}, {"NodeAffinity": 2},
         {"NodePorts"}),
    ],
    ids=["multipoint-disable-both", "score-disable-keeps-filter", "multipoint-reweigh", "score-enable-weight-1",
         "score-disable-all-then-enable", "multipoint-disable-all", "then-enable-one-filter", "filter-disable"],
)  # fmt: skip
def test_multi_point_merges_as_kube_scheduler_expands_it(
    plugins: dict[str, Any], expected: dict[str, int], off: set[str]
) -> None:
    profile = parse_config(with_profile(V1, plugins)).profile
    assert {name: profile.weight(name) for name in expected} == expected
    assert profile.filters_off == off


@pytest.mark.parametrize(
    ("spread", "version", "expected"),
    [
        ({"defaultConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]},
         V1BETA1, 1),
        ({"defaultingType": "List"}, V1, 0),
        ({}, V1, 2),
    ],
    ids=["v1beta1-list-without-type-is-list", "v1-list-without-constraints-is-off", "v1-absent-is-system"],
)  # fmt: skip
def test_pod_topology_spread_defaulting_per_version(spread: dict[str, Any], version: str, expected: int) -> None:
    document = with_profile(version, None, args("PodTopologySpread", **spread))
    assert len(parse_config(document).profile.default_spread) == expected


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (with_profile(V1BETA2, {"score": {"enabled": [{"name": "NodeResourcesLeastAllocated"}]}}),
         "profiles[0].plugins.score.enabled[0].name: kubescheduler.config.k8s.io/v1beta2 has no plugin "
         "'NodeResourcesLeastAllocated'; use NodeResourcesFit's scoringStrategy type LeastAllocated"),
        (with_profile(V1BETA2, {"multiPoint": {"enabled": [{"name": "NodeAffinity"}]}}),
         "profiles[0].plugins.multiPoint: v1beta3 and later have multiPoint"),
        ({**head(V1BETA2), "profiles": [{"percentageOfNodesToScore": 20}]},
         "profiles[0].percentageOfNodesToScore: v1beta3 and later have it"),
        (with_profile(V1BETA3, {"score": {"enabled": [{"name": "NodePreferAvoidPods", "weight": 10000}]}}),
         "profiles[0].plugins.score.enabled[0].name: kubescheduler.config.k8s.io/v1beta3 has no plugin "
         "'NodePreferAvoidPods'"),
        (with_profile(V1BETA3, {"score": {"enabled": [{"name": "SelectorSpread"}]}}),
         "profiles[0].plugins.score.enabled[0].name: kubescheduler.config.k8s.io/v1beta3 has no plugin "
         "'SelectorSpread'"),
        (with_profile(V1, {"multiPoint": {"enabled": [{"name": "EBSLimits"}]}}),
         "profiles[0].plugins.multiPoint.enabled[0].name: kubescheduler.config.k8s.io/v1 has no plugin 'EBSLimits'"),
        (with_profile(V1, {"multiPoint": {"enabled": [{"name": "NodeAfinity"}]}}),
         "profiles[0].plugins.multiPoint.enabled[0].name: unknown plugin 'NodeAfinity'"),
        (with_profile(V1, {"score": {"enabled": [{"name": "NodePorts"}]}}),
         "profiles[0].plugins.score.enabled[0].name: 'NodePorts' is not a score plugin kubegpu runs"),
        (with_profile(V1, {"score": {"enabled": [{"name": "NodeAffinity", "weight": -1}]}}),
         "profiles[0].plugins.score.enabled[0].weight"),
        (with_profile(V1, {"placementScore": {}}), "profiles[0].plugins.placementScore"),
        (with_profile(V1, None, strategy("RequestedToCapacityRatio")),
         "profiles[0].pluginConfig[0].args.scoringStrategy.type: kubegpu does not implement RequestedToCapacityRatio"),
        (with_profile(V1, None, strategy("MostAllocated", resources=[{"name": "cpu", "weight": 3},
                                                                    {"name": "memory", "weight": 1}])),
         "profiles[0].pluginConfig[0].args.scoringStrategy.resources: kubegpu scores cpu and memory with equal"),
        (with_profile(V1, None, strategy("MostAllocated", resources=[{"name": "cpu", "weight": 101}])),
         "profiles[0].pluginConfig[0].args.scoringStrategy.resources[0].weight"),
        (with_profile(V1, None, strategy("Binpack")), "profiles[0].pluginConfig[0].args.scoringStrategy.type"),
        (with_profile(V1, None, args("NodeResourcesBalancedAllocation", resources=[{"name": "nvidia.com/gpu"}])),
         "profiles[0].pluginConfig[0].args.resources: kubegpu scores cpu and memory"),
        (with_profile(V1, None, args("PodTopologySpread", defaultConstraints=[
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}])),
         "profiles[0].pluginConfig[0].args.defaultingType: System takes no defaultConstraints"),
        (with_profile(V1, None, args("InterPodAffinity", ignorePreferredTermsOfExistingPods=True)),
         "profiles[0].pluginConfig[0].args.ignorePreferredTermsOfExistingPods: kubegpu does not implement it"),
        (with_profile(V1, None, args("InterPodAffinity", hardPodAffinityWeight=101)),
         "profiles[0].pluginConfig[0].args.hardPodAffinityWeight"),
        (with_profile(V1, None, args("DefaultPreemption", minCandidateNodesPercentage=101)),
         "profiles[0].pluginConfig[0].args.minCandidateNodesPercentage"),
        (with_profile(V1, None, args("VolumeBinding", shape=[{"utilization": 0, "score": 0}])),
         "profiles[0].pluginConfig[0].args.shape: kubegpu does not score volumes"),
        (with_profile(V1, None, args("NodeAffinity", kind="NodeResourcesFitArgs")),
         "profiles[0].pluginConfig[0].args.kind: 'NodeResourcesFitArgs' is not NodeAffinityArgs"),
        (with_profile(V1, None, args("TaintToleration", tolerance=1)),
         "profiles[0].pluginConfig[0].args.tolerance: TaintToleration takes no arguments"),
        (with_profile(V1, None, args("NodeAffinity"), args("NodeAffinity")),
         "profiles[0].pluginConfig[1].name: a second pluginConfig for 'NodeAffinity'"),
        ({**head(V1), "healthzBindAddress": "0.0.0.0:10251"}, "healthzBindAddress"),
        ({**head(V1), "percentageOfNodesToScore": 101}, "percentageOfNodesToScore"),
    ],
    ids=["v1beta2-least-allocated-removed", "v1beta2-no-multipoint", "v1beta2-no-profile-percentage",
         "v1beta3-no-prefer-avoid", "v1beta3-no-selector-spread", "v1-no-ebs-limits", "v1-unknown",
         "v1-filter-as-score", "v1-negative-weight", "v1-unknown-extension-point", "ratio-strategy",
         "unequal-resource-weights", "resource-weight-over-100", "unknown-strategy", "balanced-other-resource",
         "v1-list-needs-list-type", "ignore-preferred-terms", "hard-weight", "preemption-percentage",
         "volume-shape", "wrong-args-kind", "args-for-a-plugin-without", "duplicate-plugin-config",
         "v1-removed-healthz", "percentage-range"],
)  # fmt: skip
def test_newer_versions_mistakes_are_refused_naming_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(document)
    assert f"KubeSchedulerConfiguration.{message}" in str(refused.value)


@pytest.mark.parametrize("version", [V1BETA1, V1BETA2, V1BETA3, V1])
@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (args("NodeAffinity", addedAffinity={"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}),
         "args.addedAffinity: kubegpu does not implement it"),
        (args("NodeResourcesFit", ignoredResources=["example.com/foo"]),
         "args.ignoredResources: kubegpu does not implement it"),
        (args("NodeResourcesFit", ignoredResourceGroups=["example.com"]),
         "args.ignoredResourceGroups: kubegpu does not implement it"),
        (args("NodeAffinity", addedAffinty={}), "args.addedAffinty"),
    ],
    ids=["added-affinity", "ignored-resources", "ignored-resource-groups", "misspelt"],
)  # fmt: skip
def test_arguments_kubegpu_does_not_implement_are_refused_not_ignored(
    version: str, entry: dict[str, Any], message: str
) -> None:
    """Issue 21: these were accepted and silently ignored, so a pod kube-scheduler keeps off a node landed there."""
    with pytest.raises(ConfigError) as refused:
        parse_config(with_profile(version, None, entry))
    assert f"KubeSchedulerConfiguration.profiles[0].pluginConfig[0].{message}" in str(refused.value)


@pytest.mark.parametrize("version", [V1BETA1, V1BETA2, V1BETA3, V1])
def test_empty_arguments_kubegpu_lacks_are_the_defaults_and_accepted(version: str) -> None:
    entries = [args("NodeAffinity", addedAffinity=None), args("NodeResourcesFit", ignoredResources=[])]
    assert parse_config(with_profile(version, None, *entries)).profile.filters_off == frozenset()


FIXTURES = Path(__file__).parent.parent / "fixtures" / "scheduler-config"


def test_the_file_kube_scheduler_1_20_2_wrote_is_its_default_profile() -> None:
    """`kube-scheduler --write-config-to` output of the real 1.20.2 binary (recorded by
    `tests/integration/test_default_profile.py`'s run; the kubeconfig path replaced): `weight: 0` on every plugin
    that does not score, NodePreferAvoidPods at 10000, the volume filters kubegpu has nothing to run for. kubegpu
    refused it (weights were 1..1000, VolumeZone could not be enabled)."""
    config, policy = load_config(FIXTURES / "kube-scheduler-1.20.2.yaml")
    assert policy == "spread"  # it enables NodeResourcesLeastAllocated, kube-scheduler's policy
    assert config.profile.weights == scores.Profile.default("spread").weights
    assert config.profile.weight("NodePreferAvoidPods") == 10000
    assert config.profile.filters_off == frozenset()


def test_v1beta1_refuses_what_later_versions_added() -> None:
    with pytest.raises(ConfigError, match=r"pluginConfig\[0\]\.args\.scoringStrategy: v1beta2 and later"):
        parse_config(with_profile(V1BETA1, None, strategy("MostAllocated")))
    with pytest.raises(ConfigError, match=r"profiles\[0\]\.plugins\.multiPoint"):
        parse_config(with_profile(V1BETA1, {"multiPoint": {}}))
    with pytest.raises(ConfigError, match=r"args\.resources: kubegpu scores cpu and memory"):
        parse_config(with_profile(V1BETA1, None, args("NodeResourcesMostAllocated", resources=[{"name": "gpu"}])))


def test_the_1_34_file_round_trips_through_the_simulator_flag(tmp_path: Path) -> None:
    """The same document, loaded as YAML by the loader kubegpu's commands use, and a second copy that a user edited
    to pack: the policy follows the strategy."""
    document = yaml.safe_load(KUBE_SCHEDULER_1_34)
    for entry in document["profiles"][0]["pluginConfig"]:
        if entry["name"] == "NodeResourcesFit":
            entry["args"]["scoringStrategy"]["type"] = "MostAllocated"
    path = tmp_path / "binpack.yaml"
    path.write_text(yaml.safe_dump(document))
    assert load_config(path, "binpack")[1] == "binpack"


def test_simulate_reads_a_v1_file(tmp_path: Path) -> None:
    """`kubegpu simulate --config` with a v1 profile that turns NodeAffinity's score off at `multiPoint`: the pod's
    preference for zone b no longer decides, as with the same file live."""
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
    config.write_text(yaml.safe_dump(with_profile(V1, {"score": {"disabled": [{"name": "NodeAffinity"}]}})))

    def placed(*extra: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "kubegpu", "simulate", "--json", *extra, str(cluster)],
            capture_output=True, text=True, check=True, env={"KUBEGPU_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": ""},
        )  # fmt: skip
        return str(yaml.safe_load(run.stdout)["node"])

    assert placed() == "b1"
    assert placed("--config", str(config)) == "a1"
