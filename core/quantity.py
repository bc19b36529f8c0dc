"""Kubernetes resource quantities (`16Gi`, `500m`, `2`) as plain integers.

A quantity is read as the `kubernetes` client's `parse_quantity` reads it (a number times its suffix's power of 1000
or 1024, in `Decimal`), so kubegpu reads a manifest as the API server's users expect; tests/core/test_quantity.py
holds the two equal over the whole grammar. The few lines are kubegpu's own because importing the client costs every
process about 0.2 s of start-up (its package loads the whole API). This module also fixes the units kubegpu computes
in, bounds what it accepts, and caches the results, because the same few strings recur in every pod of a workload.

Quantities come from tenants (a pod's `resources`) and from files someone handed over, so every one is checked
before any arithmetic that could grow with it (kube-apiserver 1.20 admits `nvidia.com/gpu: 1e600000`, which as an
exact integer costs minutes of CPU in every later sum):

* text is at most `MAX_TEXT_CHARS` (64) characters and follows the quantity grammar: ASCII digits, an optional
  fraction, then an exponent (`e3`) or a suffix (`Ki`..`Ei`, `n`..`E`); no `_`, no `Infinity`, no other scripts' digits;
* the magnitude is at most `MAX_QUANTITY` = 2**63 - 1 base units (what Kubernetes' own int64 `Quantity.Value()`
  holds: 8Ei less one byte), judged from the decimal exponent, never by building the integer;
* a nonzero magnitude below one nano-unit counts as one nano-unit, as Kubernetes rounds it.

Whether a resource must be a whole number (devices and other extended resources) is the manifest's rule
(`kubegpu.core.manifests`), which knows the resource's name.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from functools import lru_cache

from kubegpu.core.errors import InputError, shorten

__all__ = ["MAX_QUANTITY", "MAX_TEXT_CHARS", "QuantityError", "parse_quantity", "to_int", "to_milli"]

MAX_TEXT_CHARS = 64
MAX_QUANTITY = 2**63 - 1
_NANO = Decimal("1e-9")
# Kubernetes' grammar (apimachinery's resource.Quantity) plus the client's `K`: sign, digits with an optional
# fraction, then a decimal exponent or one suffix. ASCII only: `Decimal` alone would take `1_000` and `١٢`.
_GRAMMAR = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkKMGTPE])?")
# Each suffix's multiplier, as a power: `Ki` = 1024**1, `m` = 1000**-1.
_POWERS = {"n": -3, "u": -2, "m": -1, "k": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}


class QuantityError(InputError):
    """A value that is not a Kubernetes quantity, or one too large to be meant; the message quotes it."""


def _bounded(value: Decimal, shown: str) -> Decimal:
    """`value` if its magnitude is sane, judged from its exponent before any big-number arithmetic."""
    if not value.is_finite():
        raise QuantityError(f"{shown} is not a finite quantity")
    if value.is_zero():
        return Decimal(0)
    magnitude = value.adjusted()  # the power of ten of the leading digit: cheap whatever the exponent
    if magnitude > 18 or abs(value) > MAX_QUANTITY:
        raise QuantityError(f"{shown} is too large: kubegpu accepts at most {MAX_QUANTITY} (2**63 - 1) base units")
    if magnitude < -9:
        return _NANO.copy_sign(value)
    return value


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Decimal:
    """Parse text already known to be at most `MAX_TEXT_CHARS` long, so the cache's keys stay small."""
    if not _GRAMMAR.fullmatch(text):
        if text.lower().lstrip("+-") in ("inf", "infinity", "nan", "snan"):
            raise QuantityError(f"{text!r} is not a finite quantity")
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (examples: 2, 500m, 16Gi)")
    try:
        value = _grammatical(text)
    except ArithmeticError:
        raise QuantityError(f"{text!r} is too large or not a Kubernetes quantity (examples: 2, 500m, 16Gi)") from None
    return _bounded(value, repr(text))


def _grammatical(text: str) -> Decimal:
    """The value of text that matches `_GRAMMAR`: the number times its suffix's power of 1024 (`Ki`..`Ei`) or 1000
    (`n`..`E`); an exponent (`5e3`) is the number's own. Computed in `Decimal`'s default context, as the client does."""
    if text.endswith("i"):
        return Decimal(text[:-2]) * (1024 ** Decimal(_POWERS[text[-2]]))
    if text[-1] in _POWERS:
        return Decimal(text[:-1]) * (1000 ** Decimal(_POWERS[text[-1]]))
    return Decimal(text)


def parse_quantity(value: object) -> Decimal:
    """Parse a quantity given as a manifest would hold it (string, int or float); raise `QuantityError`."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a Kubernetes quantity")
    if isinstance(value, int):
        if value.bit_length() > 63:
            raise QuantityError(f"a {value.bit_length()}-bit integer is too large: kubegpu accepts at most 2**63 - 1")
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a finite quantity")
        return _bounded(Decimal(repr(value)), repr(value))
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            raise QuantityError(
                f"{shorten(value, 24)!r} is {len(value)} characters long; a quantity has at most {MAX_TEXT_CHARS}"
            )
        return _parse_text(value.strip())
    raise QuantityError(f"{shorten(repr(value))} is not a Kubernetes quantity (expected a string or a number)")


def to_int(value: object) -> int:
    """The quantity in base units, rounded up as Kubernetes does (`16Gi` -> 17179869184, `1500m` -> 2)."""
    return math.ceil(parse_quantity(value))


def to_milli(value: object) -> int:
    """The quantity in thousandths, rounded up (`500m` -> 500, `2` -> 2000): how CPU is counted."""
    return math.ceil(parse_quantity(value) * 1000)
