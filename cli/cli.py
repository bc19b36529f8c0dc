"""The `kubegpu` command: one entry point, a subcommand per front-end.

Each subcommand imports its front-end only when it runs, so `kubegpu plugins list` stays quick and a broken optional
dependency of one front-end cannot stop the others.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

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
        for row in rows.values():
            dist = f"{row['distribution']} {row['version']}" if row["distribution"] else "(registered directly)"
            print(f"{row['name']}  [{dist}]")
            print(f"    resources: {', '.join(row['resources']) or '-'}")  # type: ignore[arg-type]
            for side, hooks in row["hooks"].items():  # type: ignore[attr-defined]
                print(f"    {side} hooks: {', '.join(hooks)}")
        for failure in failures:
            print(f"FAILED {failure}")
    return 0


def build_parser() -> argparse.ArgumentParser:
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

    from kubegpu.scheduler.simulate import add_simulate_parser

    add_simulate_parser(sub)

    from kubegpu.scheduler.custom import add_scheduler_parser

    add_scheduler_parser(sub)

    from kubegpu.scheduler.extender import add_extender_parser

    add_extender_parser(sub)

    from kubegpu.scheduler.top import add_top_parser

    add_top_parser(sub)

    from kubegpu.crishim.shim import add_crishim_parser

    add_crishim_parser(sub)

    from kubegpu.crishim.advertise import add_advertise_parser

    add_advertise_parser(sub)

    from kubegpu.crishim.deviceplugin import add_device_plugin_parser

    add_device_plugin_parser(sub)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
