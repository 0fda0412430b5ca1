"""``samu-tune cache path|clear|export|import``: the winner cache on disk."""
from __future__ import annotations

import argparse
import sys

from samu_tune import cache
from samu_tune.cli import console
from samu_tune.cli.console import CLIError


def _elsewhere(sig: str) -> str:
    """A hint naming the other devices' cache files (e.g. ``cpu-interpreter``, where
    ``profile`` on a CPU stores its winners), or "" when there are none."""
    others = [s for s in cache.signatures() if s != sig]
    return (f"cache files of other devices: {', '.join(others)} (--device SIGNATURE)"
            if others else "")


def run_path(args: argparse.Namespace) -> int:
    sig = cache.signature_of(args.device)
    print(cache.cache_dir())
    print(f"{cache.path(sig)}  (this device: {sig}"
          f"{'' if cache.path(sig).exists() else ', not written yet'})")
    if hint := _elsewhere(sig):
        print(hint)
    return 0


def run_clear(args: argparse.Namespace) -> int:
    what = "every device" if args.all else cache.signature_of(args.device)
    if not args.yes:
        if not sys.stdin.isatty():
            raise CLIError(f"cache clear removes the cached winners of {what}: pass --yes to "
                           f"confirm")
        answer = input(f"Remove the cached winners of {what} in {cache.cache_dir()}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    n = cache.clear(None if args.all else args.device, all_devices=args.all)
    print(f"removed {n} cached winner(s) of {what} from {cache.cache_dir()}")
    if not n and not args.all and (hint := _elsewhere(what)):
        print(hint)
    return 0


def run_export(args: argparse.Namespace) -> int:
    sig = cache.signature_of(args.device)
    try:
        n = cache.export(args.file, sig, served_only=args.served_only)
    except OSError as exc:
        raise CLIError(f"cannot export to {args.file}: {exc.strerror or exc}", 1) from None
    print(f"exported {n} entr{'y' if n == 1 else 'ies'} of {sig} to {args.file}")
    if not n and (hint := _elsewhere(sig)):
        print(hint)
    return 0


def run_import(args: argparse.Namespace) -> int:
    try:
        n = cache.import_(args.file)
    except FileNotFoundError:
        raise CLIError(f"{args.file}: no such cache file") from None
    except (ValueError, OSError) as exc:
        raise CLIError(f"cannot import {args.file}: {exc}") from None
    console.out().print(f"imported {n} new or newer entr{'y' if n == 1 else 'ies'} from "
                        f"{args.file} into {cache.cache_dir()}", markup=False)
    return 0
