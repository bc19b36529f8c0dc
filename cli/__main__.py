from kubegpu.cli import entry

raise SystemExit(entry())
