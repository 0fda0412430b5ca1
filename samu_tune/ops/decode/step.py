"""One SAMU decode step on the GPU: ``decode_step(x [B, 2M], params, state) -> (y, state)``.

Strategies (all compute :func:`samu_tune.ops.layer.reference.step_reference`):

- ``single``: one program per batch row walks all mode tiles (the seed's ``samu_decode``);
  one launch, best when B alone fills the GPU.
- ``blocked``: one program per (mode tile, row) (the seed's ``samu_decode_blocked``); each
  recomputes the row's controller, so small B still spreads over many SMs.
- ``reference``: torch (any device, float64, differentiable).

They are registered strategies of the ``decode`` op (:mod:`samu_tune.ops.decode.spec`), tuned
by ``samu_tune.tune(DecodeProblem(B, M, dtype, device, initial_state))``.  ``"auto"`` takes
``reference`` when gradients are needed or the parameters are float64; otherwise it resolves
through :func:`samu_tune.dispatch.choose` like the scan: the exact tuned key in the cache, the
nearest tuned key in log-space of (B, M), the same two in the shipped table, the same without
the state, then the rule (``reference`` where the kernels cannot run -- a plain CPU, float64
x --, else ``blocked`` when M spans more than one mode tile, else ``single``: ``blocked`` won
every point tuned on the H200, B = 1..256 at M = 512 and 1024, see docs/performance.md; those
winners are in the shipped table).

Decode is host-bound (the kernel runs for a few microseconds), so the per-step host path is
kept short: a :class:`Decoder` (one per :class:`samu_tune.SAMU`) keeps

- the parameters digested into one fp32 buffer (:func:`decode_constants`: nu, cos/sin theta,
  gamma, unit directions, amplitude scales), rebuilt only when a parameter's storage or
  version counter changes (:class:`ConstantsCache`);
- the resolved strategy, config and grid per (B, dtype, device, state given), so a step does
  cheap checks, at most three allocations (none with ``out=``/``state_out=``) and one launch
  of a kernel with nine runtime arguments.  The cache is read once per plan (memoized per
  process across Decoders, :func:`samu_tune.dispatch.decide`); a Decoder's plans do not
  follow later cache writes (``SAMU.invalidate_decode_cache()`` re-resolves them).

Long because the step's host path (constants cache, plans, :class:`Decoder`, the traced
step) is measured and kept together: each call crosses all of it.
"""
from __future__ import annotations

import functools
import math
from typing import Literal, NamedTuple, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict

from samu_tune.library import is_compiling
from samu_tune import dispatch, intmath
from samu_tune.kernels import decode as kernels
from samu_tune.ops.decode import checks
from samu_tune.ops.decode.problem import DecodeProblem
from samu_tune.problem import dtype_name
from samu_tune.settings import settings
from samu_tune.alloc import empty
from samu_tune.ops.layer.controller import unit_directions
from samu_tune.ops.layer.reference import SAMUParams, State, needs_grad, step_reference, write_gamma
from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.kernel_device import runs_kernels as kernels_available
from samu_tune.launcher import fast

# the decode step kernel, launched directly after its first launch per specialisation
_step_kernel = fast(kernels.samu_decode_step)

DecodeName = Literal["single", "blocked", "reference"]


class DecodeConfig(BaseModel):
    """Launch choices of the decode kernels (the tuner's config space, pruned by
    :func:`samu_tune.ops.decode.spec.valid`)."""

    model_config = ConfigDict(frozen=True)

    block_m: Literal[16, 32, 64, 128, 256] = 64
    block_d: Literal[64, 128, 256, 512, 1024] = 512
    num_warps: Literal[1, 2, 4, 8] = 4


@functools.lru_cache(maxsize=None)
def default_config(name: str, M: int) -> DecodeConfig:
    cap = 256 if name == "single" else 64
    block_m = max(16, min(cap, intmath.next_power_of_2(M)))
    block_d = max(64, min(1024, intmath.next_power_of_2(2 * M + 1)))
    return DecodeConfig(block_m=block_m, block_d=block_d, num_warps=8 if block_d >= 512 else 4)


def rule_name(M: int) -> DecodeName:
    """The kernel the rule picks: ``blocked`` when M spans more than one mode tile of the
    blocked default config, else ``single`` (one program per row does the same work in one
    tile).  Not the batch size: the H200 tuning found ``blocked`` faster at every B."""
    tiles = intmath.cdiv(M, default_config("blocked", M).block_m)
    return "blocked" if tiles > 1 else "single"


def problem_of(x: torch.Tensor, M: int, state: Optional[State]) -> DecodeProblem:
    """The :class:`DecodeProblem` of a step on x [B, 2M] (the state given or not)."""
    return DecodeProblem(B=x.shape[0], M=M, dtype=dtype_name(x.dtype),
                         device="cuda" if x.is_cuda else "cpu", initial_state=state is not None)


def decision(x: torch.Tensor, M: int, state: Optional[State]) -> "dispatch.Decision":
    """What ``"auto"`` runs for a step on x (no gradients, fp32 parameters): memoized
    :func:`samu_tune.dispatch.choose` of its :class:`DecodeProblem`."""
    key = ("decode", x.shape[0], M, x.dtype, x.device, state is not None)
    return dispatch.decide(key, lambda: problem_of(x, M, state), x.device)


def choose(x: torch.Tensor, params: SAMUParams, state: Optional[State] = None) -> DecodeName:
    """The strategy ``"auto"`` runs (see the module docstring)."""
    if needs_grad(x, params, state) or any(p.dtype == torch.float64 for p in params):
        return "reference"
    return decision(x, params.modes, state).strategy.name


def _check_params(params: SAMUParams) -> None:
    M = params.modes
    for name, p, shape in (("phase_direction", params.phase_direction, (2 * M + 1,)),
                           ("radial_direction", params.radial_direction, (2 * M + 1,)),
                           ("phase_amplitude", params.phase_amplitude, ()),
                           ("radial_amplitude", params.radial_amplitude, ()),
                           ("theta_log", params.theta_log, (M,))):
        if tuple(p.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(p.shape)}")
    devices = {p.device for p in params}
    if len(devices) > 1:
        raise ValueError(f"the parameters must be on one device, got {sorted(map(str, devices))}")


def decode_constants(params: SAMUParams) -> torch.Tensor:
    """fp32 [8M + 4] on the parameters' device: what the kernel needs from the parameters.

    ``cat(nu, cos theta, sin theta, gamma [M each], d_p / |d_p|, d_r / |d_r| [2M + 1 each],
    tanh(a_p) / sqrt(M), tanh(a_r) / sqrt(M))`` (layout: :mod:`samu_tune.kernels.decode`),
    computed in float64 and rounded once.  No autograd graph.
    """
    _check_params(params)
    f64 = torch.float64
    with torch.no_grad():
        nu_log = params.nu_log.to(f64)
        theta = params.theta_log.to(f64).exp()
        amp = torch.stack([params.phase_amplitude, params.radial_amplitude]).to(f64)
        parts = [nu_log.exp(), theta.cos(), theta.sin(), write_gamma(nu_log),
                 unit_directions(params, f64).reshape(-1),
                 torch.tanh(amp) / math.sqrt(params.modes)]
        return torch.cat(parts).to(torch.float32)


class ConstantsCache:
    """``build(params)`` (default :func:`decode_constants`) memoised on the parameters'
    storage and version counter (the fused layer's no-grad operands use it too).

    An in-place change through torch (an optimizer step, ``load_state_dict``, ``p.add_``
    under ``no_grad``), assigning ``p.data``, or moving the module, changes the key and
    rebuilds the buffer.  A write the version counter does not see (through ``p.data.add_``,
    numpy, or another untracked alias) needs :meth:`clear`.  The cache holds the cached
    parameters' storages, so a freed parameter's address cannot come back under the same key.
    Parameters without a version counter (inference tensors) are not cached.
    """

    def __init__(self, build=None) -> None:
        self._build = build or decode_constants
        self.clear()

    def clear(self) -> None:
        self._key: Optional[tuple] = None
        self._value: Optional[torch.Tensor] = None
        self._storages: list = []
        self.float64 = False
        self.builds = 0  # how many times the buffer was built (tests, profiling)

    @staticmethod
    def _key_of(params: SAMUParams) -> Optional[tuple]:
        try:
            return (params.nu_log.device,
                    *[(p.data_ptr(), p._version) for p in params])
        except RuntimeError:  # inference tensors track no version
            return None

    def get(self, params: SAMUParams) -> torch.Tensor:
        key = self._key_of(params)
        if key is not None and key == self._key:
            return self._value
        value = self._build(params)
        self.builds += 1
        self.float64 = any(p.dtype == torch.float64 for p in params)
        if key is not None:
            self._key, self._value = key, value
            self._storages = [p.untyped_storage() for p in params]
        return value

    def __getstate__(self):  # a copy or pickle starts empty (its parameters are new tensors)
        return {"build": self._build}

    def __setstate__(self, state) -> None:
        self._build = state.get("build") or decode_constants
        self.clear()


class _Plan(NamedTuple):
    name: str
    M: int
    grid: tuple[int, int]
    tiles_per_program: int
    meta: dict


StrategyArg = Union[str, tuple[str, Union[DecodeConfig, dict, None]]]


def _plan(strategy: StrategyArg, x: torch.Tensor, params: SAMUParams,
          state: Optional[State], float64: bool) -> _Plan:
    if (float64 and strategy == "auto") or not x.shape[0]:     # B = 0: no kernel to run
        return _Plan("reference", params.modes, (0, 0), 0, {})
    return plan_for(strategy, x, params.modes, state is not None)


def plan_for(strategy: StrategyArg, x: torch.Tensor, M: int, has_state: bool) -> _Plan:
    """The launch plan of a step on x [B, 2M] (fp32 parameters): ``"auto"`` resolves through
    :func:`decision`; a name or (name, config) is checked and planned."""
    name, config = (strategy, None) if isinstance(strategy, str) else strategy
    B = x.shape[0]
    state = (x, x) if has_state else None          # decision() reads only "given or not"
    if name == "auto":
        d = decision(x, M, state)
        name, config = d.strategy.name, d.config
    if name == "reference":
        return _Plan("reference", M, (0, 0), 0, {})
    if name not in ("single", "blocked"):
        raise ValueError(f"unknown decode strategy {name!r}; "
                         "expected 'auto', 'single', 'blocked' or 'reference'")
    if not kernels_available(x):
        raise ValueError(f"decode strategy {name!r} needs CUDA tensors or TRITON_INTERPRET=1")
    if config is None:
        cfg = default_config(name, M)
    elif isinstance(config, DecodeConfig):
        cfg = config
    else:
        cfg = DecodeConfig(**config)
    return launch_plan(name, cfg, B, M, state is not None)


@functools.lru_cache(maxsize=1024)
def launch_plan(name: str, cfg: DecodeConfig, B: int, M: int, has_state: bool) -> _Plan:
    """Grid and launch arguments of kernel ``name`` (single / blocked) at ``cfg``: grid
    (programs, B), one program per row (single) or per BLOCK_M mode tile (blocked)."""
    tiles = intmath.cdiv(M, cfg.block_m)
    per_program = tiles if name == "single" else 1
    # the launch's keywords, the launch options included: one dict per plan, not per call
    meta = dict(HAS_STATE=has_state, BLOCK_D=cfg.block_d, BLOCK_M=cfg.block_m,
                num_warps=cfg.num_warps, **LAUNCH_OPTIONS)
    return _Plan(name, M, (intmath.cdiv(tiles, per_program), B), per_program, meta)


class Decoder:
    """Decode steps of one layer: the constants cache and the resolved launch plans.

    :meth:`step` is :func:`decode_step` with both remembered between calls.  The plans are
    keyed by (B, M, x dtype, x device, state given, interpreter on, float64 parameters) and
    are dropped when the ``strategy`` argument differs from the last call's (change a
    ``(name, config)`` strategy by passing a new value, not by mutating its config dict).
    """

    def __init__(self) -> None:
        self.constants = ConstantsCache()
        self._plans: dict = {}
        self._strategy: object = None
        self._outputs = checks.OutputsChecked()

    def clear(self) -> None:
        """Forget the constants and plans (after a parameter write torch cannot see)."""
        self.constants.clear()
        self._plans = {}

    def __getstate__(self):
        return {}

    def __setstate__(self, _state) -> None:
        self.__init__()

    def step(self, x: torch.Tensor, params: SAMUParams, state: Optional[State] = None, *,
             strategy: StrategyArg = "auto", out: Optional[torch.Tensor] = None,
             state_out: Optional[State] = None) -> tuple[torch.Tensor, State]:
        M = params.modes
        checks.check_inputs(x, M, state)
        if (out is not None or state_out is not None) and not is_compiling():
            self._outputs.check(x, state, out, state_out, M)
        if needs_grad(x, params, state):
            plan_name = strategy if isinstance(strategy, str) else strategy[0]
            if plan_name not in ("auto", "reference"):
                _plan(strategy, x, params, state, False)  # unknown names fail first
                raise ValueError(f"decode strategy {plan_name!r} has no backward; use "
                                 "'reference' (or torch.no_grad()) when gradients are needed")
            return _reference(x, params, state, out, state_out)
        if is_compiling():
            return _step_traced(x, params, state, strategy, out, state_out)
        consts = self.constants.get(params)
        if consts.device != x.device:
            raise ValueError(f"x and the parameters must be on one device, got {x.device} "
                             f"and {consts.device}")
        if strategy is not self._strategy and strategy != self._strategy:
            self._plans, self._strategy = {}, strategy
        key = (x.shape[0], M, x.dtype, x.device, state is None, settings().interpret,
               self.constants.float64)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan(strategy, x, params, state, self.constants.float64)
        if plan.name == "reference":
            return _reference(x, params, state, out, state_out)
        return _launch(plan, x, consts, state, out, state_out)


def _step_traced(x: torch.Tensor, params: SAMUParams, state: Optional[State],
                 strategy: StrategyArg, out: Optional[torch.Tensor],
                 state_out: Optional[State]) -> tuple[torch.Tensor, State]:
    """The step under torch.compile: the parameters digested in the graph
    (:func:`decode_constants`), the kernel as an operator (:mod:`samu_tune.ops.decode.library`):
    functional, or in place into ``out`` / ``state_out``."""
    from samu_tune.library import strategy_string
    from samu_tune.ops.decode import library  # noqa: F401  (registers the operators)
    if any(p.dtype == torch.float64 for p in params) or x.dtype == torch.float64 or (
            strategy == "reference" or not kernels_available(x) or not x.shape[0]):
        return _reference(x, params, state, out, state_out)
    M = params.modes
    consts = decode_constants(params)
    text = strategy_string(strategy)
    if state is not None:
        state = tuple(s.to(torch.float32) for s in state)
    if out is None and state_out is None:
        h_r, h_i = state if state is not None else (None, None)
        y, h_r, h_i = torch.ops.samu_tune.decode_step(x.contiguous(), consts, h_r, h_i, M, text)
        return y, (h_r, h_i)
    if out is None:
        out = torch.empty_like(x)
    if state_out is None:
        state_out = (x.new_empty((x.shape[0], M), dtype=torch.float32),
                     x.new_empty((x.shape[0], M), dtype=torch.float32))
    if state is not None:
        for dst, src in zip(state_out, state):
            if dst is not src:
                dst.copy_(src)
    torch.ops.samu_tune.decode_step_(x.contiguous(), consts, state_out[0], state_out[1], out,
                                     state is not None, M, text)
    return out, tuple(state_out)


def _reference(x, params, state, out, state_out) -> tuple[torch.Tensor, State]:
    _check_params(params)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    y, new_state = step_reference(x, params, state, dtype=dtype)
    if out is not None:
        y = out.copy_(y)
    if state_out is not None:
        new_state = tuple(s.copy_(n) for s, n in zip(state_out, new_state))
    return y, new_state


def _launch(plan: _Plan, x: torch.Tensor, consts: torch.Tensor, state: Optional[State],
            out: Optional[torch.Tensor], state_out: Optional[State]) -> tuple[torch.Tensor, State]:
    """Run the ``single`` or ``blocked`` kernel (no autograd)."""
    B, M = x.shape[0], plan.M
    if not x.is_contiguous():
        x = x.contiguous()
    if out is None:
        out = empty(B, 2 * M, dtype=x.dtype, device=x.device)
    if state_out is None:
        state_out = (empty(B, M, dtype=torch.float32, device=x.device),
                     empty(B, M, dtype=torch.float32, device=x.device))
    if state is None:
        state_r = state_i = state_out[0]  # never read (HAS_STATE=False)
    else:
        state_r, state_i = (s if s.dtype == torch.float32 and s.is_contiguous()
                            else s.to(torch.float32).contiguous() for s in state)
    # plan.meta: the memoized plan's keywords, never changed
    _step_kernel.launch(plan.grid, (
        x, consts, state_r, state_i, out, state_out[0], state_out[1], M,
        plan.tiles_per_program), plan.meta)
    return out, tuple(state_out)


def decode_step(x: torch.Tensor, params: SAMUParams, state: Optional[State] = None, *,
                strategy: StrategyArg = "auto", out: Optional[torch.Tensor] = None,
                state_out: Optional[State] = None) -> tuple[torch.Tensor, State]:
    """One step of the SAMU layer: ``x [B, 2M]``, state (h_r, h_i) [B, M] or None (zeros).

    Returns ``(y [B, 2M] in x's dtype, new state fp32 [B, M])`` (float64 for the reference on
    float64 inputs).  ``strategy``: ``"auto"``, ``"single"``, ``"blocked"``, ``"reference"``,
    or ``(name, DecodeConfig | dict)``.  The kernels do not build an autograd graph: asking
    for one of them while gradients are needed raises ``ValueError``.

    ``out`` (contiguous [B, 2M] in x's dtype) and ``state_out`` (a pair of contiguous fp32
    [B, M]) receive y and the new state instead of fresh tensors and are returned;
    ``state_out=state`` updates the state in place (each element is read before it is
    written, by the same thread).  ``out`` must not overlap x or the state.  On the
    reference path they are filled by ``copy_``.

    This free function digests the parameters on every call; :meth:`samu_tune.SAMU.step`
    keeps a :class:`Decoder` that does it once per parameter version.
    """
    return Decoder().step(x, params, state, strategy=strategy, out=out, state_out=state_out)
