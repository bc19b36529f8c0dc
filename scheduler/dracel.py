"""DRA's CEL selectors (`DeviceClass.spec.selectors`, a request's `selectors`): compiled once per expression (the
programs and errors kept within `MAX_KEPT_NODES`), their cost bounded before they run (at most `MAX_CEL_TOKENS` tokens,
no comprehension inside another) and while they run (`MAX_CEL_STEPS`), evaluated per device with upstream's
`device.driver`, `device.attributes` and `device.capacity`. Its own module, imported at the first
selector evaluated (`kubegpu.scheduler.dra`): cel-python brings pendulum and Lark, which every start of the
scheduler paid at import, DRA in use or not."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import suppress
from decimal import ROUND_CEILING
from functools import lru_cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, Evaluator
from lark import Token, Tree

from kubegpu.core.dra import Device
from kubegpu.core.quantity import QuantityError, parse_quantity

MAX_CEL_TOKENS = 1000
# Steps (parse-tree nodes visited) the comprehensions' bodies of one evaluation may take over all their elements,
# about 13 us each in cel-python: 65 ms at most per device. The token bound alone let a comprehension over 300 numbers
# with a body of 80 comparisons take 360,000 steps (5 s), again for every device of other facts. A comprehension over
# a device's 32 attributes with a body of 100 steps fits.
MAX_CEL_STEPS = 5000
# Compiled selectors kept, counted in parse-tree nodes: a program keeps cel-python's Lark tree, about 700 bytes a node
# and up to ten nodes a token (3.4 MB for a list of 480 numbers), so 2^15 nodes keep at most about 23 MB however many
# distinct selectors tenants write (a plain `device.driver == "x"` is a dozen nodes).
MAX_KEPT_NODES = 1 << 15
# A pod's selectors together (`dra.py`'s demands): at most half of what is kept, so that none of them is let go, and
# compiled again per device, while its own cycle evaluates the others.
MAX_POD_NODES = MAX_KEPT_NODES // 2
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


class SelectorError(Exception):
    """A CEL selector that does not compile, is over the cost bound, or fails on a device."""


class _OverSteps(Exception):
    """An evaluation past `MAX_CEL_STEPS` (none of the types cel-python turns into a CEL error value)."""


# -- CEL --------------------------------------------------------------------------------------------------------------


class _Domains(celtypes.MapType):
    """`device.attributes` and `device.capacity`: a domain the device has nothing in is an empty map (upstream)."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType({})


class Quantity(celtypes.IntType):
    """A capacity in base units (rounded up), as upstream's `Quantity` CEL type."""


def _quantity(text: Any) -> Quantity:
    try:
        value = parse_quantity(str(text))
    except QuantityError as exc:
        raise ValueError(f"quantity({str(text)[:40]!r}): {exc}") from None
    return Quantity(int(value.to_integral_value(rounding=ROUND_CEILING)))


def _compare(a: Any, b: Any) -> celtypes.IntType:
    return celtypes.IntType((int(a) > int(b)) - (int(a) < int(b)))


CEL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(int(a) > int(b)),
    "isLessThan": lambda a, b: celtypes.BoolType(int(a) < int(b)),
    "asInteger": lambda a: celtypes.IntType(int(a)),
    "add": lambda a, b: Quantity(int(a) + int(b)),
    "sub": lambda a, b: Quantity(int(a) - int(b)),
}


class _Evaluator(Evaluator):
    """cel-python's evaluator, whose comprehension bodies count the steps they take (`_CountedEvaluator`). Outside a
    comprehension each parse-tree node is visited once, so the token bound bounds the steps there; a comprehension's
    body is visited once per element, and only there could steps multiply. One count for all its comprehensions."""

    def __init__(self, ast: Any, activation: Any) -> None:
        super().__init__(ast, activation)
        self.left = [MAX_CEL_STEPS]

    def sub_evaluator(self, ast: Any) -> Evaluator:
        return _CountedEvaluator(ast, self.activation, self.left)


class _CountedEvaluator(Evaluator):
    """A comprehension body's evaluator: counts the parse-tree nodes it visits, for every element, and stops past
    `MAX_CEL_STEPS` (`left` is shared by the comprehension's evaluators)."""

    def __init__(self, ast: Any, activation: Any, left: list[int]) -> None:
        super().__init__(ast, activation)
        self.left = left

    def _visit_tree(self, tree: Any) -> Any:
        left = self.left
        left[0] -= 1
        if left[0] < 0:
            raise _OverSteps
        return _visit(self, tree)

    def sub_evaluator(self, ast: Any) -> Evaluator:
        return _CountedEvaluator(ast, self.activation, self.left)


_visit = Evaluator._visit_tree


class _CountedRunner(celpy.InterpretedRunner):
    def evaluate(self, context: Any) -> Any:
        return _Evaluator(self.ast, self.new_activation()).evaluate(context)


@lru_cache(maxsize=1)
def _environment() -> celpy.Environment:
    """The CEL environment, made at the first selector compiled: building its parser costs about half a second,
    which every start of `kubegpu scheduler` paid at import, DRA in use or not."""
    return celpy.Environment(runner_class=_CountedRunner)


def _check_cost(tree: Tree[Token]) -> int:
    """Refuse an expression that could cost more than about a million steps: over `MAX_CEL_TOKENS` tokens, or a
    comprehension (all, exists, exists_one, map, filter) inside another's body. Returns the tree's nodes."""
    tokens = 0
    nodes = 0

    def walk(node: Tree[Token] | Token, depth: int) -> None:
        nonlocal tokens, nodes
        nodes += 1
        if isinstance(node, Token):
            tokens += 1
            if tokens > MAX_CEL_TOKENS:
                raise SelectorError(f"the expression has more than {MAX_CEL_TOKENS} tokens (kubegpu's cost bound)")
            return
        inner = depth
        if node.data == "member_dot_arg" and any(isinstance(c, Token) and str(c) in MACROS for c in node.children):
            if depth >= 1:
                raise SelectorError("a comprehension inside another's body is over kubegpu's cost bound")
            inner = depth + 1
        for child in node.children:
            walk(child, inner if child is not node.children[0] else depth)

    walk(tree, 0)
    return nodes


_kept: OrderedDict[str, tuple[Any, int]] = OrderedDict()  # expression -> (program or its error's text, nodes)
_kept_nodes = 0
_kept_lock = threading.Lock()
# (hash, length) of each expression compiled -> its nodes, remembered after its program is let go (a few ints each).
_weights: dict[tuple[int, int], int] = {}
MAX_WEIGHTS = 1 << 16


def compile_selector(expression: str) -> Any:
    """The compiled program of a CEL selector; raises `SelectorError`. Programs and errors alike are kept, the least
    recently used let go past `MAX_KEPT_NODES`: an expression that does not compile, or is over the cost bound, was
    compiled again for every device of other facts (40-200 ms of Lark each, per node per cycle)."""
    global _kept_nodes
    with _kept_lock:
        kept = _kept.get(expression)
        if kept is not None:
            _kept.move_to_end(expression)
    if kept is None:
        kept = _compile(expression)
        with _kept_lock:
            if len(_weights) >= MAX_WEIGHTS:
                _weights.clear()
            _weights[(hash(expression), len(expression))] = kept[1]
            if expression not in _kept:
                _kept[expression] = kept
                _kept_nodes += kept[1]
                while _kept_nodes > MAX_KEPT_NODES and len(_kept) > 1:
                    _kept_nodes -= _kept.popitem(last=False)[1][1]
    if isinstance(kept[0], str):
        raise SelectorError(kept[0])  # a new one each time: one raised again would grow its traceback
    return kept[0]


def weight(expression: str) -> int:
    """What keeping the selector's program costs, in parse-tree nodes (`MAX_KEPT_NODES`); compiled once to tell."""
    known = _weights.get((hash(expression), len(expression)))
    if known is None:
        with suppress(SelectorError):  # an error is kept, and weighed, as a program is
            compile_selector(expression)
        known = _weights.get((hash(expression), len(expression)), 1)
    return known


def _compile(expression: str) -> tuple[Any, int]:
    weight = 1 + len(expression) // 700  # the key itself, in nodes' worth of bytes
    try:
        tree = _environment().compile(expression)
        nodes = _check_cost(tree)
        return _environment().program(tree, functions=CEL_FUNCTIONS), weight + nodes
    except SelectorError as exc:
        return str(exc), weight
    except CELParseError as exc:
        return f"compilation failed: {' '.join(str(exc).split())[:200]}", weight
    except RecursionError:
        # cel-python's parser and tree walks recurse once per level: 300 parentheses, 3000 `!` or a chain of
        # 3000 `+` (all under the API server's 10 KiB) go past Python's stack limit. cel-go refuses such
        # expressions too (its parser's recursion limit).
        return "the expression is nested deeper than kubegpu's CEL parser takes", weight


def _activation(device: Device) -> dict[str, Any]:
    attributes: dict[Any, Any] = {}
    for (domain, ident), value in device.attributes.items():
        cel: Any
        if isinstance(value, bool):
            cel = celtypes.BoolType(value)
        elif isinstance(value, int):
            cel = celtypes.IntType(value)
        else:
            cel = celtypes.StringType(value)
        attributes.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(ident)] = cel
    capacity: dict[Any, Any] = {}
    for (domain, ident), amount in device.capacity.items():
        capacity.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(ident)] = Quantity(amount)
    return {
        "device": celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(device.driver),
                celtypes.StringType("attributes"): _Domains({k: celtypes.MapType(v) for k, v in attributes.items()}),
                celtypes.StringType("capacity"): _Domains({k: celtypes.MapType(v) for k, v in capacity.items()}),
            }
        )
    }


def evaluate(expression: str, device: Device) -> bool | str:
    """The selector's answer for the device, or its error (compile, cost, runtime, not a bool)."""
    try:
        program = compile_selector(expression)
    except SelectorError as exc:
        return str(exc)
    try:
        result = program.evaluate(_activation(device))
    except _OverSteps:
        return f"more than {MAX_CEL_STEPS} evaluation steps on a device (kubegpu's cost bound)"
    except Exception as exc:  # cel-python raises several types; each is the expression's error
        return f"CEL runtime error: {' '.join(str(exc).split())[:200]}"
    if isinstance(result, CELEvalError):
        return f"CEL runtime error: {' '.join(str(result.args[0] if result.args else result).split())[:200]}"
    if not isinstance(result, celtypes.BoolType):
        return f"must evaluate to bool, not {type(result).__name__}"
    return bool(result)
