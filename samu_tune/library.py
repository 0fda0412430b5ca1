"""The scan, the fused SAMU layer, the decode step and the linear scans as torch.library
operators.

Namespace ``samu_tune``: ``scan_fwd`` / ``scan_bwd``, ``layer_fwd`` / ``layer_bwd``,
``decode_step`` (functional) and ``decode_step_`` (writes its outputs in place), and the
generic real / complex scans ``linear_fwd`` / ``linear_bwd``.  Each has a
fake (meta) implementation that gives the outputs' shapes, dtypes and strides from the inputs
alone (no dispatch decision: symbolic shapes trace), and the forward operators' autograd is
registered to their backward operators, so ``torch.compile(..., fullgraph=True)`` traces a
model calling :func:`samu_tune.scan`, :class:`samu_tune.SAMU` or ``SAMU.step`` without a graph
break and ``mode="reduce-overhead"`` captures the kernels in CUDA graphs.

The dispatch decision is made inside the operators (memoized per call signature, as in eager
calls; never tuned while a CUDA graph is captured), so a compiled graph follows the cache like
eager code does.  The backward operator decides again with the forward's call signature and
hits the same memo entry.  What backward needs beyond inputs and outputs is returned by the
forward operator as a tensor (``aux``: the look-back loop walk's control table [B L, 4] fp32,
written by the forward kernel); other per-launch state is recomputed or re-zeroed by the
backward operator.  An operator's outputs may not alias each other or its inputs: outputs
that share storage (views of one workspace, e.g. two gradient sums) are copied
(:func:`_owned`: only vectors and [B, L] / [B, M] tensors in practice).

Each op's operators are in its package (``samu_tune/ops/<op>/library.py``); this module holds
what they share.  Eager calls do not go through these operators: the strategies' autograd Functions are called
directly, which costs less host time per call than the dispatcher's boxed Python kernels.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import torch
from torch import Tensor

F32 = torch.float32
# the namespace's operators, defined and implemented here (:func:`operator`)
_LIB = torch.library.Library("samu_tune", "DEF")
# the files whose code decides the defined operators' outputs and backward formulas
_INTERFACE_FILES = ("library.py", "autograd.py", "ops/scan/library.py",
                    "ops/scan/grad_block.py", "ops/layer/library.py", "ops/linear/library.py",
                    "ops/scan/strategies/lookback.py", "ops/layer/fused_autograd.py",
                    "ops/scan/controls.py", "kernels/controller.py", "kernels/controls.py")


@functools.lru_cache(maxsize=None)
def interface_version() -> str:
    """The overload name of every operator :func:`operator` defines: ``i`` and 8 hex digits of
    the sha256 of :data:`_INTERFACE_FILES` (the package version where they cannot be read).
    torch.compile's on-disk caches (FX graph, AOTAutograd) key a graph by the names of the
    operators it calls, not by their fakes or backward formulas: after an upgrade that
    changed what an operator returns, a graph cached by the old version would run against
    the new operators (an assertion at best).  A new overload name makes such a graph miss."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    try:
        for name in _INTERFACE_FILES:
            digest.update((root / name).read_bytes())
    except OSError:
        from samu_tune import __version__
        digest.update(__version__.encode())
    return "i" + digest.hexdigest()[:8]


class Operator:
    """``samu_tune::<name>.<interface_version()>``: the schema inferred from ``fn``'s
    annotations (as ``torch.library.custom_op`` infers it; no argument mutated), ``fn`` the
    kernel of every device (``CompositeExplicitAutograd``), tagged PT2-compliant and with
    ``register_fake`` and ``register_autograd`` as a custom op has them; calling it calls that
    overload (``op``), which is what a compiled graph records.  The dispatcher calls ``fn``
    itself:
    ``custom_op`` puts three Python wrappers between them (its device dispatch, a dynamo
    guard and an output aliasing check) that cost host time on every call of a compiled
    graph.  The aliasing rule still holds: the operators' outputs go through :func:`owned`."""

    def __init__(self, name: str, fn) -> None:
        version = interface_version()
        self.name, self.qualname = name, f"samu_tune::{name}.{version}"
        _LIB.define(f"{name}.{version}" + torch.library.infer_schema(fn, mutates_args=()),
                    tags=(torch.Tag.pt2_compliant_tag,))
        _LIB.impl(f"{name}.{version}", fn, "CompositeExplicitAutograd")
        self.op = getattr(getattr(torch.ops.samu_tune, name), version)
        self.__wrapped__ = fn

    def register_fake(self, fake):
        torch.library.register_fake(self.qualname, fake, lib=_LIB)
        return fake

    def register_autograd(self, backward, *, setup_context) -> None:
        torch.library.register_autograd(self.qualname, backward, setup_context=setup_context,
                                        lib=_LIB)

    def __call__(self, *args):
        return self.op(*args)


def operator(name: str):
    """Decorator: ``fn`` as the operator ``samu_tune::<name>`` (:class:`Operator`)."""
    return lambda fn: Operator(name, fn)


assume_constant = getattr(torch.compiler, "assume_constant_result", lambda f: f)
is_compiling = getattr(torch.compiler, "is_compiling", None) or (lambda: False)
# torch._disable_dynamo is torch.compiler.disable with the import of torch._dynamo (about 2 s
# on a slow host) deferred to the first call
disable_dynamo = getattr(torch, "_disable_dynamo", None) or torch.compiler.disable


@assume_constant
def strategy_string(strategy) -> str:
    """A strategy argument (``"auto"``, a name, or ``(name, config)``) as an operator's str
    argument: the name itself, or JSON ``[name, config dict]``."""
    if isinstance(strategy, str):
        return strategy
    if isinstance(strategy, (tuple, list)) and len(strategy) == 2:
        name, cfg = strategy
        if hasattr(cfg, "model_dump"):
            cfg = cfg.model_dump(mode="json")
        return json.dumps([name, cfg])
    raise TypeError(f"strategy must be 'auto', a strategy name or (name, config), "
                    f"got {strategy!r}")


def strategy_arg(text: str):
    if text.startswith("["):
        name, cfg = json.loads(text)
        return (name, cfg)
    return text


def owned(outputs: tuple, inputs: tuple = ()) -> tuple:
    """``outputs`` with every tensor that is an offset or strided view (the fake
    implementations give fresh contiguous tensors; two views of one allocation are offset
    from each other) or starts where an input or an earlier output starts, replaced by a
    contiguous copy: an operator's outputs may not alias each other or its inputs."""
    seen = {t.data_ptr() for t in inputs if isinstance(t, Tensor) and t.numel()}
    out = []
    for t in outputs:
        if isinstance(t, Tensor) and t.numel():
            if t.storage_offset() or not t.is_contiguous() or t.data_ptr() in seen:
                t = t.clone(memory_format=torch.contiguous_format)
            seen.add(t.data_ptr())
        out.append(t)
    return tuple(out)


