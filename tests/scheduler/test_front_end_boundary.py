"""The front-ends ask the engine through its methods; none reads the engine's records.

The custom scheduler, the extender, the simulator and `kubegpu top`, and the parts they share, are thin adapters
around one `Engine`. An import-linter contract holds who imports whom but cannot see attribute access, so this test
reads their source: every attribute taken of an engine (`engine.x`, `self.engine.x`, `view.engine.x`) must be one of
the engine's public methods, or one of the few settings a front-end may read or set. A front-end that walks
`engine.nodes`, `engine.pods` or `engine.nominated` fails here, and is pointed at the query to add instead.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from kubegpu.scheduler.engine import Engine

SCHEDULER = Path(__file__).resolve().parents[2] / "scheduler"

# The front-ends and the parts they share: each holds an engine, or is handed one.
FRONT_ENDS = (
    "binder.py",
    "compat.py",
    "custom.py",
    "extender.py",
    "gangcuts.py",
    "gangstatus.py",
    "health.py",
    "html.py",
    "liveness.py",
    "mirror.py",
    "queue.py",
    "report.py",
    "simulate.py",
    "testing.py",
    "traces.py",
    "top.py",
)
# The engine and what it is built from (it may read its own records); and modules that never see an engine.
ENGINE_PARTS = (
    "dra.py",
    "dracel.py",
    "filters.py",
    "gangfit.py",
    "index.py",
    "owners.py",
    "podgroups.py",
    "podindex.py",
    "preemption.py",
    "scores.py",
)
NO_ENGINE = ("__init__.py", "config.py", "draclaims.py", "gangplans.py", "gates.py", "http_server.py", "objects.py")

# Plain settings a front-end gives the engine or reads back; not the cluster state.
SETTINGS = frozenset({"generation", "plugins", "policy", "track_volumes"})


def engine_methods() -> frozenset[str]:
    return frozenset(
        name
        for name, member in inspect.getmembers(Engine)
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    )


def _is_engine(node: ast.expr) -> bool:
    """`engine` or `<anything>.engine`: how every front-end names the engine it holds."""
    return (isinstance(node, ast.Name) and node.id == "engine") or (
        isinstance(node, ast.Attribute) and node.attr == "engine"
    )


def _reaches_in(node: ast.AST, allowed: frozenset[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return _is_engine(node.value) and node.attr not in allowed
    return (  # getattr(engine, ...), setattr(engine, ...), vars(engine)
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "setattr", "vars")
        and bool(node.args)
        and _is_engine(node.args[0])
    )


def reaches_in(source: str, allowed: frozenset[str]) -> list[str]:
    """`line: engine.attribute` for every use of an engine attribute outside `allowed`, and every `getattr` on one."""
    found = [(node.lineno, ast.unparse(node)) for node in ast.walk(ast.parse(source)) if _reaches_in(node, allowed)]
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_every_scheduler_module_is_classified() -> None:
    """A new module is either a front-end (checked below) or part of the engine: none escapes the check."""
    modules = {path.name for path in SCHEDULER.glob("*.py")}
    unclassified = modules - {*FRONT_ENDS, *ENGINE_PARTS, *NO_ENGINE}
    assert not unclassified, f"add {sorted(unclassified)} to FRONT_ENDS or ENGINE_PARTS (or NO_ENGINE) above"
    for name in NO_ENGINE:
        assert not reaches_in((SCHEDULER / name).read_text(), frozenset()), name


def test_the_checker_sees_reaching_in() -> None:
    """The check is not vacuous: records read through any spelling of the engine are reported, methods are not."""
    source = (
        "def f(engine, view):\n"
        "    engine.nodes.get('a')\n"
        "    view.engine.pods['k'].request\n"
        "    self.engine.nominated.get('k')\n"
        "    getattr(engine, 'nodes')\n"
        "    engine.schedule(pod)\n"
        "    engine.generation\n"
    )
    found = reaches_in(source, engine_methods() | SETTINGS)
    assert [line.split(":")[0] for line in found] == ["2", "3", "4", "5"]


@pytest.mark.parametrize("module", FRONT_ENDS)
def test_front_end_asks_the_engine_through_its_methods(module: str) -> None:
    found = reaches_in((SCHEDULER / module).read_text(), engine_methods() | SETTINGS)
    assert not found, (
        f"scheduler/{module} reads the engine's records; add a query method to Engine (it owns the cycle and its "
        "state) and call that instead:\n  " + "\n  ".join(found)
    )


def test_the_front_ends_do_use_the_engine() -> None:
    """The names the check looks for are the names the front-ends use: each of these reaches its engine."""
    for module in ("custom.py", "extender.py", "mirror.py", "simulate.py", "top.py", "compat.py", "report.py"):
        assert reaches_in((SCHEDULER / module).read_text(), frozenset()), module


# Collaborators a front-end holds besides the engine: it asks them (`queue.binding_started`, `mirror.evicting_started`)
# and never edits their state, nor reads what they keep private.
COLLABORATORS = ("queue", "mirror", "binder")
MUTATORS = frozenset(
    {"add", "append", "clear", "discard", "extend", "pop", "popitem", "remove", "setdefault", "update"}
)


def _is_collaborator(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in COLLABORATORS) or (
        isinstance(node, ast.Attribute) and node.attr in COLLABORATORS
    )


def _collaborator_state(node: ast.expr) -> bool:
    """`queue.x`, `self.mirror.x`: an attribute of a collaborator, or something inside one (`queue.x[key]`)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Attribute) and _is_collaborator(node.value)


def edits_collaborators(source: str) -> list[str]:
    """`line: text` for every write into a collaborator's state, mutating call on it, or read of its private parts."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        bad = any(_collaborator_state(target) for target in targets)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            bad = bad or _collaborator_state(node.func.value)
        if isinstance(node, ast.Attribute) and _is_collaborator(node.value) and node.attr.startswith("_"):
            bad = True
        if bad:
            found.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_the_collaborator_checker_sees_edits() -> None:
    source = (
        "def f(self, mirror):\n"
        "    self.queue.in_flight[key] = entry\n"
        "    mirror.evicting.update(victims)\n"
        "    self.queue.in_flight.pop(key, None)\n"
        "    self.mirror._evicting\n"
        "    mirror.evicting_started(victims)\n"
        "    self.queue.binding_done(key)\n"
        "    if key in mirror.evicting: pass\n"
    )
    assert [line.split(":")[0] for line in edits_collaborators(source)] == ["2", "3", "4", "5"]


@pytest.mark.parametrize("module", ["custom.py", "extender.py", "simulate.py", "top.py"])
def test_front_end_asks_its_collaborators_instead_of_editing_their_state(module: str) -> None:
    found = edits_collaborators((SCHEDULER / module).read_text())
    assert not found, (
        f"scheduler/{module} edits the state of its queue, mirror or binder; add a method to the collaborator that "
        "owns it and call that instead:\n  " + "\n  ".join(found)
    )
