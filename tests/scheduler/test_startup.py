"""What starting `kubegpu scheduler` costs before its first cycle: the import of its modules.

scheduler_bench.py times a scheduler from its start to its last Binding, so a second spent at import shows as a
fifth of its throughput on a 1,500-pod run. Building the CEL parser for DRA selectors (a Lark grammar, about half a
second) waits for the first selector compiled.
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
import kubegpu.scheduler.custom
from kubegpu.scheduler import dra
at_import = len(built)
dra.compile_selector('device.driver == "neuron.kubegpu.io"')
print(at_import, len(built))
"""


def test_the_scheduler_starts_without_building_the_cel_parser() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True, timeout=120)
    at_import, after_compile = map(int, out.stdout.split())
    assert at_import == 0, "importing kubegpu.scheduler.custom built a CEL parser"
    assert after_compile > 0  # the first selector compiled builds it
