"""The upstream rows kubegpu cannot express, table by table: each module's `NOT_EXPRESSIBLE` names a row and why
(a kube-scheduler feature kubegpu deliberately lacks). Printed for the record (`pytest -s`), and held short: a table
that leaves out as many rows as it holds is no longer kube-scheduler's table."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

from . import __name__ as PACKAGE
from . import __path__ as PATH

TABLES = sorted(
    m.name for m in pkgutil.iter_modules(PATH) if m.name.startswith("test_") and m.name != __name__.rsplit(".", 1)[-1]
)


def held(module: ModuleType) -> int:
    return sum(len(value) for name, value in vars(module).items() if name.endswith("CASES") and isinstance(value, list))


@pytest.mark.parametrize("table", TABLES)
def test_rows_left_out_are_few_and_say_why(table: str) -> None:
    module = importlib.import_module(f"{PACKAGE}.{table}")
    left_out: dict[str, str] = module.NOT_EXPRESSIBLE
    for row, why in left_out.items():
        print(f"{table}: {row}: {why}")
        assert why.strip(), row
    assert held(module) > 0
    assert len(left_out) < held(module), f"{table} leaves out {len(left_out)} rows and holds {held(module)}"
