"""``samu-tune strategies`` and ``samu-tune explain``: the registry and dispatch, in words."""
from __future__ import annotations

import argparse
import json

import torch

from samu_tune import registry
from samu_tune.explanation import explain_problem
from samu_tune.ops.decode.problem import DecodeProblem
from samu_tune.ops.layer.problem import LayerProblem
from samu_tune.ops.linear.problem import LinearProblem
from samu_tune.ops.scan.problem import ScanProblem
from samu_tune.cli import console, render
from samu_tune.cli.console import CLIError


def run_strategies(args: argparse.Namespace) -> int:
    ops = [args.op] if args.op else sorted(registry.ops(), key=lambda o: (o != "scan", o))
    if args.op and args.op not in registry.ops():
        raise CLIError(f"--op {args.op}: no such op; registered: {', '.join(registry.ops())}")
    if args.json:
        print(json.dumps([dict(
            op=s.op, name=s.name, description=s.description, priority=s.priority,
            capability=s.capability.model_dump(mode="json"), configs=len(s.configs()),
            deterministic=s.capability.deterministic,
            config_fields=list(s.config_model.model_fields))
            for op in ops for s in registry.all_strategies(op)], indent=1))
        return 0
    for op in ops:
        console.out().print(render.strategies_table(registry.all_strategies(op), op))
    return 0


def problem_from_args(args: argparse.Namespace):
    """The ScanProblem, LayerProblem (``--op layer``: the layer's scan fields, final state
    always), DecodeProblem (``--op decode``: B, M, dtype, a state given or not) or
    LinearProblem (``--op linear``: B, L, D, dtypes, complex, reverse, a state given or not)
    of the explain arguments."""
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda: no CUDA GPU found (explain uses this device's "
                       "signature and cache)")
    op = getattr(args, "op", "scan")
    width, other = ("D", "M") if op == "linear" else ("M", "D")
    if getattr(args, width, None) is None:
        raise CLIError(f"--{width} is required for --op {op}")
    if getattr(args, other, None) is not None:
        raise CLIError(f"--{other}: --op {op} takes --{width}")
    linear_only = [f for f, v in (("--a-dtype", args.a_dtype), ("--complex", args.complex),
                                  ("--reverse", args.reverse)) if v]
    if op != "linear" and linear_only:
        raise CLIError(f"{', '.join(linear_only)}: only for --op linear")
    if op == "decode":
        if args.L is not None:
            raise CLIError("--L: a decode step has no sequence length (drop --L for --op "
                           "decode)")
        return DecodeProblem(B=args.B, M=args.M, dtype=args.dtype, device=device,
                             initial_state=args.initial_state)
    if args.L is None:
        raise CLIError(f"--L is required for --op {op}")
    if op == "linear":
        samu_only = [f for f, v in (("--resets", args.resets),
                                    ("--final-state", args.final_state)) if v]
        if samu_only:
            raise CLIError(f"{', '.join(samu_only)}: not for --op linear")
        return LinearProblem(B=args.B, L=args.L, D=args.D, dtype=args.dtype,
                             a_dtype=args.a_dtype or "float32", complex=args.complex,
                             reverse=args.reverse, initial_state=args.initial_state,
                             backward=args.mode == "train", device=device,
                             deterministic=args.deterministic)
    if op == "layer":
        return LayerProblem(B=args.B, L=args.L, M=args.M, dtype=args.dtype, device=device,
                            backward=args.mode == "train", resets=args.resets,
                            initial_state=args.initial_state, final_state=True,
                            deterministic=args.deterministic)
    return ScanProblem(B=args.B, L=args.L, M=args.M, dtype=args.dtype,
                       control_dtype=args.control_dtype, device=device,
                       backward=args.mode == "train", resets=args.resets,
                       initial_state=args.initial_state, final_state=args.final_state,
                       deterministic=args.deterministic)


def run_explain(args: argparse.Namespace) -> int:
    ex = explain_problem(problem_from_args(args), policy=args.policy)
    if args.json:
        print(ex.model_dump_json(indent=1))
        return 0 if ex.strategy else 1
    out = console.out()
    out.print(render.explain_table(ex))
    if ex.strategy is None:
        out.print(f"[red]dispatch cannot run it[/red] (policy {ex.policy}): ", end="")
        out.print(ex.error or "", markup=False)
        return 1
    out.print(f"dispatch (policy {ex.policy}) would choose [bold]{ex.strategy}[/bold] "
              f"({render.config_text(ex.config)}) from {ex.source}"
              + (f" [{ex.source_key}]" if ex.source_key else "").replace("[", "\\[") + ":")
    out.print(f"  {ex.detail}", markup=False)
    if ex.trail:
        out.print("passed over:")
        for line in ex.trail:
            out.print(f"  - {line}", markup=False)
    return 0
