"""Kubernetes resource quantities (`16Gi`, `500m`, `2`) as plain integers.

Parsing is delegated to the `kubernetes` client's own `parse_quantity`, so kubegpu reads a manifest exactly as the
API server's users expect; this module only fixes the units kubegpu computes in and caches the results, because
the same few strings recur in every pod of a workload.
"""

from __future__ import annotations

import math
from decimal import Decimal
from functools import lru_cache

from kubernetes.utils.quantity import parse_quantity as _parse_k8s_quantity

__all__ = ["QuantityError", "parse_quantity", "to_int", "to_milli"]


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message quotes it."""


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Decimal:
    try:
        value: Decimal = _parse_k8s_quantity(text)  # type: ignore[no-untyped-call]  # the client is untyped
    except (ValueError, ArithmeticError) as exc:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (examples: 2, 500m, 16Gi)") from exc
    if not value.is_finite():
        raise QuantityError(f"{text!r} is not a finite quantity")
    return value


def parse_quantity(value: object) -> Decimal:
    """Parse a quantity given as a manifest would hold it (string, int or float)."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a Kubernetes quantity")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a finite quantity")
        return Decimal(repr(value))
    if isinstance(value, str):
        return _parse_text(value.strip())
    raise QuantityError(f"{value!r} is not a Kubernetes quantity (expected a string or a number)")


def to_int(value: object) -> int:
    """The quantity in base units, rounded up as Kubernetes does (`16Gi` -> 17179869184, `1500m` -> 2)."""
    return math.ceil(parse_quantity(value))


def to_milli(value: object) -> int:
    """The quantity in thousandths, rounded up (`500m` -> 500, `2` -> 2000): how CPU is counted."""
    return math.ceil(parse_quantity(value) * 1000)
