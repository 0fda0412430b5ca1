"""Where a scan call's host time goes, by function: part of ``benchmarks/host_floor.py``.

The scan's forward and forward+backward (as they run, and with launches stubbed:
:func:`~benchmarks.host_floor.launches_stubbed`) with each function of :data:`SECTIONS`
wrapped by a ``perf_counter`` timer, queued behind a GPU busy-wait as bench_host measures
host time.  Each section's time is
inclusive (a section called from another counts in both) and includes its timer's own cost
(two ``perf_counter`` calls, well under a microsecond); the call's host time with the timers
is reported beside it.  ``torch.autograd.backward`` is the engine's whole backward, the
strategy's backward node (``_LookbackScan.backward``) inside it.
"""
from __future__ import annotations

import contextlib
import importlib
import time
from typing import Callable

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
            raw = owner.__dict__.get(name, getattr(owner, name))
            saved.append((owner, name, raw))
            kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
            new = wrap(f"{module.split('.')[-1]}.{path}", raw.__func__ if kind else raw)
            setattr(owner, name, kind(new) if kind else new)
        yield acc
    finally:
        for owner, name, raw in reversed(saved):
            setattr(owner, name, raw)


def timer_cost_us(n: int = 2000) -> float:
    """What one timer adds to a call, in us: a timed no-op against the plain one (best of
    three rounds of ``n``)."""
    def best(fn) -> float:
        rounds = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            rounds.append((time.perf_counter() - t0) / n)
        return min(rounds)

    plain = best(_Probe.fn)
    with timed(((__name__, "_Probe.fn"),)):
        wrapped = best(_Probe.fn)
    return max(0.0, (wrapped - plain) * 1e6)


class _Probe:
    """The no-op :func:`timer_cost_us` wraps."""

    @staticmethod
    def fn():
        return None


def section_times(call: Callable, n: int, clock, warmup: int = 3) -> dict:
    """Host us per call of each section over ``n`` calls behind the clock's busy-wait, the
    call's host time with the timers (``host_us``) and what one timer adds (``timer_us``:
    a section's time includes that of each timer nested in it)."""
    for _ in range(warmup):
        call()
    with timed() as acc:
        clock.sync()
        wall = clock.wall(call, n, 1)
        for slot in acc.values():
            slot[:] = [0.0, 0]
        host = clock.behind_sleep(call, n, wall["wall_ms"])
        rows = {name: {"us": s * 1e6 / n, "calls": c / n} for name, (s, c) in acc.items() if c}
    return {"host_us": host["host_ms"] * 1e3, "timer_us": timer_cost_us(), "sections": rows}


def sections_markdown(rows: list[dict], fmt: Callable) -> list[str]:
    """One table per call: its sections, largest first."""
    lines = []
    for r in rows:
        if "error" in r:
            lines += ["", f"{r['case']}: {r['error'][:200]}"]
            continue
        lines += ["", f"**{r['case']}**: {fmt(r['host_us'])} us per call with the timers "
                  f"(one timer adds {fmt(r.get('timer_us'))} us)", "",
                  "| section (inclusive) | host us/call | calls |", "|---|---|---|"]
        for name, s in sorted(r["sections"].items(), key=lambda kv: -kv[1]["us"]):
            lines.append(f"| {name} | {fmt(s['us'])} | {s['calls']:.1f} |")
    return lines
