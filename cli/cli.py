"""The `kubegpu` command: one entry point, a subcommand per front-end.

Each subcommand imports its front-end only when it runs, so `kubegpu plugins list` stays quick and a broken optional
dependency of one front-end cannot stop the others.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Sequence
from importlib import import_module

from kubegpu import __version__


def _plugins_list(args: argparse.Namespace) -> int:
    from kubegpu.core.plugin_manager import make_plugin_manager

    managers = [make_plugin_manager("scheduler"), make_plugin_manager("device")]
    rows: dict[str, dict[str, object]] = {}
    failures = []
    for manager in managers:
        for record in manager.records.values():
            row = rows.setdefault(
                record.name,
                {
                    "name": record.name,
                    "version": record.version,
                    "distribution": record.distribution,
                    "resources": [],
                    "hooks": {},
                },
            )
            row["hooks"][manager.side] = record.hooks  # type: ignore[index]
            for resource in record.resources:
                if resource not in row["resources"]:  # type: ignore[operator]
                    row["resources"].append(resource)  # type: ignore[attr-defined]
        failures.extend(manager.failures)
    if args.json:
        document = {
            "plugins": list(rows.values()),
            "failures": [{"name": f.name, "side": f.side, "stage": f.stage, "error": f.error} for f in failures],
        }
        print(json.dumps(document, indent=2))
    else:
        from kubegpu.core.text import safe_text

        # A distribution's words (its entry-point name, its metadata, the resources its hook names) as printable
        # lines of bounded length: a terminal reading them is not the plugin's to steer.
        for row in rows.values():
            dist = f"{row['distribution']} {row['version']}" if row["distribution"] else "(registered directly)"
            print(f"{safe_text(str(row['name']))}  [{safe_text(dist)}]")
            print(f"    resources: {safe_text(', '.join(row['resources'])) or '-'}")  # type: ignore[arg-type]
            for side, hooks in row["hooks"].items():  # type: ignore[attr-defined]
                print(f"    {side} hooks: {', '.join(hooks)}")
        for failure in failures:
            print(f"FAILED {failure}")
    return 1 if failures else 0


def _plugins_check(args: argparse.Namespace) -> int:
    """Load each named plugin (default: every installed one) and run the conformance suite on generated nodes."""
    from kubegpu.core.conformance import check_device, check_scheduler
    from kubegpu.core.models import PluginAllocation, PodRequest
    from kubegpu.core.plugin_manager import make_plugin_manager

    allow = args.names or None
    scheduler = make_plugin_manager("scheduler", allow=allow)
    device = make_plugin_manager("device", allow=allow)
    names = args.names or sorted(set(scheduler.names) | set(device.names) | {f.name for f in scheduler.failures})
    failed = False
    for failure in scheduler.failures + device.failures:
        print(f"FAIL {failure.name}: load: {failure}")
        failed = True
    for name in names:
        if name not in scheduler.names and name not in device.names:
            if not any(f.name == name for f in scheduler.failures + device.failures):
                print(f"FAIL {name}: load: no plugin of that name is installed (see `kubegpu plugins list`)")
            failed = True
            continue
        allocations: list[tuple[PodRequest, PluginAllocation]] = []
        found = []
        if name in scheduler.names:
            plugin = scheduler.pm.get_plugin(name)
            found += check_scheduler(plugin, name, manager=scheduler, collect=allocations)
        if name in device.names:
            found += check_device(device.pm.get_plugin(name), name, allocations, manager=device)
        by_rule: dict[str, list[object]] = {}
        for problem in found:
            by_rule.setdefault(problem.rule, []).append(problem)
        for problems in by_rule.values():
            more = f" (and {len(problems) - 1} more like it)" if len(problems) > 1 else ""
            print(f"FAIL {problems[0]}{more}")
        if found:
            failed = True
        else:
            sides = " and ".join(s for s, m in (("scheduler", scheduler), ("device", device)) if name in m.names)
            print(f"ok   {name}: {sides} side(s) conform ({len(allocations)} placements checked)")
    return 1 if failed else 0


def _plugins_new(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kubegpu.core.scaffold import ScaffoldError, new_plugin, tokens

    target = Path(args.directory or args.name)
    try:
        written = new_plugin(args.name, target)
    except ScaffoldError as exc:
        print(f"kubegpu plugins new: {exc}", file=sys.stderr)
        return 2
    values = tokens(args.name)
    for path in written:
        print(f"wrote {target / path}")
    print(
        f"\nNext: pip install {target} && pytest {target} && kubegpu plugins check {args.name}\n"
        f"The plugin schedules {values['RESOURCE_NAME']}; edit {values['PACKAGE_NAME']}/__init__.py to rename it."
    )
    return 0


# Each front-end's subcommand: the module that defines it, and the function that adds its parser.
FRONT_ENDS = {
    "simulate": ("kubegpu.scheduler.simulate", "add_simulate_parser"),
    "scheduler": ("kubegpu.scheduler.custom", "add_scheduler_parser"),
    "extender": ("kubegpu.scheduler.extender", "add_extender_parser"),
    "top": ("kubegpu.scheduler.top", "add_top_parser"),
    "crishim": ("kubegpu.crishim.shim", "add_crishim_parser"),
    "advertise": ("kubegpu.crishim.advertise", "add_advertise_parser"),
    "device-plugin": ("kubegpu.crishim.deviceplugin", "add_device_plugin_parser"),
}


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names (its first word: the top level takes no option with a value), or None."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given the arguments, only the front-end they name is imported (a scheduler's start
    does not pay for importing the simulator, the extender, the shim ...), else every one, for `--help`."""
    command = _command(sys.argv[1:] if argv is None else argv)
    only = command if command in FRONT_ENDS or command == "plugins" else None
    parser = argparse.ArgumentParser(
        prog="kubegpu", description="Topology-aware scheduling of accelerator devices on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"kubegpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    plugins = sub.add_parser("plugins", help="inspect the installed device plugins")
    plugins_sub = plugins.add_subparsers(dest="plugins_command", metavar="ACTION")
    plugins_sub.required = True
    listing = plugins_sub.add_parser(
        "list", help="list plugins: name, version, distribution, hooks implemented, resources owned"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    listing.set_defaults(func=_plugins_list)
    check = plugins_sub.add_parser(
        "check",
        help="run kubegpu's conformance suite on installed plugins (exit 1 naming each broken rule)",
        description="Load each named plugin (default: every installed one), run the conformance suite on generated "
        "nodes and pods (the plugin's own `conformance_nodes` when it has them) and exit 1 on any failure, naming "
        "the plugin and the rule.",
    )
    check.add_argument("names", nargs="*", metavar="NAME", help="plugin (entry-point) names")
    check.set_defaults(func=_plugins_check)
    new = plugins_sub.add_parser(
        "new", help="write a ready plugin distribution (both sides, tests using the kit) from kubegpu's template"
    )
    new.add_argument("name", metavar="NAME", help="the plugin's name: lower-case letters, digits and dashes")
    new.add_argument("--directory", metavar="DIR", help="where to write it (default: ./NAME)")
    new.set_defaults(func=_plugins_new)

    for command, (module, function) in FRONT_ENDS.items():
        if only is None or command == only:
            getattr(import_module(module), function)(sub)

    return parser


def main(argv: Sequence[str] | None = None, *, freeze: bool = False) -> int:
    """Run the command `argv` names (default: the process's arguments). `freeze`: what start-up built (the front-end's
    modules, their pydantic validators and compiled patterns) lives as long as the process, so once it is imported it
    is moved out of the cyclic collector's sight (`gc.freeze`): a full collection no longer walks it. On
    `benchmarks/simulate_bench.py` that was 13 % of the whole run (4,149-4,203 against 3,588-3,694 pods/s, side by
    side). Only for a process of its own (`entry`): a caller's objects are not frozen."""
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if freeze:  # with no collection first: start-up leaves no cyclic garbage (0 of some 54,000 objects), and one
        gc.freeze()  # cost 50-60 ms of every start
    result: int = args.func(args)
    return result


def entry() -> int:
    """The `kubegpu` command in a process of its own (the console script, `python -m kubegpu`)."""
    return main(freeze=True)


if __name__ == "__main__":
    raise SystemExit(entry())
