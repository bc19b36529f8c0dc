"""PreEnqueue and QueueSort as plugins a profile names (kube-scheduler's SchedulingGates and PrioritySort), and a
`--config` file naming a third party's rules.

A user meets these as: a gated pod waits outside the queue unless the profile turns SchedulingGates off; the queue
tries pods in its QueueSort plugin's order; a configuration that leaves no QueueSort plugin, or names one kubegpu
does not have, is refused with kube-scheduler's words and the field; and a rule an installed plugin adds
(`kubegpu_scheduler_rules`, here `tests/fixtures/spot_rules`) is enabled, weighed and disabled in `--config` by its
name, as kube-scheduler's own plugins are.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from kubegpu.cli import main
from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.scheduler_hooks import hookimpl
from kubegpu.core.status import Code, Status
from kubegpu.core.testing import make_pod, node_manifest
from kubegpu.scheduler import scores, simulate
from kubegpu.scheduler.config import ConfigError, RuleNames, parse_config
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine, QueuedPod, rule_names
from kubegpu.scheduler.health import Metrics
from kubegpu.scheduler.queue import SchedulingQueue

from .test_scheduling_gates import GATES, bindings, gated
from .test_service_guards import KEY, RecordingWriter, schedule_all

V1BETA1, V1 = "kubescheduler.config.k8s.io/v1beta1", "kubescheduler.config.k8s.io/v1"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "spot_rules"


def document(version: str, plugins: dict[str, Any], **profile: Any) -> dict[str, Any]:
    return {"apiVersion": version, "kind": "KubeSchedulerConfiguration", "profiles": [{"plugins": plugins, **profile}]}


def bare_engine(profile: scores.Profile | None = None, **kwargs: Any) -> Engine:
    plugins = make_plugin_manager("scheduler", plugins=(), autoload=False)
    return Engine(plugins, signing_key=KEY, scoring=profile, **kwargs)


# -- PreEnqueue ----------------------------------------------------------------------------------------------------


def test_scheduling_gates_is_the_built_in_pre_enqueue_plugin_and_names_itself() -> None:
    engine = bare_engine()
    refusal = engine.pre_enqueue(PodRequest("default", "p", "u", (), scheduling_gates=("a", "b")))
    assert refusal is not None
    assert (refusal.code, refusal.plugin) == (Code.UNRESOLVABLE, "SchedulingGates")
    assert refusal.message == "SchedulingGated: waiting for scheduling gates: [a b]"
    assert engine.pre_enqueue(PodRequest("default", "q", "u", ())) is None


def test_a_v1_profile_that_disables_scheduling_gates_lets_a_gated_pod_be_tried() -> None:
    plugins = {"preEnqueue": {"disabled": [{"name": "SchedulingGates"}]}}
    profile = parse_config(document(V1, plugins)).profile
    assert profile.pre_enqueue_off == {"SchedulingGates"}
    # kube-scheduler then tries the pod too; a 1.26+ API server refuses its Binding. Here the writer accepts it.
    service = CustomScheduler(None, RecordingWriter(), bare_engine(profile), name="kubegpu")  # type: ignore[arg-type]
    service.mirror.on_nodes("SYNC", [node_manifest("n1", cpu="8")])
    service.mirror.on_pods("SYNC", [])
    service.mirror.on_pods("ADDED", gated("job-0"))
    schedule_all(service)
    assert bindings(service) == ["job-0"]
    assert not service.mirror.gated


@pytest.mark.parametrize(
    "plugins",
    [{"multiPoint": {"disabled": [{"name": "SchedulingGates"}]}}, {"preEnqueue": {"disabled": [{"name": "*"}]}}],
    ids=["multipoint", "all"],
)
def test_multi_point_or_a_star_turns_scheduling_gates_off(plugins: dict[str, Any]) -> None:
    assert parse_config(document(V1, plugins)).profile.pre_enqueue_off == {"SchedulingGates"}


def test_the_default_profiles_keep_scheduling_gates_and_priority_sort() -> None:
    for version in (V1BETA1, V1):
        profile = parse_config(document(version, {})).profile
        assert profile.pre_enqueue_off == frozenset() and profile.queue_sort == "PrioritySort"


def test_an_engine_takes_more_pre_enqueue_plugins_each_named_once() -> None:
    class HoldBatch:
        name = "HoldBatch"

        def pre_enqueue(self, pod: PodRequest) -> Status | None:
            return Status.unresolvable("batch pods wait for the night") if pod.labels.get("tier") == "batch" else None

    engine = bare_engine(pre_enqueue=[HoldBatch()])
    assert engine.pre_enqueue(make_pod("day", {"main": {"cpu": "1"}})) is None
    night = PodRequest("default", "night", "u", (), labels={"tier": "batch"})
    assert engine.pre_enqueue(night) == Status.unresolvable("batch pods wait for the night")
    with pytest.raises(ValueError, match="two PreEnqueue plugins named 'SchedulingGates'"):

        class Twin(HoldBatch):
            name = "SchedulingGates"

        bare_engine(pre_enqueue=[Twin()])


# -- QueueSort -----------------------------------------------------------------------------------------------------


def test_the_queue_takes_pods_in_its_queue_sort_plugins_order() -> None:
    class ByName:
        name = "ByName"

        def key(self, queued: QueuedPod) -> str:
            return queued.request.name

        def arrival_order(self, pods: Any) -> bool:
            return False

    default, by_name = SchedulingQueue("s", Metrics()), SchedulingQueue("s", Metrics(), sort=ByName())
    assert default.sort.name == "PrioritySort"
    for queue in (default, by_name):
        for name, priority in (("c", 0), ("b", 5), ("a", 0)):
            pod = PodRequest("default", name, name, (), scheduler_name="s", priority=priority)
            queue.observe(f"default/{name}", pod, "1", deleting=False, held=False)
    assert [entry.request.name for entry in default.pop_batch(3)] == ["b", "c", "a"]  # priority, then arrival
    assert [entry.request.name for entry in by_name.pop_batch(3)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("version", "plugins", "error"),
    [
        (V1BETA1, {"queueSort": {"disabled": [{"name": "PrioritySort"}]}},
         r"profiles\[0\]\.plugins\.queueSort: no queue sort plugin is enabled"),
        (V1, {"multiPoint": {"disabled": [{"name": "*"}]}},
         r"profiles\[0\]\.plugins\.queueSort: no queue sort plugin is enabled"),
        (V1, {"queueSort": {"enabled": [{"name": "FifoSort"}]}},
         r"profiles\[0\]\.plugins\.queueSort\.enabled\[0\]\.name: unknown queueSort plugin 'FifoSort' "
         r"\(known: PrioritySort\)"),
        (V1, {"preEnqueue": {"disabled": [{"name": "Gates"}]}},
         r"profiles\[0\]\.plugins\.preEnqueue\.disabled\[0\]\.name: unknown preEnqueue plugin 'Gates'"),
        (V1BETA1, {"preEnqueue": {"disabled": [{"name": "SchedulingGates"}]}},
         r"profiles\[0\]\.plugins\.preEnqueue"),  # 1.20 has no PreEnqueue
    ],
    ids=["v1beta1-none-left", "v1-star-leaves-none", "unknown-sort", "unknown-pre-enqueue", "v1beta1-has-none"],
)  # fmt: skip
def test_a_queue_sort_or_pre_enqueue_kube_scheduler_would_refuse_is_refused_naming_the_field(
    version: str, plugins: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_config(document(version, plugins))


def test_profiles_must_share_their_queue_sort() -> None:
    config = document(V1, {})
    config["profiles"].append({"schedulerName": "other", "plugins": {"queueSort": {"disabled": [{"name": "*"}]}}})
    with pytest.raises(ConfigError, match=r"profiles\[1\]\.plugins\.queueSort: has to match for all profiles"):
        parse_config(config)


# -- a third party's rules in --config ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spot() -> ModuleType:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(FIXTURE))
        return importlib.import_module("kubegpu_spot_rules")


def spot_rules(spot: ModuleType) -> RuleNames:
    return RuleNames(*rule_names(make_plugin_manager("scheduler", plugins=(("spot", spot.plugin),), autoload=False)))


def test_rule_names_come_from_the_installed_plugins(spot: ModuleType) -> None:
    assert spot_rules(spot) == RuleNames(frozenset({"NoSpotForCritical", "Broken"}), frozenset({"PreferCheap"}))


@pytest.mark.parametrize("version", [V1BETA1, "kubescheduler.config.k8s.io/v1beta2", V1])
def test_a_config_file_weighs_and_disables_a_third_partys_rules_by_name(spot: ModuleType, version: str) -> None:
    plugins = {
        "score": {"enabled": [{"name": "PreferCheap", "weight": 5}]},
        "filter": {"disabled": [{"name": "NoSpotForCritical"}]},
    }
    profile = parse_config(document(version, plugins), rules=spot_rules(spot)).profile
    assert profile.weights["PreferCheap"] == 5
    assert "NoSpotForCritical" in profile.filters_off and "Broken" not in profile.filters_off
    off = parse_config(document(version, {"score": {"disabled": [{"name": "PreferCheap"}]}}), rules=spot_rules(spot))
    assert "PreferCheap" in off.profile.scores_off


def test_multi_point_names_a_third_partys_rules_too(spot: ModuleType) -> None:
    plugins = {"multiPoint": {"disabled": [{"name": "Broken"}], "enabled": [{"name": "PreferCheap", "weight": 3}]}}
    profile = parse_config(document(V1, plugins), rules=spot_rules(spot)).profile
    assert profile.weights["PreferCheap"] == 3 and "Broken" in profile.filters_off


@pytest.mark.parametrize(
    ("version", "plugins", "error"),
    [
        (V1BETA1, {"score": {"enabled": [{"name": "PreferCheep"}]}},
         r"profiles\[0\]\.plugins\.score\.enabled\[0\]\.name: unknown score plugin 'PreferCheep' "
         r"\(known: .*PreferCheap\)"),
        (V1, {"filter": {"disabled": [{"name": "NoSpot"}]}},
         r"profiles\[0\]\.plugins\.filter\.disabled\[0\]\.name: unknown plugin 'NoSpot'"),
        (V1, {"score": {"enabled": [{"name": "NoSpotForCritical"}]}},
         r"profiles\[0\]\.plugins\.score\.enabled\[0\]\.name: 'NoSpotForCritical' is not a score plugin"),
    ],
    ids=["misspelt-score", "misspelt-filter", "a-filter-rule-as-a-score"],
)  # fmt: skip
def test_a_name_no_installed_plugin_has_is_still_refused_naming_the_field(
    spot: ModuleType, version: str, plugins: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_config(document(version, plugins), rules=spot_rules(spot))


def test_a_rule_takes_no_arguments(spot: ModuleType) -> None:
    config = document(V1, {}, pluginConfig=[{"name": "PreferCheap", "args": {"cheapest": True}}])
    with pytest.raises(ConfigError, match=r"pluginConfig\[0\]\.args\.cheapest: PreferCheap takes no arguments"):
        parse_config(config, rules=spot_rules(spot))


def test_kubegpu_simulate_reads_a_config_file_that_disables_an_installed_rule(
    spot: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the rule names the file was refused ("unknown filter plugin 'NoSpotForCritical'")."""
    manager = make_plugin_manager("scheduler", plugins=(("spot", spot.plugin),), autoload=False)
    monkeypatch.setattr(simulate, "make_plugin_manager", lambda *a, **k: manager)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(document(V1BETA1, {"filter": {"disabled": [{"name": "NoSpotForCritical"}]}})))
    cluster = tmp_path / "cluster.yaml"
    db = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db", "labels": {"tier": "critical"}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }  # fmt: skip
    cluster.write_text(
        yaml.safe_dump_all([node_manifest("spot-0", cpu="8", labels={"node.example.com/spot": "true"}), db])
    )
    assert main(["simulate", "--json", str(cluster), "--config", str(config)]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(e["pod"], e["node"]) for e in events if e.get("event") == "scheduled"] == [("default/db", "spot-0")]


def test_gates_are_shown_as_before() -> None:
    """The reason the simulator and the mirror give a gated pod is SchedulingGates' own."""
    engine = bare_engine()
    refusal = engine.pre_enqueue(PodRequest("default", "p", "u", (), scheduling_gates=tuple(GATES)))
    assert refusal is not None and refusal.message.startswith("SchedulingGated: waiting for scheduling gates: [")


# -- what a tenant or a broken plugin can do (docs/security.md T47, T48) --------------------------------------------


def test_a_plugin_whose_rules_hook_fails_adds_no_names_and_a_file_naming_its_rule_is_refused() -> None:
    """T47: the file reader never takes a name no working plugin has; the scheduler refuses the file naming the field
    instead of crashing or silently running without the rule the operator meant to weigh."""

    class Failing:
        @hookimpl
        def kubegpu_scheduler_resources(self) -> list[str]:
            return []

        @hookimpl
        def kubegpu_scheduler_rules(self) -> list[object]:
            raise RuntimeError("broken")

    manager = make_plugin_manager("scheduler", plugins=(("failing", Failing()),), autoload=False)
    assert rule_names(manager) == (frozenset(), frozenset())
    plugins = {"score": {"enabled": [{"name": "PreferCheap", "weight": 2}]}}
    with pytest.raises(ConfigError, match=r"score\.enabled\[0\]\.name: unknown score plugin 'PreferCheap'"):
        parse_config(document(V1BETA1, plugins), rules=RuleNames(*rule_names(manager)))


def test_a_tenants_gates_are_bounded_and_escaped_wherever_the_refusal_goes() -> None:
    """T48: ten thousand gate names of 300 characters with control characters in them."""
    gates = tuple(f"example.com/{i}\x1b[2J\r\n" + "g" * 300 for i in range(10_000))
    refusal = bare_engine().pre_enqueue(PodRequest("default", "p", "u", (), scheduling_gates=gates))
    assert refusal is not None
    assert len(refusal.message) < 4096 and refusal.message.isprintable() and "\x1b" not in refusal.message
    assert refusal.message.endswith("and 9992 more")


def test_a_pre_enqueue_plugin_that_raises_costs_only_the_pod_it_was_asked_about() -> None:
    """T48: an engine's PreEnqueue plugin that raises for one pod: that pod gets an internal-error Event, every
    other pod is scheduled, and the informer loop serves on."""

    class Fragile:
        name = "Fragile"

        def pre_enqueue(self, pod: PodRequest) -> Status | None:
            if pod.name == "poison":
                raise RuntimeError("cannot judge this pod")
            return None

    service = CustomScheduler(
        None,
        RecordingWriter(),
        bare_engine(pre_enqueue=[Fragile()]),
        name="kubegpu",  # type: ignore[arg-type]
    )
    service.mirror.on_nodes("SYNC", [node_manifest("n1", cpu="8")])
    service.mirror.on_pods("SYNC", [])
    for name in ("poison", "fine"):
        service.mirror.on_pods("ADDED", gated(name, []))
    schedule_all(service)
    assert bindings(service) == ["fine"]
    writer: RecordingWriter = service.binder.writer  # type: ignore[assignment]
    events = [body for method, path, body in writer.writes if path.endswith("/events")]
    assert any("KubegpuInternalError" in json.dumps(event) and "poison" in json.dumps(event) for event in events)
