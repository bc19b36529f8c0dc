"""The plugin manager: finds plugins through entry points, checks them, and calls them in isolation.

Built-in plugins and third-party plugins are found the same way, through the entry-point groups `kubegpu.scheduler`
and `kubegpu.device` (one group per hook specification). `make_plugin_manager` is the only way to build one: it adds
the specs, loads entry points (unless `KUBEGPU_DISABLE_PLUGIN_AUTOLOAD` is set), keeps only the plugins named in
`KUBEGPU_PLUGINS` when that is set, registers explicitly given plugins, and runs pluggy's `check_pending()`.

A plugin that fails to import or to register is recorded in `failures` with its name and left out: one that
implements a hook the spec lacks, one whose implementation is a pluggy wrapper (`wrapper`, `hookwrapper`) or carries
an ordering marker (`tryfirst`, `trylast`), a generator or a coroutine function, none of which means anything when
one plugin is called at a time. A plugin that raises inside a hook, or answers what the hook's contract does not
allow (`kubegpu.core.answers`), surfaces as `PluginHookError` naming the plugin and the hook, so the caller can turn
it into a reason for the pods that needed that plugin while every other plugin keeps working. Every such failure is
counted per plugin and hook (`hook_failures`) and handed to the listeners in `on_hook_failure` (the custom
scheduler's metric). A hook cannot be interrupted, and the engine asks one at a time, so a call that takes longer
than `SLOW_HOOK_SECONDS` holds every pod meanwhile: it is counted (`slow_hooks`), handed to `on_slow_hook` (the
custom scheduler's `kubegpu_scheduler_plugin_slow_calls_total`) and logged naming the plugin, the hook and how long
it took, at most once a minute per plugin and hook.

The plugin's name is its entry-point name everywhere; a plugin object with a `bind_plugin_name(name)` method (the
kit's classes) is told it at registration.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any, Literal

import pluggy
from importlib_metadata import entry_points

from kubegpu.core import device_hooks, scheduler_hooks
from kubegpu.core.answers import CHECKS, WrongAnswer
from kubegpu.core.text import safe_text

__all__ = [
    "ALLOW_ENV",
    "DISABLE_AUTOLOAD_ENV",
    "PLUGIN_ERRORS",
    "SLOW_HOOK_SECONDS",
    "KubegpuPluginManager",
    "PluginFailure",
    "PluginHookError",
    "PluginRecord",
    "Side",
    "WrongAnswer",
    "make_plugin_manager",
]

log = logging.getLogger("kubegpu.plugins")

# What a plugin's code may raise that is the plugin's failure: any exception, and `SystemExit` (a plugin that calls
# `sys.exit`, or parses its settings with argparse, on import or in a hook), which would otherwise end the process
# that called it (the scheduler, the shim) instead of costing that plugin. KeyboardInterrupt stays the operator's.
PLUGIN_ERRORS = (Exception, SystemExit)
# A hook call longer than this is reported (`KubegpuPluginManager.slow`): kube-scheduler's whole cycle for a pod is a
# few milliseconds, and a vendor library call hanging in a hook holds every pod behind it.
SLOW_HOOK_SECONDS = 1.0
SLOW_HOOK_LOG_EVERY = 60.0  # seconds between two logs of one plugin's slow calls of one hook
OWNERS_REMEMBERED = 4096  # extended resource names whose owner `owner_of` keeps; past it, all dropped at once

Side = Literal["scheduler", "device"]
DISABLE_AUTOLOAD_ENV = "KUBEGPU_DISABLE_PLUGIN_AUTOLOAD"
ALLOW_ENV = "KUBEGPU_PLUGINS"

_SPECS: Mapping[str, ModuleType] = {"scheduler": scheduler_hooks, "device": device_hooks}
PREPARE_HOOK = "kubegpu_scheduler_prepare"
# Arguments a caller may leave out: the manager computes them from the others the way the engine would.
_PREPARED_BY = frozenset(
    {
        "kubegpu_scheduler_fit",
        "kubegpu_scheduler_score",
        "kubegpu_scheduler_fragmentation",
        "kubegpu_scheduler_allocate",
    }
)
# Inputs added to a hook after its first release, and what an implementation that takes them gets from a caller that
# leaves them out (a test, a front-end written before them): `None`, which each hook's docstring allows.
_OPTIONAL_INPUTS: Mapping[str, frozenset[str]] = {
    "kubegpu_scheduler_build_node": frozenset({"shared"}),
    "kubegpu_scheduler_take": frozenset({"pod"}),
}


def _spec_hooks(module: ModuleType) -> frozenset[str]:
    marker = f"{module.PROJECT}_spec"
    return frozenset(name for name, value in vars(module).items() if callable(value) and hasattr(value, marker))


@dataclass
class PluginRecord:
    """What `kubegpu plugins list` shows about one registered plugin."""

    name: str
    side: str
    module: str
    distribution: str | None = None
    version: str | None = None
    hooks: list[str] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or registered, or whose registration hook failed."""

    name: str
    side: str
    stage: str
    error: str

    def __str__(self) -> str:
        return f"plugin {self.name!r} ({self.side}) failed at {self.stage}: {self.error}"


class PluginHookError(RuntimeError):
    """A plugin raised inside a hook, or broke its contract (`WrongAnswer`). The message names the plugin, the hook
    (and the node, for a node-level failure) and the original error."""

    def __init__(self, plugin: str, hook: str, original: BaseException, *, node: str | None = None) -> None:
        self.plugin = plugin
        self.hook = hook
        self.original = original
        self.node = node
        where = f" on node {node}" if node else ""
        # The plugin's own words (an exception's text: a vendor library's, a tenant's annotation quoted back) as one
        # bounded line: this message is logged and shown as a reason in every front-end, the simulator's and
        # `kubegpu plugins list`'s plain output included, which no log formatter escapes.
        super().__init__(
            f"plugin {plugin!r} failed{where} in {hook}: {type(original).__name__}: {safe_text(str(original))}"
        )

    def on_node(self, node: str) -> PluginHookError:
        """The same failure, naming the node it happened on (build_node, headroom)."""
        return PluginHookError(self.plugin, self.hook, self.original, node=node)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class KubegpuPluginManager:
    """A pluggy `PluginManager` for one side, with per-plugin calls and resource routing."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self.project = f"kubegpu.{side}"
        self.pm = pluggy.PluginManager(self.project)
        self.pm.add_hookspecs(_SPECS[side])
        self.records: dict[str, PluginRecord] = {}
        self.failures: list[PluginFailure] = []
        self._exact: dict[str, str] = {}
        self._prefixes: list[tuple[str, str]] = []
        self._owner_cache: dict[str, str | None] = {}
        # qualifying resource -> the resource it qualifies, as the plugins declared them (`_collect_qualifiers`)
        self.qualifiers: Mapping[str, str] = MappingProxyType({})
        self._impls: dict[tuple[str, str], tuple[Any, tuple[str, ...]] | None] = {}
        self._bound: dict[tuple[str, str, tuple[str, ...]], Callable[..., Any]] = {}
        self.hooks = _spec_hooks(_SPECS[side])
        self.hook_failures: Counter[tuple[str, str]] = Counter()
        self.on_hook_failure: list[Callable[[PluginHookError], None]] = []
        self.slow_hooks: Counter[tuple[str, str]] = Counter()
        self.on_slow_hook: list[Callable[[str, str, float], None]] = []
        self._slow_logged: dict[tuple[str, str], float] = {}
        self._warned: set[tuple[str, str]] = set()
        self.warnings: list[str] = []  # what `warn_once` logged: corrected answers, deprecated behaviour

    # -- registration ------------------------------------------------------------------------------------------

    def register(
        self, plugin: object, name: str, *, distribution: str | None = None, version: str | None = None
    ) -> bool:
        """Register one plugin object (usually a module). Returns False, recording a failure, when it is refused."""
        if name in self.records:
            self._fail(name, "register", f"another plugin is already registered as {name!r}")
            return False
        plugin = _hook_object(plugin, self.project)
        try:
            self.pm.register(plugin, name=name)
        except PLUGIN_ERRORS as exc:
            self._fail(name, "register", _describe(exc))
            return False
        refusal = self._refusal(plugin)
        if refusal is not None:
            self.pm.unregister(plugin)
            self._fail(name, "register", refusal)
            return False
        bind = getattr(plugin, "bind_plugin_name", None)
        if callable(bind) and not isinstance(plugin, ModuleType):
            try:
                bind(name)
            except PLUGIN_ERRORS as exc:
                self.pm.unregister(plugin)
                self._fail(name, "register", f"bind_plugin_name failed: {_describe(exc)}")
                return False
        module = getattr(plugin, "__name__", type(plugin).__qualname__)
        hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
        self.records[name] = PluginRecord(name, self.side, module, distribution, version, hooks)
        return True

    def _refusal(self, plugin: object) -> str | None:
        """Why a registered plugin's implementations cannot be called one plugin at a time, or None."""
        for caller in self.pm.get_hookcallers(plugin) or []:
            for impl in caller.get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                markers = [m for m in ("wrapper", "hookwrapper", "tryfirst", "trylast") if getattr(impl, m, False)]
                if markers:
                    return (
                        f"{caller.name} is marked {', '.join(f'{m}=True' for m in markers)}: kubegpu calls one "
                        "plugin's implementation at a time, so wrappers and ordering mean nothing; remove the marker"
                    )
                function = impl.function
                if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
                    return f"{caller.name} is a generator function: kubegpu needs the answer itself (return it)"
                if inspect.iscoroutinefunction(function):
                    return f"{caller.name} is a coroutine function: kubegpu calls hooks synchronously"
        return None

    def warn_once(self, plugin: str, topic: str, message: str) -> None:
        """Log a warning about a plugin once per topic (a corrected answer, a deprecated hook)."""
        if (plugin, topic) not in self._warned:
            self._warned.add((plugin, topic))
            self.warnings.append(message)
            log.warning("%s", message)

    def _fail(self, name: str, stage: str, error: str) -> None:
        failure = PluginFailure(name, self.side, stage, safe_text(error))  # an import error's text: one bounded line
        log.error("%s", failure)
        self.failures.append(failure)

    def _unregister(self, name: str) -> None:
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        self.records.pop(name, None)

    def _check_pending(self) -> None:
        """pluggy's `check_pending()`; a plugin implementing an unknown hook is dropped and recorded."""
        while True:
            try:
                self.pm.check_pending()
                return
            except pluggy.PluginValidationError as exc:
                name = self.pm.get_name(exc.plugin) or "?"
                self._fail(name, "check_pending", str(exc))
                self._unregister(name)

    def _collect_resources(self) -> None:
        hook = f"kubegpu_{self.side}_resources"
        for name in list(self.records):
            try:
                resources = self.call(name, hook)
            except PluginHookError as exc:
                self._fail(name, hook, _describe(exc.original))
                self._unregister(name)
                continue
            claimed = [str(r) for r in (resources or [])]
            for resource in claimed:
                owner = self.owner_of(resource)
                if owner is not None and owner != name:
                    self._fail(name, hook, f"resource {resource!r} is already owned by plugin {owner!r}")
                    continue
                if resource.endswith("/*"):
                    self._prefixes.append((resource[:-1], name))
                else:
                    self._exact[resource] = name
                self._owner_cache.clear()
                self.records[name].resources.append(resource)

    def _collect_qualifiers(self) -> None:
        """Each plugin's `kubegpu_scheduler_qualifiers`, read once; a wrong answer (or an exception) is recorded as
        a failure of that plugin's declaration alone: it keeps its resources, and none of its resources qualifies
        another."""
        hook = "kubegpu_scheduler_qualifiers"
        if hook not in self.hooks:
            return
        declared: dict[str, str] = {}
        for name in list(self.records):
            try:
                declared.update(self.call(name, hook) or {})
            except PluginHookError as exc:
                self._fail(name, hook, _describe(exc.original))
        self.qualifiers = MappingProxyType(declared)

    # -- routing and calls -------------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self.records)

    def owner_of(self, resource: str) -> str | None:
        """The plugin that owns an extended resource, or None."""
        try:
            return self._owner_cache[resource]
        except KeyError:
            pass
        owner = self._exact.get(resource)
        if owner is None:
            for prefix, name in self._prefixes:
                if resource.startswith(prefix):
                    owner = name
                    break
        if len(self._owner_cache) >= OWNERS_REMEMBERED:  # tenants name extended resources: one each, without end
            self._owner_cache.clear()
        self._owner_cache[resource] = owner
        return owner

    def _impl(self, plugin: str, hook: str) -> tuple[Any, tuple[str, ...]] | None:
        key = (plugin, hook)
        try:
            return self._impls[key]
        except KeyError:
            pass
        found = None
        caller = getattr(self.pm.hook, hook, None)
        if caller is not None:
            for impl in caller.get_hookimpls():
                if impl.plugin_name == plugin:
                    found = (impl.function, tuple(impl.argnames))
                    break
        self._impls[key] = found
        return found

    def implements(self, plugin: str, hook: str) -> bool:
        if hook not in self.hooks:
            raise ValueError(f"{hook!r} is not a hook of {self.project} (known: {', '.join(sorted(self.hooks))})")
        return self._impl(plugin, hook) is not None

    def call(self, plugin: str, hook: str, **kwargs: Any) -> Any:
        """Call one plugin's implementation of a hook and check its answer against the hook's contract.

        Returns the answer (or the correction the contract allows, `kubegpu.core.answers`), or None when the plugin
        does not implement the hook; for fit, allocate and take, which the engine asks only of a plugin that built
        a node state, a missing implementation is the plugin's failure (`PluginHookError`, naming the hook). An
        exception raised inside the hook, and an answer the contract does not allow, raise `PluginHookError` naming
        the plugin and the hook. A hook name that is not in the spec raises
        `ValueError` (the caller's mistake, not the plugin's).

        pluggy lets an implementation accept a subset of the spec's arguments; only those are passed. `prepared`,
        when the implementation takes it and the caller did not give it, is the plugin's own
        `kubegpu_scheduler_prepare` answer for `pod`.
        """
        if hook not in self.hooks:
            raise ValueError(f"{hook!r} is not a hook of {self.project} (known: {', '.join(sorted(self.hooks))})")
        impl = self._impl(plugin, hook)
        if impl is None:
            if hook in _PLACING:
                raise self.failed(
                    plugin,
                    hook,
                    NotImplementedError(
                        f"the plugin owns resources but does not implement {hook}; a plugin that builds node states "
                        f"must implement {', '.join(sorted(_PLACING))} for kubegpu to place its pods"
                    ),
                )
            return CHECKS[hook](self, plugin, None, kwargs) if hook in _NONE_CHECKED else None
        function, argnames = impl
        if "prepared" in argnames and "prepared" not in kwargs and hook in _PREPARED_BY:
            kwargs["prepared"] = self.call(plugin, PREPARE_HOOK, pod=kwargs["pod"])
        optional = _OPTIONAL_INPUTS.get(hook)
        if optional is not None:
            for name in optional:
                if name in argnames and name not in kwargs:
                    kwargs[name] = None
        began = time.perf_counter()
        try:
            answer = function(*[kwargs[a] for a in argnames])
            return CHECKS[hook](self, plugin, answer, kwargs) if hook in CHECKS else answer
        except PLUGIN_ERRORS as exc:
            raise self.failed(plugin, hook, exc) from exc
        finally:
            if (took := time.perf_counter() - began) > SLOW_HOOK_SECONDS:
                self.slow(plugin, hook, took)

    def bound(self, plugin: str, hook: str, names: tuple[str, ...]) -> Callable[..., Any]:
        """`call(plugin, hook, **dict(zip(names, values)))` as one callable taking the `values` positionally, made once
        per plugin, hook and `names`: for the engine's hot hooks (`_BOUND`, whose checks read only the answer) the
        plugin's implementation is called without `call`'s per-call lookups, and its answer is checked against the
        hook's contract (`CHECKS`) as `call` checks it, a failure raised as `PluginHookError` as `call` raises it.
        Any other hook, and an implementation that needs an argument `names` leaves out, goes through `call`."""
        key = (plugin, hook, names)
        known = self._bound.get(key)
        if known is None:
            known = self._bound[key] = self._bind(plugin, hook, names)
        return known

    def _bind(self, plugin: str, hook: str, names: tuple[str, ...]) -> Callable[..., Any]:
        if hook not in self.hooks:
            raise ValueError(f"{hook!r} is not a hook of {self.project} (known: {', '.join(sorted(self.hooks))})")
        impl = self._impl(plugin, hook)
        if hook not in _BOUND or impl is None or not set(impl[1]) <= set(names):

            def through_call(*values: Any) -> Any:
                return self.call(plugin, hook, **dict(zip(names, values, strict=True)))

            return through_call
        function, argnames = impl
        check, failed, unread, slow, clock = CHECKS[hook], self.failed, _UNREAD, self.slow, time.perf_counter
        if argnames == names:

            def direct(*values: Any) -> Any:
                began = clock()
                try:
                    return check(self, plugin, function(*values), unread)
                except PLUGIN_ERRORS as exc:
                    raise failed(plugin, hook, exc) from exc
                finally:
                    if (took := clock() - began) > SLOW_HOOK_SECONDS:
                        slow(plugin, hook, took)

            return direct
        picks = tuple(names.index(name) for name in argnames)

        def picked(*values: Any) -> Any:
            began = clock()
            try:
                return check(self, plugin, function(*[values[at] for at in picks]), unread)
            except PLUGIN_ERRORS as exc:
                raise failed(plugin, hook, exc) from exc
            finally:
                if (took := clock() - began) > SLOW_HOOK_SECONDS:
                    slow(plugin, hook, took)

        return picked

    def slow(self, plugin: str, hook: str, seconds: float) -> None:
        """Count a hook call that took `seconds`, more than `SLOW_HOOK_SECONDS`, tell the listeners, and log it
        (at most once every `SLOW_HOOK_LOG_EVERY` seconds per plugin and hook, with how many such calls it has had)."""
        key = (plugin, hook)
        self.slow_hooks[key] += 1
        for listener in self.on_slow_hook:
            try:
                listener(plugin, hook, seconds)
            except Exception:
                log.exception("a slow-hook listener failed")
        now = time.monotonic()
        last = self._slow_logged.get(key)
        if last is None or now - last >= SLOW_HOOK_LOG_EVERY:
            self._slow_logged[key] = now
            log.warning(
                "plugin %r took %.1f s in %s (%d call(s) over %.0f s so far); the engine waits for each hook, so "
                "every pod waited meanwhile",
                plugin,
                seconds,
                hook,
                self.slow_hooks[key],
                SLOW_HOOK_SECONDS,
            )

    def failed(self, plugin: str, hook: str, exc: BaseException) -> PluginHookError:
        """Count a plugin's failure in a hook (or in a rule it added: `hook` names it) and tell the listeners;
        returns the error to raise or to turn into a reason."""
        error = PluginHookError(plugin, hook, exc)
        self.hook_failures[(plugin, hook)] += 1
        for listener in self.on_hook_failure:
            try:
                listener(error)
            except Exception:
                log.exception("a plugin-failure listener failed")
        return error

    def call_each(self, hook: str, **kwargs: Any) -> dict[str, Any]:
        """Call every plugin's implementation; a failing plugin's entry is its PluginHookError."""
        results: dict[str, Any] = {}
        for name in self.records:
            try:
                results[name] = self.call(name, hook, **kwargs)
            except PluginHookError as exc:
                log.error("%s", exc)
                results[name] = exc
        return results


def _hook_object(plugin: object, project: str) -> object:
    """The object whose hooks to register: a module that defines none itself but has a `plugin` object (a kit
    instance) stands for that object, so an entry point may name the module or `module:plugin` alike."""
    if not isinstance(plugin, ModuleType):
        return plugin
    marker = f"{project}_impl"
    if any(hasattr(value, marker) for value in vars(plugin).values() if callable(value)):
        return plugin
    inner = getattr(plugin, "plugin", None)
    return inner if inner is not None and not isinstance(inner, ModuleType) else plugin


# The engine's hot hooks `bound` calls directly: their checks read the answer alone, never the other arguments.
_BOUND = frozenset({"kubegpu_scheduler_fit", "kubegpu_scheduler_score", "kubegpu_scheduler_fragmentation"})
_UNREAD: Mapping[str, Any] = MappingProxyType({})
# Hooks whose "not implemented" answer is the checked form of None (release: a success).
_NONE_CHECKED = frozenset({"kubegpu_scheduler_release"})
# Hooks the engine calls only for a plugin that built a node state: one missing is that plugin's failure.
_PLACING = frozenset({"kubegpu_scheduler_fit", "kubegpu_scheduler_allocate", "kubegpu_scheduler_take"})


def _env_allowlist() -> set[str] | None:
    raw = os.environ.get(ALLOW_ENV, "").strip()
    if not raw:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _autoload_enabled() -> bool:
    return os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in ("1", "true", "yes", "on")


def make_plugin_manager(
    side: Side,
    *,
    plugins: Iterable[tuple[str, object]] = (),
    autoload: bool | None = None,
    allow: Iterable[str] | None = None,
) -> KubegpuPluginManager:
    """Build the plugin manager for one side.

    Args:
        side: `scheduler` (DeviceScheduler hooks) or `device` (Device hooks).
        plugins: extra `(name, plugin object)` pairs to register, e.g. in tests.
        autoload: load the `kubegpu.<side>` entry points; default: on unless `KUBEGPU_DISABLE_PLUGIN_AUTOLOAD=1`.
        allow: keep only entry points with these names; default: `KUBEGPU_PLUGINS` (comma-separated) or all.
    """
    manager = KubegpuPluginManager(side)
    if autoload is None:
        autoload = _autoload_enabled()
    allowed = set(allow) if allow is not None else _env_allowlist()
    if autoload:
        # Each distribution's name and version, read once: its metadata is parsed anew at every `name` or `version`
        # (4-5 ms each; the three built-in plugins' six reads were 27 ms of every start).
        described: dict[int, tuple[str, str]] = {}
        for ep in sorted(entry_points(group=manager.project), key=lambda e: e.name):
            if allowed is not None and ep.name not in allowed:
                continue
            dist = ep.dist
            try:
                plugin = ep.load()
            except PLUGIN_ERRORS as exc:
                manager._fail(ep.name, "load", _describe(exc))
                continue
            if dist is not None and id(dist) not in described:
                metadata = dist.metadata
                described[id(dist)] = (metadata["Name"], metadata["Version"])
            name, version = described[id(dist)] if dist is not None else (None, None)
            manager.register(plugin, ep.name, distribution=name, version=version)
    for name, plugin in plugins:
        manager.register(plugin, name)
    manager._check_pending()
    manager._collect_resources()
    manager._collect_qualifiers()
    return manager
