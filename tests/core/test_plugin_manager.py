"""The plugin manager: discovery through entry points, the allowlist and autoload switches, and isolation.

What a user notices: built-in and third-party plugins are found the same way; a plugin that cannot be
imported, registers a hook kubegpu does not know, claims a resource another plugin owns, or raises inside a
hook is named in the report while every other plugin keeps working.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import kubegpu
from kubegpu.core import device_hooks, plugin_manager, scheduler_hooks
from kubegpu.core.plugin_manager import (
    ALLOW_ENV,
    DISABLE_AUTOLOAD_ENV,
    KubegpuPluginManager,
    PluginHookError,
    make_plugin_manager,
)
from kubegpu.core.status import Status
from kubegpu.core.testing import make_pod

BUILT_INS = ["intel-gas", "neuron", "nvidia"]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)


def plugin(name: str, side: str = "scheduler", /, **hooks: Callable[..., Any]) -> types.ModuleType:
    """A plugin module whose attributes are the given hook implementations (`fit=lambda state, pod: ...`)."""
    marker = scheduler_hooks.hookimpl if side == "scheduler" else device_hooks.hookimpl
    module = types.ModuleType(name)
    for hook, function in hooks.items():
        setattr(module, f"kubegpu_{side}_{hook}", marker(function))
    return module


def owning(name: str, *resources: str, **hooks: Callable[..., Any]) -> types.ModuleType:
    return plugin(name, resources=lambda: list(resources), **hooks)


@dataclass
class FakeDistribution:
    name: str = "acme-plugins"
    version: str = "1.2.0"

    @property
    def metadata(self) -> dict[str, str]:
        return {"Name": self.name, "Version": self.version}


@dataclass
class FakeEntryPoint:
    """What `importlib_metadata.entry_points()` yields: a name, a distribution and a `load()`."""

    name: str
    target: Callable[[], object]
    dist: FakeDistribution | None = field(default_factory=FakeDistribution)

    def load(self) -> object:
        return self.target()


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeEntryPoint]]:
    """Replace the installed `kubegpu.scheduler` entry points with the ones a test appends."""
    points: list[FakeEntryPoint] = []

    def fake_entry_points(group: str) -> list[FakeEntryPoint]:
        return list(points) if group == "kubegpu.scheduler" else []

    monkeypatch.setattr(plugin_manager, "entry_points", fake_entry_points)
    yield points


def _missing_sdk() -> object:
    raise ImportError("No module named 'vendor_sdk'")


# ------------------------------------------------------------------------------------------------------------
# Discovery of the built-in plugins
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["scheduler", "device"])
def test_built_in_plugins_are_found_through_entry_points_of_the_kubegpu_distribution(side: Any) -> None:
    manager = make_plugin_manager(side)

    assert set(BUILT_INS) <= set(manager.names)
    for name in BUILT_INS:
        record = manager.records[name]
        assert (record.distribution, record.version) == ("kubegpu", kubegpu.__version__)
        assert f"kubegpu_{side}_resources" in record.hooks
        assert record.resources, f"{name} owns no resource on the {side} side"
    assert manager.failures == []


@pytest.mark.parametrize(
    ("resource", "owner"),
    [
        ("nvidia.com/gpu", "nvidia"),
        ("aws.amazon.com/neuron", "neuron"),
        ("gpu.intel.com/i915", "intel-gas"),
        ("gpu.intel.com/memory.max", "intel-gas"),
        ("example.com/unknown", None),
        ("cpu", None),
    ],
    ids=["nvidia", "neuron", "intel-prefix", "intel-prefix-other", "unowned", "cpu"],
)
@pytest.mark.parametrize("side", ["scheduler", "device"])
def test_each_requested_resource_is_routed_to_the_plugin_that_owns_it(
    side: Any, resource: str, owner: str | None
) -> None:
    assert make_plugin_manager(side).owner_of(resource) == owner


# ------------------------------------------------------------------------------------------------------------
# Allowlist and autoload switch
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "allow", "expected"),
    [
        (None, ["nvidia"], ["nvidia"]),
        ("neuron, nvidia", None, ["neuron", "nvidia"]),
        ("neuron", ["intel-gas"], ["intel-gas"]),
        ("  ", None, BUILT_INS),
        (None, [], []),
    ],
    ids=["allow-argument", "environment", "argument-wins", "blank-environment-means-all", "empty-allowlist"],
)
def test_the_allowlist_keeps_only_the_named_plugins(
    monkeypatch: pytest.MonkeyPatch, env: str | None, allow: list[str] | None, expected: list[str]
) -> None:
    if env is not None:
        monkeypatch.setenv(ALLOW_ENV, env)

    manager = make_plugin_manager("scheduler", allow=allow)

    assert sorted(n for n in manager.names if n in BUILT_INS) == expected


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_disabling_autoload_leaves_only_explicitly_given_plugins(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, value)

    manager = make_plugin_manager("scheduler", plugins=[("mine", owning("mine", "example.com/card"))])

    assert manager.names == ["mine"]
    assert manager.owner_of("example.com/card") == "mine"
    assert manager.owner_of("nvidia.com/gpu") is None


def test_autoload_stays_on_when_the_switch_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "0")

    assert set(BUILT_INS) <= set(make_plugin_manager("device").names)


def test_the_pytest_fixture_builds_a_manager_with_just_the_named_plugins(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
) -> None:
    manager = make_plugin_manager("scheduler", card=owning("card", "example.com/card"))

    assert manager.names == ["card"]
    assert manager.records["card"].distribution is None


# ------------------------------------------------------------------------------------------------------------
# Broken plugins are named and isolated
# ------------------------------------------------------------------------------------------------------------


def test_a_plugin_that_fails_to_import_is_reported_and_the_others_still_load(
    installed: list[FakeEntryPoint],
) -> None:
    installed.append(FakeEntryPoint("broken", _missing_sdk))
    installed.append(FakeEntryPoint("card", lambda: owning("card", "example.com/card")))

    manager = make_plugin_manager("scheduler")

    assert manager.names == ["card"]
    assert manager.records["card"].distribution == "acme-plugins"
    assert manager.records["card"].version == "1.2.0"
    assert manager.owner_of("example.com/card") == "card"
    [failure] = manager.failures
    assert (failure.name, failure.side, failure.stage) == ("broken", "scheduler", "load")
    assert failure.error == "ImportError: No module named 'vendor_sdk'"
    assert str(failure) == ("plugin 'broken' (scheduler) failed at load: ImportError: No module named 'vendor_sdk'")


def _exits_at_import() -> object:
    raise SystemExit("acme: set ACME_LICENSE first")  # a module that parses its settings (argparse, click) on import


def test_a_plugin_that_exits_while_it_is_imported_is_reported_and_the_others_still_load(
    installed: list[FakeEntryPoint],
) -> None:
    """A plugin module that calls `sys.exit` (or argparse's error) while it is imported ended the process that
    loaded it (the scheduler, the shim, `kubegpu plugins list`) instead of being listed as failed and left out."""
    installed.append(FakeEntryPoint("exits", _exits_at_import))
    installed.append(FakeEntryPoint("card", lambda: owning("card", "example.com/card")))

    manager = make_plugin_manager("scheduler")

    assert manager.names == ["card"]
    [failure] = manager.failures
    assert str(failure) == "plugin 'exits' (scheduler) failed at load: SystemExit: acme: set ACME_LICENSE first"


def test_an_entry_point_outside_the_allowlist_is_never_imported(installed: list[FakeEntryPoint]) -> None:
    installed.append(FakeEntryPoint("broken", _missing_sdk))
    installed.append(FakeEntryPoint("card", lambda: owning("card", "example.com/card"), dist=None))

    manager = make_plugin_manager("scheduler", allow=["card"])

    assert manager.names == ["card"]
    assert manager.records["card"].distribution is None
    assert manager.failures == []


def test_a_plugin_raising_inside_a_hook_is_named_and_the_others_still_answer() -> None:
    def explode(state: object, pod: object) -> Status:
        raise RuntimeError("driver table corrupt")

    steady = owning("steady", "example.com/a", fit=lambda state, pod: Status.success(), validate=lambda pod: None)
    flaky = owning("flaky", "example.com/b", fit=explode, validate=lambda pod: 1 / 0)
    manager = make_plugin_manager("scheduler", plugins=[("steady", steady), ("flaky", flaky)], autoload=False)
    pod = make_pod(containers={"main": {"example.com/b": 1}})

    with pytest.raises(PluginHookError) as caught:
        manager.call("flaky", "kubegpu_scheduler_fit", state=object(), pod=pod)

    error = caught.value
    assert str(error) == "plugin 'flaky' failed in kubegpu_scheduler_fit: RuntimeError: driver table corrupt"
    assert (error.plugin, error.hook, type(error.original)) == (
        "flaky",
        "kubegpu_scheduler_fit",
        RuntimeError,
    )
    results = manager.call_each("kubegpu_scheduler_validate", pod=pod)
    assert results["steady"] is None
    assert isinstance(results["flaky"], PluginHookError)
    assert "plugin 'flaky' failed in kubegpu_scheduler_validate: ZeroDivisionError" in str(results["flaky"])
    assert manager.call("steady", "kubegpu_scheduler_fit", state=object(), pod=pod) == Status.success()
    assert manager.names == ["steady", "flaky"]


def test_a_plugin_implementing_an_unknown_hook_is_dropped_at_check_pending() -> None:
    typo = plugin("typo", resources=lambda: ["example.com/typo"], fitt=lambda state, pod: None)

    manager = make_plugin_manager(
        "scheduler", plugins=[("typo", typo), ("card", owning("card", "example.com/card"))], autoload=False
    )

    assert manager.names == ["card"]
    assert manager.owner_of("example.com/typo") is None
    [failure] = manager.failures
    assert (failure.name, failure.stage) == ("typo", "check_pending")
    assert "kubegpu_scheduler_fitt" in failure.error


def test_a_hook_with_an_argument_the_spec_lacks_is_refused_at_registration() -> None:
    odd = owning("odd", "example.com/odd", fit=lambda state, pod, node: None)

    manager = make_plugin_manager("scheduler", plugins=[("odd", odd)], autoload=False)

    assert manager.names == []
    [failure] = manager.failures
    assert (failure.name, failure.stage) == ("odd", "register")
    assert "kubegpu_scheduler_fit" in failure.error


@pytest.mark.parametrize(
    ("first", "second", "contested"),
    [
        (["example.com/card"], ["example.com/card", "example.com/other"], "example.com/card"),
        (["example.com/*"], ["example.com/card", "other.com/card"], "example.com/card"),
    ],
    ids=["same-name", "inside-a-claimed-prefix"],
)
def test_a_resource_claimed_twice_stays_with_the_first_plugin(
    first: list[str], second: list[str], contested: str
) -> None:
    manager = make_plugin_manager(
        "scheduler",
        plugins=[("alpha", owning("alpha", *first)), ("beta", owning("beta", *second))],
        autoload=False,
    )

    assert manager.owner_of(contested) == "alpha"
    assert manager.records["beta"].resources == [r for r in second if r != contested]
    [failure] = manager.failures
    assert (failure.name, failure.stage) == ("beta", "kubegpu_scheduler_resources")
    assert failure.error == f"resource {contested!r} is already owned by plugin 'alpha'"


def test_a_plugin_whose_resources_hook_raises_is_dropped() -> None:
    def broken() -> list[str]:
        raise OSError("cannot read catalog")

    manager = make_plugin_manager(
        "device",
        plugins=[("broken", plugin("broken", "device", resources=broken)), ("ok", plugin("ok", "device"))],
        autoload=False,
    )

    assert manager.names == ["ok"]
    [failure] = manager.failures
    assert (failure.name, failure.side, failure.stage) == ("broken", "device", "kubegpu_device_resources")
    assert failure.error == "OSError: cannot read catalog"


def test_two_plugins_under_one_name_keep_the_first() -> None:
    manager = make_plugin_manager(
        "scheduler",
        plugins=[("card", owning("card", "example.com/a")), ("card", owning("card", "example.com/b"))],
        autoload=False,
    )

    assert manager.owner_of("example.com/a") == "card"
    assert manager.owner_of("example.com/b") is None
    assert [(f.name, f.stage) for f in manager.failures] == [("card", "register")]


# ------------------------------------------------------------------------------------------------------------
# Calling one plugin
# ------------------------------------------------------------------------------------------------------------


def test_a_hook_may_accept_a_subset_of_the_specs_arguments() -> None:
    seen: list[object] = []

    def score(pod: object) -> float:
        seen.append(pod)
        return 42.0

    card = owning("card", "example.com/card", score=score)
    manager = make_plugin_manager("scheduler", plugins=[("card", card)], autoload=False)
    pod = make_pod()

    assert manager.call("card", "kubegpu_scheduler_score", state=object(), pod=pod) == 42.0
    assert seen == [pod]


def test_a_hook_the_plugin_does_not_implement_answers_none() -> None:
    manager = make_plugin_manager("scheduler", plugins=[("card", owning("card", "example.com/card"))], autoload=False)

    assert manager.implements("card", "kubegpu_scheduler_resources")
    assert not manager.implements("card", "kubegpu_scheduler_describe")
    assert not manager.implements("nobody", "kubegpu_scheduler_resources")
    assert manager.call("card", "kubegpu_scheduler_describe", state=object()) is None
    assert manager.records["card"].hooks == ["kubegpu_scheduler_resources"]


def test_each_distribution_s_metadata_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three built-in plugins come from one distribution; its metadata (4-5 ms a parse) is read once, not at each
    plugin's name and version (six parses, 27 ms of every start of a front-end)."""
    import importlib_metadata

    reads: list[str] = []
    original = importlib_metadata.PathDistribution.read_text

    def counting(self: Any, filename: str) -> Any:
        if filename in ("METADATA", "PKG-INFO"):
            reads.append(filename)
        return original(self, filename)

    monkeypatch.setattr(importlib_metadata.PathDistribution, "read_text", counting)
    manager = make_plugin_manager("scheduler")
    assert set(BUILT_INS) <= set(manager.names)
    assert len(reads) == 1


def _outcome(thunk: Callable[[], object]) -> object:
    """What a call gives: its answer, or the failure it raised (its text and whether it was counted)."""
    try:
        return ("answer", thunk())
    except PluginHookError as exc:
        return ("failed", str(exc), exc.plugin, exc.hook, type(exc.original).__name__)


@pytest.mark.parametrize(
    ("hook", "function"),
    [
        ("fit", lambda state, pod, prepared: Status.success()),
        ("fit", lambda state, pod: Status.unschedulable("full")),  # a subset of the arguments
        ("fit", lambda pod, state: Status.success() if state == "s" else None),  # another order
        ("fit", lambda state, pod, prepared: True),  # the contract's wrong answer
        ("fit", lambda state, pod, prepared: 1 / 0),
        ("fit", None),  # not implemented: a plugin with node states must implement it
        ("score", lambda state, pod, prepared: 70),
        ("score", lambda state, pod, prepared: "high"),
        ("score", lambda pod: 250),
        ("score", None),
        ("fragmentation", lambda state, pod, prepared, free: free["cpu"] / 1000),
        ("fragmentation", lambda state, pod, prepared, free: float("nan")),
        ("fragmentation", lambda state, free: "many"),
        ("fragmentation", lambda state, pod, prepared, free: exit(3)),  # a plugin that exits costs only itself
        ("fragmentation", lambda state, pod: None),
        ("prepare", None),  # hooks outside `bound`'s fast path go through `call`
    ],
)
def test_a_bound_hook_answers_and_fails_exactly_as_call(hook: str, function: Callable[..., Any] | None) -> None:
    """`bound`, the engine's direct path to the hot hooks, gives each answer `call` gives, checks it against the
    hook's contract as `call` does, and raises and counts a plugin's failure as `call` does."""
    hooks = {hook: function} if function is not None else {}
    names = {
        "fit": ("state", "pod", "prepared"),
        "score": ("state", "pod", "prepared"),
        "fragmentation": ("state", "pod", "prepared", "free"),
        "prepare": ("pod",),
    }[hook]
    values = {"state": "s", "pod": make_pod(), "prepared": "asked", "free": {"cpu": 4000, "memory": 1}}
    full = f"kubegpu_scheduler_{hook}"
    args = [values[name] for name in names]
    by_call = make_plugin_manager(
        "scheduler", plugins=[("card", owning("card", "example.com/c", **hooks))], autoload=False
    )
    by_bound = make_plugin_manager(
        "scheduler", plugins=[("card", owning("card", "example.com/c", **hooks))], autoload=False
    )
    bound = by_bound.bound("card", full, names)
    assert by_bound.bound("card", full, names) is bound  # made once

    called = _outcome(lambda: by_call.call("card", full, **dict(zip(names, args, strict=True))))
    assert _outcome(lambda: bound(*args)) == called
    assert by_bound.hook_failures == by_call.hook_failures


@pytest.mark.parametrize(
    ("path", "function"),
    [
        ("call", lambda state, pod, prepared: _sleep_then(Status.success())),
        ("direct", lambda state, pod, prepared: _sleep_then(Status.success())),
        ("picked", lambda pod, state: _sleep_then(Status.success())),  # a subset, in another order
        ("direct", lambda state, pod, prepared: _sleep_then(None) or 1 / 0),  # slow, then failing: both told
    ],
)
def test_a_slow_hook_is_logged_naming_the_plugin_counted_and_told(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, path: str, function: Callable[..., Any]
) -> None:
    """A vendor call hanging in a plugin's `fit` held every pod of every plugin for as long as it took, and nothing
    said which plugin: the engine cannot interrupt a hook. Each call over `SLOW_HOOK_SECONDS` is now counted, told to
    the listeners (the custom scheduler's metric) and logged naming the plugin, the hook and how long it took, once a
    minute per plugin and hook however many there are."""
    monkeypatch.setattr(plugin_manager, "SLOW_HOOK_SECONDS", 0.05)
    manager = make_plugin_manager(
        "scheduler", plugins=[("card", owning("card", "example.com/c", fit=function))], autoload=False
    )
    told: list[tuple[str, str, float]] = []
    manager.on_slow_hook.append(lambda plugin, hook, seconds: told.append((plugin, hook, seconds)))
    names = ("state", "pod", "prepared")
    values = ("s", make_pod(), "asked")
    fit = "kubegpu_scheduler_fit"

    for _ in range(3):
        if path == "call":
            _outcome(lambda: manager.call("card", fit, **dict(zip(names, values, strict=True))))
        else:
            _outcome(lambda: manager.bound("card", fit, names)(*values))

    assert manager.slow_hooks == {("card", fit): 3}
    assert [(plugin, hook) for plugin, hook, _ in told] == [("card", fit)] * 3
    assert all(seconds >= 0.05 for _, _, seconds in told)
    logged = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert len(logged) == 1, logged
    assert re.match(rf"plugin 'card' took \d+\.\d s in {fit} \(1 call\(s\) over", logged[0]), logged


def test_a_quick_hook_is_never_reported_slow() -> None:
    manager = make_plugin_manager(
        "scheduler",
        plugins=[("card", owning("card", "example.com/c", fit=lambda state, pod: Status.success()))],
        autoload=False,
    )
    for _ in range(100):
        manager.bound("card", "kubegpu_scheduler_fit", ("state", "pod", "prepared"))("s", make_pod(), None)
    assert not manager.slow_hooks


def _sleep_then(answer: Any) -> Any:
    import time

    time.sleep(0.06)
    return answer
