"""``samu-tune`` command line: builds the parser; each command lives in its own module.

profile (profile.py), show (show.py), strategies / explain (info.py), cache (cachecmd.py);
rendering in render.py, progress in progress.py, consoles and errors in console.py.  Nothing
else in the package imports the CLI, and only the CLI renders with rich.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from samu_tune.problem import dtype_name
from samu_tune.cli.console import CLIError, error
from samu_tune.cli.shapes import ShapesError


def _int_at_least(low: int, text: str) -> int:
    what = "a positive" if low == 1 else "a non-negative"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what} integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what} integer, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(1, text)


def _nonnegative_int(text: str) -> int:
    return _int_at_least(0, text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _dtype(text: str) -> str:
    try:
        return dtype_name(text)
    except TypeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _profile_parser(sub) -> None:
    from samu_tune.cli import profile
    p = sub.add_parser(
        "profile", help="tune every shape of a shapes file, cache the winners, show tables",
        description="Tune every shape of a shapes YAML file (see examples/shapes.yaml), store "
                    "the winners in the cache and print one table per mode.  Without a CUDA "
                    "GPU the shapes run on the CPU (Triton interpreter with TRITON_INTERPRET=1)"
                    " and are labelled as CPU timings.")
    p.add_argument("--shapes", required=True, metavar="FILE", help="the shapes YAML file")
    p.add_argument("--mode", choices=("forward", "train", "both"),
                   help="override every entry's mode (default: each entry's own)")
    p.add_argument("--strategies", metavar="A,B", help="only these strategies (comma-separated)")
    p.add_argument("--budget", type=_positive_float, metavar="SECONDS",
                   help="per shape: no new candidate starts after this many seconds (default "
                        f"on a GPU: {profile.DEFAULT_BUDGET_S:.0f}, the known winners of nearby "
                        "shapes timed first; none on the CPU)")
    p.add_argument("--patience", type=_positive_int, metavar="N",
                   help="per shape: stop refining after N candidates in a row without a gain "
                        "of more than 1%% (default SAMU_TUNE_TUNE_PATIENCE, 6)")
    p.add_argument("--exhaustive", action="store_true",
                   help="time every config of every eligible strategy, without a budget or "
                        "patience "
                        "(minutes a shape on a cold machine; to check what the budgeted "
                        "search picks)")
    p.add_argument("--max-configs", type=_positive_int, metavar="N",
                   help="per shape: evaluate at most N candidates")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: at most {profile.QUICK_MAX_CONFIGS} candidates per shape "
                        f"({profile.QUICK_REPS} timing samples each on the CPU)")
    p.add_argument("--compile-workers", type=_nonnegative_int, metavar="N",
                   help="processes compiling the candidates' kernels ahead of timing (default "
                        "SAMU_TUNE_COMPILE_WORKERS, else on a GPU the host's cores less one, "
                        "at most 8 per tuning process; 0: none)")
    p.add_argument("--force", action="store_true", help="re-tune shapes already in the cache")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where to run (default: cuda if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print machine-readable results only")
    p.add_argument("--show-defaults", action="store_true",
                   help="also show the shipped GPU tables of samu_tune/defaults/")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="without a terminal: one progress line per candidate")
    p.set_defaults(func=profile.run)


def _show_parser(sub) -> None:
    from samu_tune.cli import show
    p = sub.add_parser("show", help="table of cached winners (or the shipped tables)")
    p.add_argument("--device", metavar="SIGNATURE",
                   help="a device signature, e.g. NVIDIA-H200-sm90-132sm (default: this GPU; "
                        "every device without one)")
    p.add_argument("--all", action="store_true", help="every device with a cache file")
    p.add_argument("--shape", metavar="TEXT", help="only keys containing TEXT, e.g. B8-L4096")
    p.add_argument("--mode", choices=("forward", "train"), help="only this mode")
    p.add_argument("--defaults", action="store_true",
                   help="the tables shipped in samu_tune/defaults/ instead of the user cache")
    p.add_argument("--json", action="store_true", help="print the entries as JSON")
    p.set_defaults(func=show.run)


def _info_parsers(sub) -> None:
    from samu_tune.cli import info
    p = sub.add_parser("strategies", help="list the registered strategies of every op")
    p.add_argument("--op", default=None, help="only this op (scan, decode, layer, linear)")
    p.add_argument("--json", action="store_true", help="print them as JSON")
    p.set_defaults(func=info.run_strategies)

    p = sub.add_parser("explain", help="eligibility of each strategy and what dispatch chooses")
    p.add_argument("--op", choices=("scan", "layer", "decode", "linear"), default="scan",
                   help="the scan (default), the SAMU layer, its decode step or the linear "
                        "scan (real_scan / complex_scan)")
    p.add_argument("--B", type=_positive_int, required=True)
    p.add_argument("--L", type=_positive_int, help="sequence length (not for --op decode)")
    p.add_argument("--M", type=_positive_int, help="modes (not for --op linear)")
    p.add_argument("--D", type=_positive_int, help="channels (--op linear only)")
    p.add_argument("--dtype", type=_dtype, default="bfloat16", help="dtype of br, bi (linear: b)")
    p.add_argument("--control-dtype", type=_dtype, default="float32", help="dtype of eta, delta")
    p.add_argument("--a-dtype", type=_dtype, help="--op linear: dtype of a (default float32)")
    p.add_argument("--complex", action="store_true", help="--op linear: complex_scan")
    p.add_argument("--reverse", action="store_true", help="--op linear: right to left")
    p.add_argument("--mode", choices=("forward", "train"), default="forward")
    p.add_argument("--resets", action="store_true", help="with segment_pos")
    p.add_argument("--initial-state", action="store_true", help="(decode: a state given)")
    p.add_argument("--final-state", action="store_true")
    p.add_argument("--deterministic", action="store_true", help="torch deterministic mode on")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--policy", choices=("cached", "online", "off"),
                   help="dispatch policy (default: SAMU_TUNE_MODE)")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.set_defaults(func=info.run_explain)


def _cache_parser(sub) -> None:
    from samu_tune.cli import cachecmd
    p = sub.add_parser("cache", help="the winner cache on disk: path, clear, export, import")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    c = csub.add_parser("path", help="print the cache directory and this device's file")
    c.add_argument("--device", metavar="SIGNATURE")
    c.set_defaults(func=cachecmd.run_path)
    c = csub.add_parser("clear", help="remove cached winners (this device, or --all)")
    c.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    c.add_argument("--device", metavar="SIGNATURE")
    c.add_argument("--all", action="store_true", help="every device")
    c.set_defaults(func=cachecmd.run_clear)
    c = csub.add_parser("export", help="write this device's cache file to FILE")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--device", metavar="SIGNATURE")
    c.add_argument("--served-only", action="store_true",
                   help="only entries the running versions would serve")
    c.set_defaults(func=cachecmd.run_export)
    c = csub.add_parser("import", help="merge FILE into the cache of its device signature")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=cachecmd.run_import)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="samu-tune", description="Tune, cache and inspect SAMU scan strategies.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _profile_parser(sub)
    _show_parser(sub)
    _info_parsers(sub)
    _cache_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (CLIError, ShapesError) as exc:
        error(str(exc))
        return getattr(exc, "status", 2)
    except KeyboardInterrupt:
        error("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
