"""Kubernetes quantities as kubegpu counts them: what a user writes in `resources` is what gets scheduled."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# Every string kubegpu's grammar admits, built from its parts: a sign, digits with an optional fraction, then an
# exponent or a suffix.
_digits = st.text("0123456789", min_size=1, max_size=6)
_number = st.one_of(
    _digits,
    st.builds(lambda a, b: f"{a}.{b}", _digits, st.text("0123456789", max_size=6)),
    st.builds(lambda b: f".{b}", _digits),
)
_tail = st.one_of(
    st.just(""),
    st.sampled_from(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "K", "M", "G", "T", "P", "E"]),
    st.builds(lambda e, sign, n: f"{e}{sign}{n}", st.sampled_from("eE"), st.sampled_from(["", "+", "-"]),
              st.integers(0, 30).map(str)),
)  # fmt: skip
_quantity = st.builds(
    lambda sign, number, tail: f"{sign}{number}{tail}", st.sampled_from(["", "+", "-"]), _number, _tail
)


@settings(max_examples=2000, deadline=None)
@given(_quantity)
def test_every_quantity_reads_as_the_kubernetes_client_reads_it(text: str) -> None:
    """kubegpu parses quantities itself (importing the client costs every process 0.2 s of start-up): the value is
    the client's `parse_quantity` for every string of the grammar, or both refuse it."""
    from kubernetes.utils.quantity import parse_quantity as client_parse

    try:
        expected: Decimal | None = client_parse(text)
    except ValueError:
        expected = None
    try:
        ours: Decimal | None = parse_quantity(text)
    except QuantityError:
        ours = None
    if expected is None or ours is None:
        # Refused by the client means refused here; kubegpu also refuses what is too large to be meant.
        assert ours is None, f"{text!r}: kubegpu read {ours}, the client refuses it"
        return
    if expected.is_zero() or abs(expected) > 2**63 - 1:
        assert ours == 0 or ours is None
        return
    if abs(expected) < Decimal("1e-9"):
        assert ours == Decimal("1e-9").copy_sign(expected)  # Kubernetes rounds a nonzero nano-fraction up
        return
    assert ours == expected
