"""`kubegpu simulate`: the embedded simulator front-end (filled in with the engine)."""

from __future__ import annotations

import argparse
from typing import Any


def add_simulate_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser("simulate", help="schedule Node and Pod manifests offline")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.set_defaults(func=lambda _a: 2)
    return parser
