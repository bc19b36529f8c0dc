"""What every test gets: the root logger as the test found it.

Commands run in-process (`advertise.run`, `kubegpu simulate` through `cli.main`) configure logging as a process
does (`core.process.configure_logging`: the root logger's level and handler). Left in place, an earlier test's
`--log-level error` hides the warnings a later test reads with `caplog`, so the suite's result would depend on its
order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    yield
    root.setLevel(level)
    root.handlers[:] = handlers
