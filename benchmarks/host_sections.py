"""Where a scan call's host time goes, by function: part of ``benchmarks/host_floor.py``.

The scan's forward and forward+backward (as they run, and with launches stubbed:
:func:`~benchmarks.host_floor.launches_stubbed`) with each function of :data:`SECTIONS`
wrapped by a ``perf_counter`` timer, queued behind a GPU busy-wait as bench_host measures
host time.  Each section's time is inclusive (a section called from another counts in both)
and includes the cost of its own timer and of those nested in it; the call's host time
without and with the timers is reported beside it, and their difference per timed call
(``timer_us``: 0.4 us on the development CPU, about 5.6 us on an H100 host,
docs/performance.md).
``torch.autograd.backward`` is the engine's whole backward, the strategy's backward node
(``_LookbackScan.backward``) inside it.
"""
from __future__ import annotations

import contextlib
import importlib
import time
from typing import Callable

from benchmarks.host_floor import host_time

# (module, attribute path): the scan call's steps, outermost first
SECTIONS = (
    ("samu_tune", "scan"),
    ("samu_tune.ops.scan.api", "validate"),
    ("samu_tune.ops.scan.api", "decide"),
    ("samu_tune.ops.scan.api", "run"),
    ("samu_tune.ops.scan.strategies.lookback", "_LookbackScan.forward"),
    ("samu_tune.ops.scan.strategies.lookback", "_LookbackScan.backward"),
    ("samu_tune.ops.scan.strategies.lookback", "_launch"),
    ("samu_tune.ops.scan.strategies.lookback", "_Zeroed.of"),
    ("samu_tune.ops.scan.strategies.lookback", "_Zeroed.for_backward"),
    ("samu_tune.ops.scan.strategies.lookback", "_incoming"),
    ("samu_tune.autograd", "output_pair"),
    ("samu_tune.autograd", "pair"),
    ("samu_tune.autograd", "grad_outputs"),
    ("samu_tune.autograd", "input_grads"),
    ("samu_tune.scratch", "fp32"),
    ("torch.autograd", "backward"),
)


@contextlib.contextmanager
def timed(sections=SECTIONS):
    """Inside the block each section is wrapped by a timer; yields the dict name ->
    [seconds, calls] they add to.  Static and class methods stay what they were."""
    acc: dict[str, list] = {}
    saved = []

    def wrap(label: str, fn: Callable) -> Callable:
        slot = acc.setdefault(label, [0.0, 0])

        def timed_fn(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                slot[0] += time.perf_counter() - t0
                slot[1] += 1
        return timed_fn

    try:
        for module, path in sections:
            *owners, name = path.split(".")
            owner = importlib.import_module(module)
            for part in owners:
                owner = getattr(owner, part)
            own = name in vars(owner)
            raw = vars(owner)[name] if own else getattr(owner, name)
            saved.append((owner, name, raw, own))
            kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
            label = (f"{module.split('.')[-1]}.{path}" if module.startswith("samu_tune")
                     else f"{module}.{path}")
            new = wrap(label, raw.__func__ if kind else raw)
            setattr(owner, name, kind(new) if kind else new)
        yield acc
    finally:
        for owner, name, raw, own in reversed(saved):
            if own:
                setattr(owner, name, raw)
            else:                    # inherited: the wrapper goes, the base's shows again
                delattr(owner, name)


def section_times(call: Callable, n: int, clock, warmup: int = 3) -> dict:
    """Host us per call of each section over ``n`` calls behind the clock's busy-wait; the
    call's host time without the timers (``plain_us``) and with them (``host_us``), and what
    one timer added (``timer_us``: their difference over the timed calls per call)."""
    wall_ms, plain = host_time(call, n, clock, warmup)
    calls = [0]

    def counted():
        calls[0] += 1
        return call()

    with timed() as acc:
        host = clock.behind_sleep(counted, n, wall_ms)
        # every try of the measurement ran calls: per call over all of them
        done = max(calls[0], 1)
        rows = {name: {"us": s * 1e6 / done, "calls": c / done}
                for name, (s, c) in acc.items() if c}
    timed_calls = sum(r["calls"] for r in rows.values())
    host_us, plain_us = host["host_ms"] * 1e3, plain["host_ms"] * 1e3
    return {"host_us": host_us, "plain_us": plain_us,
            "timer_us": (host_us - plain_us) / timed_calls if timed_calls else None,
            "sections": rows}


def sections_markdown(rows: list[dict], fmt: Callable) -> list[str]:
    """One table per call: its sections, largest first."""
    lines = []
    for r in rows:
        if "error" in r:
            lines += ["", f"{r['case']}: {r['error'][:200]}"]
            continue
        lines += ["", f"**{r['case']}**: {fmt(r.get('plain_us'))} us per call, "
                  f"{fmt(r['host_us'])} with the timers (one timer: {fmt(r.get('timer_us'))} us)",
                  "",
                  "| section (inclusive) | host us/call | calls |", "|---|---|---|"]
        for name, s in sorted(r["sections"].items(), key=lambda kv: -kv[1]["us"]):
            lines.append(f"| {name} | {fmt(s['us'])} | {s['calls']:.1f} |")
    return lines
