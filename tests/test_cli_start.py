"""How the `kubegpu` command starts: a front-end's process imports only what that front-end needs, so the custom
scheduler, the shim and the advertiser are scheduling, proxying and advertising sooner after a (re)start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FRONT_ENDS = {
    "simulate": "kubegpu.scheduler.simulate",
    "scheduler": "kubegpu.scheduler.custom",
    "extender": "kubegpu.scheduler.extender",
    "top": "kubegpu.scheduler.top",
    "crishim": "kubegpu.crishim.shim",
    "advertise": "kubegpu.crishim.advertise",
    "device-plugin": "kubegpu.crishim.deviceplugin",
}


def modules_after_parsing(tmp_path: Path, *argv: str) -> set[str]:
    """The modules a fresh interpreter holds after `kubegpu ARGV` built its parser (the command does not run)."""
    code = (
        "import json, sys\n"
        "from kubegpu.cli import build_parser\n"
        f"build_parser({list(argv)!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


@pytest.mark.parametrize("command", sorted(FRONT_ENDS))
def test_a_front_end_imports_none_of_the_others(tmp_path: Path, command: str) -> None:
    loaded = modules_after_parsing(tmp_path, command, "--help")
    assert FRONT_ENDS[command] in loaded
    others = {module for name, module in FRONT_ENDS.items() if name != command} & loaded
    assert not others, f"`kubegpu {command}` imported other front-ends: {sorted(others)}"


def test_the_scheduler_does_not_import_the_kubernetes_client_package(tmp_path: Path) -> None:
    """The `kubernetes` package loads its whole API on import (about 0.2 s); the scheduler's hot paths use kubegpu's
    own client and quantity parser."""
    loaded = modules_after_parsing(tmp_path, "scheduler")
    assert "kubernetes" not in loaded


def test_help_without_a_command_lists_every_front_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kubegpu", "--help"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    for command in [*FRONT_ENDS, "plugins"]:
        assert command in done.stdout


def test_an_unknown_command_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kubegpu", "schedulr"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2
    assert "invalid choice: 'schedulr'" in done.stderr
    assert "scheduler" in done.stderr and "crishim" in done.stderr


def freeze_counts(tmp_path: Path, call: str) -> tuple[int, int]:
    """In a fresh interpreter: the objects the cyclic collector no longer walks (`gc.get_freeze_count`) before and
    after the front-end's modules were imported and `call` (`entry()` or `main()`) ran `kubegpu plugins list`."""
    code = (
        "import gc, sys\n"
        "from kubegpu.cli import entry, main\n"
        "before = gc.get_freeze_count()\n"
        "sys.argv = ['kubegpu', 'plugins', 'list']\n"
        f"{call}\n"
        "print(before, gc.get_freeze_count(), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    before, after = done.stderr.split()[-2:]
    return int(before), int(after)


def test_the_command_in_a_process_of_its_own_moves_what_start_up_built_out_of_the_collectors_sight(
    tmp_path: Path,
) -> None:
    """`kubegpu` (the console script and `python -m kubegpu`: `entry`) freezes what its start-up built, which lives as
    long as the process, so full collections stop walking it (13 % of simulate_bench's run); `main` called by
    another program freezes nothing of that program's."""
    before, after = freeze_counts(tmp_path, "entry()")
    assert before == 0 and after > 10_000
    assert freeze_counts(tmp_path, "main()") == (0, 0)


def test_the_command_starts_without_a_full_collection(tmp_path: Path) -> None:
    """Freezing needs no collection first: at that point start-up has left no cyclic garbage (0 unreachable of about
    54,000 tracked objects), and the collection cost 50-60 ms of every start, which scheduler_bench times."""
    code = (
        "import gc, sys\n"
        "from kubegpu.cli import entry\n"
        "collected = []\n"
        "original = gc.collect\n"
        "gc.collect = lambda *a: collected.append(a) or original(*a)\n"
        "sys.argv = ['kubegpu', 'plugins', 'list']\n"
        "entry()\n"
        "print(len(collected), gc.get_freeze_count(), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    collections, frozen = done.stderr.split()[-2:]
    assert collections == "0", "kubegpu ran a full collection at start-up"
    assert int(frozen) > 10_000
