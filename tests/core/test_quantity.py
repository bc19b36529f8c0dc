"""Kubernetes quantities as kubegpu counts them: what a user writes in `resources` is what gets scheduled."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kubegpu.core.quantity import QuantityError, parse_quantity, to_int, to_milli


@pytest.mark.parametrize(
    ("value", "exact", "base_units", "milli"),
    [
        ("16Gi", Decimal(16 * 2**30), 16 * 2**30, 16 * 2**30 * 1000),
        ("1Ki", Decimal(1024), 1024, 1_024_000),
        ("5G", Decimal(5 * 10**9), 5 * 10**9, 5 * 10**12),
        ("500m", Decimal("0.5"), 1, 500),
        ("1500m", Decimal("1.5"), 2, 1500),
        ("1.5", Decimal("1.5"), 2, 1500),
        ("0.1", Decimal("0.1"), 1, 100),
        ("1e3", Decimal(1000), 1000, 1_000_000),
        ("2", Decimal(2), 2, 2000),
        (" 4 ", Decimal(4), 4, 4000),
        (3, Decimal(3), 3, 3000),
        (1.5, Decimal("1.5"), 2, 1500),
        ("0", Decimal(0), 0, 0),
    ],
    ids=[
        "binary-suffix",
        "kibi",
        "decimal-suffix",
        "millis-round-up",
        "millis-over-one",
        "decimal-fraction",
        "small-fraction",
        "exponent",
        "plain-integer",
        "surrounding-spaces",
        "yaml-integer",
        "yaml-float",
        "zero",
    ],
)
def test_quantities_parse_as_kubernetes_reads_them(value: object, exact: Decimal, base_units: int, milli: int) -> None:
    assert parse_quantity(value) == exact
    assert to_int(value) == base_units
    assert to_milli(value) == milli


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("16GiB", "'16GiB' is not a Kubernetes quantity (examples: 2, 500m, 16Gi)"),
        ("abc", "'abc' is not a Kubernetes quantity"),
        ("", "'' is not a Kubernetes quantity"),
        ("1.5.2", "'1.5.2' is not a Kubernetes quantity"),
        ("Infinity", "'Infinity' is not a finite quantity"),
        (float("nan"), "nan is not a finite quantity"),
        (float("inf"), "inf is not a finite quantity"),
        (True, "True is not a Kubernetes quantity"),
        (None, "None is not a Kubernetes quantity (expected a string or a number)"),
        ([1], "[1] is not a Kubernetes quantity (expected a string or a number)"),
    ],
    ids=[
        "byte-suffix",
        "word",
        "empty",
        "two-points",
        "infinity-text",
        "nan",
        "infinity",
        "boolean",
        "none",
        "list",
    ],
)
def test_a_value_that_is_not_a_quantity_is_refused_quoting_it(value: object, message: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(value)

    assert str(caught.value).startswith(message)


def test_quantity_errors_are_value_errors_so_callers_can_report_them_as_bad_input() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        to_int("lots")
