"""What starting `kubegpu scheduler` costs before its first cycle: the import of its modules.

scheduler_bench.py times a scheduler from its start to its last Binding, so a second spent at import shows as a
fifth of its throughput on a 1,500-pod run. Building the CEL parser for DRA selectors (a Lark grammar, about half a
second) waits for the first selector compiled, and importing cel-python at all waits for the first selector
evaluated, and building DRA's pydantic models for the first DRA object decoded.
"""

from __future__ import annotations

import subprocess
import sys

# Counts the Lark parsers built while the scheduler's modules are imported, then while one selector is compiled.
PROBE = """
import lark
built = []
original = lark.Lark.__init__
def counting(self, *args, **kwargs):
    built.append(1)
    original(self, *args, **kwargs)
lark.Lark.__init__ = counting
import sys
import kubegpu.scheduler.custom
at_import = len(built)
modules = sorted(m for m in ("celpy", "pendulum") if m in sys.modules)
from pydantic import BaseModel
def subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)
dra_models = sum(1 for c in subclasses(BaseModel) if c.__module__.startswith("kubegpu.core.dra"))
from kubegpu.scheduler import dracel
dracel.compile_selector('device.driver == "neuron.kubegpu.io"')
print(at_import, len(built), ",".join(modules) or "-", dra_models)
"""


def test_the_scheduler_starts_without_building_the_cel_parser() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True, timeout=120)
    at_import, after_compile, imported, dra_models = out.stdout.split()
    assert int(at_import) == 0, "importing kubegpu.scheduler.custom built a CEL parser"
    assert int(after_compile) > 0  # the first selector compiled builds it
    # cel-python and pendulum (about 40 ms of every start) wait for the first selector too (`scheduler/dracel.py`), and
    # DRA's pydantic models (`core/draschema.py`, 30-40 ms) for the first DRA object decoded
    assert imported == "-", f"importing kubegpu.scheduler.custom imported {imported}"
    assert dra_models == "0", f"importing kubegpu.scheduler.custom built {dra_models} pydantic models of DRA"
