"""``samu-tune show``: the cached winners (user cache) and the shipped tables (--defaults)."""
from __future__ import annotations

import argparse
import json
from typing import Optional

from rich.console import Console

from samu_tune import cache
from samu_tune.cache import EntryStatus
from samu_tune.cli import console, render


def _filter(statuses: list[EntryStatus], shape: Optional[str], mode: Optional[str]
            ) -> list[EntryStatus]:
    return [s for s in statuses
            if (not shape or shape.lower() in s.entry.key.lower())
            and (not mode or s.entry.mode == mode)]


def shipped_signatures() -> list[str]:
    """Signatures with a table in ``samu_tune/defaults/``."""
    return sorted(p.stem for p in cache.DEFAULTS_DIR.glob("*.json"))


def shipped(shape: Optional[str] = None, mode: Optional[str] = None,
            signature: Optional[str] = None) -> list[EntryStatus]:
    out = []
    for sig in shipped_signatures():
        if signature is None or sig == signature:
            out += [s for s in cache.entries(sig, include_shipped=True) if s.shipped]
    return _filter(out, shape, mode)


def print_defaults(out: Console, shape: Optional[str] = None, mode: Optional[str] = None,
                   signature: Optional[str] = None) -> int:
    """Print the shipped tables (or a line saying there are none); returns #entries."""
    sigs = shipped_signatures()
    if not sigs:
        out.print(f"No shipped GPU tables yet: {cache.DEFAULTS_DIR} holds no "
                  f"<signature>.json (they are measured on real GPUs and added by the "
                  f"developers).")
        return 0
    statuses = shipped(shape, mode, signature)
    if not statuses:
        out.print(f"No shipped entries match (tables for: {', '.join(sigs)}).")
        return 0
    console.print_table(out, render.cache_table(statuses, f"shipped tables ({cache.DEFAULTS_DIR})"))
    return len(statuses)


def run(args: argparse.Namespace) -> int:
    out = console.out()
    if args.defaults:
        if args.json:
            print(json.dumps([s.model_dump(mode="json")
                              for s in shipped(args.shape, args.mode, args.device)], indent=1))
        else:
            print_defaults(out, args.shape, args.mode, args.device)
        return 0
    import torch
    if args.all or (args.device is None and not torch.cuda.is_available()):
        statuses = cache.entries(all_devices=True)
        where = f"all devices in {cache.cache_dir()}"
    else:
        sig = cache.signature_of(args.device)
        statuses = cache.entries(sig)
        where = str(cache.path(sig))
    statuses = _filter(statuses, args.shape, args.mode)
    if args.json:
        print(json.dumps([s.model_dump(mode="json") for s in statuses], indent=1))
        return 0
    if not statuses:
        have = cache.signatures()
        out.print(f"No cached winners{' matching' if args.shape or args.mode else ''} in "
                  f"{where}." + (f" Cache files exist for: {', '.join(have)} (--device SIG or "
                                 f"--all)." if have else " Run samu-tune profile first."),
                  markup=False)
        return 0
    console.print_table(out, render.cache_table(statuses, f"cached winners ({where})"))
    return 0
