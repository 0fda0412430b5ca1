"""``samu-tune`` command line (the only module that renders with rich)."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _cmd_strategies(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import registry

    table = Table(title="registered strategies")
    for col in ("name", "description", "devices", "dtypes", "deterministic", "configs"):
        table.add_column(col)
    for s in registry.all_strategies():
        cap = s.capability
        table.add_row(s.name, s.description, ",".join(sorted(cap.devices)),
                      ",".join(sorted(cap.dtypes)), "yes" if cap.deterministic else "no",
                      str(len(s.configs())))
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="samu-tune", description="Tune, cache and inspect SAMU scan strategies.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("strategies", help="list the registered strategies")
    p.set_defaults(func=_cmd_strategies)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
