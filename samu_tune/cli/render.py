"""Rich tables of the CLI (pure functions: data in, renderables out)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from rich import box
from rich.table import Table

from samu_tune.cache import EntryStatus

if TYPE_CHECKING:
    from samu_tune.explanation import Explanation
    from samu_tune.registry import Strategy
    from samu_tune.cli.rows import ProfileRow


def _table(**kw) -> Table:
    """Light borders: more room for the cells on narrow terminals."""
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, **kw)


def ms(t: Optional[float]) -> str:
    return "-" if t is None else f"{t:.4g}"


def times(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def config_text(config: Optional[dict]) -> str:
    if not config:
        return "-"
    return " ".join(f"{k}={v}" for k, v in config.items())


def profile_tables(rows: Sequence["ProfileRow"], signature: str, *, cpu: bool,
                   bandwidth: Optional[float]) -> list[Table]:
    """One table per mode: winner, config, time, % of copy bandwidth, speedups, failures."""
    tables = []
    for mode in ("forward", "train"):
        chosen = [r for r in rows if r.mode == mode]
        if not chosen:
            continue
        if cpu:
            title = (f"{mode}: CPU wall times on {signature} (not GPU timings)")
        else:
            bw = f"{bandwidth / 1e12:.2f} TB/s" if bandwidth else "n/a"
            title = f"{mode} on {signature} (copy bandwidth {bw})"
        t = _table(title=title, title_justify="left")
        # shape keys, names and numbers never wrap: config gives way on narrow terminals
        t.add_column("shape", no_wrap=True)
        t.add_column("winner", no_wrap=True)
        t.add_column("config")
        t.add_column("CPU ms" if cpu else "ms", justify="right", no_wrap=True)
        t.add_column("%bw", justify="right", no_wrap=True)
        t.add_column("vs 2nd", justify="right", min_width=8)
        t.add_column("vs rule", justify="right", min_width=8)
        t.add_column("failed", justify="right", no_wrap=True)
        t.add_column("source", no_wrap=True)
        for r in chosen:
            pct = "n/a" if r.copy_bw_fraction is None else f"{100 * r.copy_bw_fraction:.0f}%"
            up = times(r.speedup_vs_runner_up)
            if r.runner_up and r.speedup_vs_runner_up is not None:
                up += f"\n{r.runner_up.split('[')[0]}"
            if r.rule_default and r.winner == r.rule_default:
                rule = "is default"
            else:
                rule = times(r.speedup_vs_rule_default)
                if r.rule_default and r.speedup_vs_rule_default is not None:
                    rule += f"\n{r.rule_default.split('[')[0]}"
            failed = "-" if r.failed is None else str(r.failed)
            if r.skipped:
                failed += f" (+{r.skipped} skipped)"
            t.add_row(r.key, r.strategy or "[red]none[/red]", config_text(r.config),
                      ms(r.time_ms), pct, up, rule, failed, r.source)
        tables.append(t)
    return tables


LEGEND = ("%bw: share of the measured copy bandwidth (forward moves 4 arrays of [B, L, M], "
          "train about 10); vs 2nd / vs rule: the runner-up's / the rule-based default's time "
          "over the winner's.")


def failure_lines(rows: Iterable["ProfileRow"], limit: int = 10) -> list[str]:
    """Why candidates failed (first ``limit``), and why shapes have no winner."""
    lines = []
    for r in rows:
        for f in r.failures:
            lines.append(f"  {r.key}: {f['candidate']}: {f['reason']}")
        if r.time_ms is None and r.ineligible and not r.failures:
            for name, reasons in r.ineligible.items():
                lines.append(f"  {r.key}: {name} ineligible: {'; '.join(reasons)}")
    if not lines:
        return []
    more = len(lines) - limit
    lines = lines[:limit] + ([f"  ... and {more} more"] if more > 0 else [])
    return ["[bold]failed candidates:[/bold]"] + [_escape(x) for x in lines]


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(text)


def cache_table(statuses: Sequence[EntryStatus], title: str) -> Table:
    """Cached (or shipped) winners; a device column only when they span several devices."""
    several = len({s.signature for s in statuses}) > 1
    if not several and statuses:
        title += f" for {statuses[0].signature}"
    t = _table(title=title, title_justify="left")
    if several:
        t.add_column("device", no_wrap=True)
    t.add_column("shape", no_wrap=True)
    t.add_column("winner", no_wrap=True)
    t.add_column("config")
    t.add_column("ms", justify="right", no_wrap=True)
    t.add_column("vs 2nd", justify="right", no_wrap=True)
    t.add_column("served")
    t.add_column("measured", no_wrap=True)
    for s in statuses:
        e = s.entry
        unit = " CPU" if e.cpu_wall_time else ""
        margin = times(None if e.margin is None else 1 + e.margin)
        served = "yes" if s.served else f"no: {s.reason}"
        row = [e.key, e.strategy, config_text(e.config), ms(e.time_ms) + unit, margin,
               _escape(served), e.measured_at[:10]]
        t.add_row(*([s.signature] if several else []), *row)
    return t


def capability_text(s: "Strategy") -> str:
    cap = s.capability
    parts = ["devices " + ",".join(sorted(cap.devices)) + (" (Triton)" if cap.triton else ""),
             "dtypes " + ",".join(sorted(cap.dtypes))]
    # the scan's capability has feature flags and limits; other ops' capabilities need not
    features = [name for name, flag in (("resets", "resets"), ("h0", "initial_state"),
                                        ("final", "final_state"), ("backward", "backward"))
                if getattr(cap, flag, False)]
    if any(hasattr(cap, flag) for flag in ("resets", "backward")):
        parts.append("features " + (",".join(features) or "none"))
    if getattr(cap, "max_modes", None) is not None:
        parts.append(f"M<={cap.max_modes}")
    if getattr(cap, "max_length", None) is not None:
        parts.append(f"L<={cap.max_length}")
    if getattr(cap, "min_compute_capability", None) is not None:
        parts.append("sm>=%d%d" % cap.min_compute_capability)
    if getattr(cap, "modes_multiple", 1) > 1:
        parts.append(f"M % {cap.modes_multiple} == 0")
    if not getattr(cap, "interpreter", True):
        parts.append("no interpreter (Gluon)")
    if getattr(cap, "fused_io", False):
        parts.append("needs a loop-inner look-back config")
    return "; ".join(parts)


def strategies_table(strategies: Sequence["Strategy"], op: str = "scan") -> Table:
    t = _table(title=f"registered {op} strategies (highest priority first)",
               title_justify="left")
    t.add_column("name", no_wrap=True)
    t.add_column("description")
    t.add_column("capability")
    t.add_column("configs", justify="right")
    t.add_column("deterministic")
    t.add_column("priority", justify="right")
    for s in strategies:
        t.add_row(s.name, s.description, capability_text(s), str(len(s.configs())),
                  "yes" if s.capability.deterministic else "no", str(s.priority))
    return t


def explain_table(ex: "Explanation") -> Table:
    t = _table(title=f"strategies for {ex.problem.key()} on {ex.signature}", title_justify="left")
    t.add_column("strategy", no_wrap=True)
    t.add_column("eligible", no_wrap=True)
    t.add_column("reasons / default config")
    t.add_column("configs", justify="right")
    t.add_column("priority", justify="right")
    for r in ex.strategies:
        what = config_text(r.default_config) if r.eligible else "; ".join(r.reasons)
        t.add_row(r.name, "[green]yes[/green]" if r.eligible else "[red]no[/red]",
                  _escape(what), str(r.configs) if r.eligible else "-", str(r.priority))
    return t
