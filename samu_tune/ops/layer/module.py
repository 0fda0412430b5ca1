"""``samu_tune.SAMU``: the SAMU layer as a torch module (controller -> scan -> ReLU)."""
from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from torch import nn

from samu_tune.library import is_compiling
from samu_tune.ops.layer.problem import LayerProblem
from samu_tune.ops.layer import fused, unfused
from samu_tune.ops.decode.step import ConstantsCache, Decoder
from samu_tune.ops.layer.reference import SAMUParams, State, layer_reference, needs_grad
from samu_tune.ops.scan.validation import validate

LayerStrategy = Literal["auto", "unfused", "fused"]
_assume_constant = getattr(torch.compiler, "assume_constant_result", lambda f: f)


class SAMU(nn.Module):
    r"""SAMU layer of ``modes`` complex modes: ``x [B, L, 2M] -> (y [B, L, 2M], state)``.

    Per token (see :mod:`samu_tune.ops.layer.reference` for the exact formula)::

        delta = tanh(a_p) tanh(q_p) / sqrt(M),   eta = tanh(a_r) r / (1 + r^2) / sqrt(M),
        q = [x, 1] . d / |d| (phase and radial direction),  r = tanh(q_r)
        h[t] = exp(-nu e^eta) e^{i (theta + delta)} h[t-1] + (x[:M] + i x[M:]) sqrt(1 - e^{-2 nu})
        y = relu(cat(Re h, Im h))

    Parameters and their initialisation (``nu = exp(nu_log)``, ``theta = exp(theta_log)``):

    - ``nu_log`` [M]: ring init of the resting radius ``|A| = exp(-nu)`` (eta = 0): ``|A|^2``
      uniform in ``[r_min^2, r_max^2]``, i.e. ``nu = -log(u (r_max^2 - r_min^2) + r_min^2) / 2``.
    - ``theta_log`` [M]: ``theta`` uniform in ``[min_phase, max_phase]``.
    - ``phase_direction``, ``radial_direction`` [2M+1]: ``N(0, 1/(2M+1))`` (only the direction
      matters: they are normalised in the forward pass; the last entry weighs the bias).
    - ``phase_amplitude``, ``radial_amplitude``: 0-d scalars, ``phase_amplitude_init`` and
      ``radial_amplitude_init`` (through tanh: the largest control is ``1/sqrt(M)``).

    ``scan_strategy`` is passed to :func:`samu_tune.scan` (``"auto"``, a name, or
    ``(name, config)``); ``decode_strategy`` to :func:`samu_tune.ops.decode.step.decode_step`.
    ``strategy`` names the layer path: ``"unfused"`` (controller and write in torch, the scan
    from the registry, ReLU in torch), ``"fused"`` (the controller kernels, then the write,
    the ReLU output and their gradients inside the look-back scan's kernels: x read once by
    each, y written once, no [B, L, M] write or output intermediates; see
    :mod:`samu_tune.ops.layer.fused`; where it cannot run, e.g. with ``cu_seqlens``, the unfused
    path) or ``"auto"`` (the layer op's dispatch, :mod:`samu_tune.ops.layer.spec`: a tuned or
    shipped choice, else the rule: fused where eligible, else unfused).
    """

    def __init__(self, modes: int, *, r_min: float = 0.9, r_max: float = 0.999,
                 min_phase: float = 1e-3, max_phase: float = math.pi,
                 phase_amplitude_init: float = 1.0, radial_amplitude_init: float = 1.0,
                 scan_strategy="auto", decode_strategy: str = "auto",
                 strategy: LayerStrategy = "auto",
                 device: Optional[torch.device | str] = None,
                 dtype: torch.dtype = torch.float32, generator: Optional[torch.Generator] = None):
        super().__init__()
        if modes < 1:
            raise ValueError(f"modes must be >= 1, got {modes}")
        if not 0.0 < r_min <= r_max < 1.0:
            raise ValueError(f"need 0 < r_min <= r_max < 1, got r_min={r_min}, r_max={r_max}")
        if not 0.0 < min_phase <= max_phase:
            raise ValueError(f"need 0 < min_phase <= max_phase, got {min_phase}, {max_phase}")
        if strategy not in ("auto", "unfused", "fused"):
            raise ValueError(f"unknown layer strategy {strategy!r}; available: 'auto', "
                             "'unfused', 'fused'")
        self.modes = modes
        self.scan_strategy = scan_strategy
        self.decode_strategy = decode_strategy
        self.strategy = strategy
        M, width = modes, 2 * modes
        u = torch.rand(M, generator=generator, dtype=torch.float64)
        radius_sq = u * (r_max ** 2 - r_min ** 2) + r_min ** 2
        nu = -0.5 * torch.log(radius_sq)
        theta = torch.rand(M, generator=generator, dtype=torch.float64) \
            * (max_phase - min_phase) + min_phase
        dirs = torch.randn(2, width + 1, generator=generator, dtype=torch.float64) \
            / math.sqrt(width + 1)

        def param(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t.to(device=device, dtype=dtype))

        self.nu_log = param(torch.log(nu))
        self.theta_log = param(torch.log(theta))
        self.phase_direction = param(dirs[0])
        self.radial_direction = param(dirs[1])
        self.phase_amplitude = param(torch.tensor(float(phase_amplitude_init)))
        self.radial_amplitude = param(torch.tensor(float(radial_amplitude_init)))
        self._decoder = Decoder()  # step's digested parameters and launch plans
        # the fused layer's parameter operands between no-grad calls (inference)
        self._fused_operands = ConstantsCache(fused.operands_no_grad)

    def extra_repr(self) -> str:
        return f"modes={self.modes}, strategy={self.strategy!r}"

    def params(self) -> SAMUParams:
        """The parameters as a :class:`SAMUParams` (for the reference and decode functions)."""
        p = self._parameters  # direct: nn.Module.__getattr__ costs per step
        return SAMUParams(p["phase_direction"], p["radial_direction"], p["phase_amplitude"],
                          p["radial_amplitude"], p["nu_log"], p["theta_log"])

    def _check_x(self, x: torch.Tensor, ndim: int, labels: str) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != ndim or x.shape[-1] != 2 * self.modes:
            raise ValueError(f"x must have shape [{labels}] with 2M = {2 * self.modes}, "
                             f"got {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"x must be floating point, got {x.dtype}")

    def forward(self, x: torch.Tensor, state: Optional[State] = None,
                segment_pos: Optional[torch.Tensor] = None, *,
                cu_seqlens: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, State]:
        """``x [B, L, 2M] -> (y [B, L, 2M] in x's dtype, final state (h_r, h_i) fp32 [B, M])``.

        ``state``: initial state (h0_r, h0_i) [B, M] or None (zeros); ``segment_pos`` [B, L]
        integer, 0 starts a packed sequence (the state is reset there).  Or ``cu_seqlens``
        [N+1] for N sequences packed in one row (B = 1): the state then is per sequence,
        [N, M] (see :mod:`samu_tune.ops.layer.varlen`).  B or L may be 0 (empty y; the final
        state is the initial one, or zeros).
        """
        self._check_x(x, 3, "B, L, 2M")
        params = self.params()
        if cu_seqlens is None and not x.numel():        # B or L = 0: no kernel to run
            B, L, _ = x.shape
            # the scan's checks of the state and segment_pos (their errors as a call with
            # tokens raises them)
            validate(x.new_empty(B, L), x.new_empty(B, L), params.nu_log, params.theta_log,
                     x.new_empty(B, L, self.modes), x.new_empty(B, L, self.modes),
                     initial_state=state, segment_pos=segment_pos)
            return layer_reference(x, params, initial_state=state, segment_pos=segment_pos)
        if cu_seqlens is None and self.strategy != "unfused":
            if is_compiling():
                done = _fused_traced(self.strategy, x, params, state, segment_pos,
                                     self.scan_strategy, self.modes)
            else:
                done = _fused_or_none(self.strategy, x, params, state, segment_pos,
                                      self.scan_strategy, self._fused_operands)
            if done is not None:
                return done
        return unfused.forward(x, params, state, segment_pos, cu_seqlens=cu_seqlens,
                               scan_strategy=self.scan_strategy)

    @staticmethod
    def _layer_path(x: torch.Tensor, params: SAMUParams, state: Optional[State],
                    segment_pos: Optional[torch.Tensor]) -> str:
        """The layer op's choice for this call (memoized per call signature)."""
        return _layer_path_of(x.shape, x.dtype, x.device, segment_pos is not None,
                              state is not None, needs_grad(x, params, state))

    def step(self, x: torch.Tensor, state: Optional[State] = None, *,
             out: Optional[torch.Tensor] = None,
             state_out: Optional[State] = None) -> tuple[torch.Tensor, State]:
        """One generation step: ``x [B, 2M] -> (y [B, 2M] in x's dtype, state fp32 [B, M])``.

        Equal to :meth:`forward` on a length-1 sequence; L steps equal forward on L tokens.
        Runs the decode kernel (:func:`samu_tune.ops.decode.step.decode_step`) on CUDA or under
        the Triton interpreter when no gradient is needed (``torch.no_grad()``), else the
        differentiable torch reference.

        ``out`` ([B, 2M], x's dtype) and ``state_out`` (pair of fp32 [B, M]) take y and the new
        state instead of fresh tensors; ``state_out=state`` updates the state in place, so a
        generation loop allocates nothing per step (and can be captured in a CUDA graph).
        The old state's values are then gone: keep a copy if it is needed later.

        The parameters are digested (nu, cos/sin theta, gamma, unit directions) once per
        parameter version: in-place updates through torch, ``load_state_dict``, ``.to()`` and
        assigning ``p.data`` are seen; after writing a parameter in a way its version counter
        does not see (``p.data.add_``, numpy), call :meth:`invalidate_decode_cache`.
        """
        return self._decoder.step(x, self.params(), state, strategy=self.decode_strategy,
                                  out=out, state_out=state_out)

    def invalidate_decode_cache(self) -> None:
        """Make the next :meth:`step` re-digest the parameters and re-resolve its launch (and
        the next no-grad fused forward recompute its parameter operands)."""
        self._decoder.clear()
        self._fused_operands.clear()


def _fused_or_none(strategy: str, x: torch.Tensor, params: SAMUParams, state: Optional[State],
                   segment_pos: Optional[torch.Tensor], scan_strategy, operands_cache=None
                   ) -> Optional[tuple[torch.Tensor, State]]:
    """The fused layer's result when ``strategy`` ("fused", or "auto" choosing it) runs it,
    else None (the caller takes the unfused path)."""
    if strategy == "auto":
        strategy = SAMU._layer_path(x, params, state, segment_pos)
    if strategy != "fused":
        return None
    return fused.forward(x, params, state, segment_pos, scan_strategy, operands_cache)


def _layer_path_of(shape, dtype: torch.dtype, device: torch.device, resets: bool,
                   has_state: bool, backward: bool) -> str:
    """The layer op's choice ("fused" / "unfused") for a call on x of ``shape`` [B, L, 2M]
    (memoized per call signature)."""
    decide, _ = fused.call_decision("layer", LayerProblem, shape, dtype, device, resets,
                                    has_state, backward)
    try:
        return decide().strategy.name
    except (ValueError, TypeError):   # e.g. float64 x: no layer strategy but the reference
        return "unfused"


@_assume_constant
def _runs_fused(strategy: str, B: int, L: int, M: int, dtype: str, device: str, resets: bool,
                has_state: bool, backward: bool, scan_strategy: str) -> bool:
    """Whether a traced layer call runs the fused operators: decided while torch.compile
    traces (the graph's structure depends on it; the arguments are the call's constants)."""
    from samu_tune.library import strategy_arg
    dt, dev = getattr(torch, dtype.removeprefix("torch.")), torch.device(device)
    if strategy == "auto" and _layer_path_of((B, L, 2 * M), dt, dev, resets, has_state,
                                             backward) != "fused":
        return False
    return fused.config_for_call((B, L, 2 * M), dt, dev, resets, has_state,
                                 strategy_arg(scan_strategy), backward) is not None


def _fused_traced(strategy: str, x: torch.Tensor, params: SAMUParams, state: Optional[State],
                  segment_pos: Optional[torch.Tensor], scan_strategy, modes: int
                  ) -> Optional[tuple[torch.Tensor, State]]:
    """:func:`_fused_or_none` under torch.compile: the fused kernels as the operators of
    :mod:`samu_tune.ops.layer.library` (no graph break), the parameter operands traced.  ``modes``:
    the layer's M as a Python int (x's sizes may be symbolic)."""
    from samu_tune.library import strategy_string
    from samu_tune.ops.layer import library
    if not fused.fits(x, params, state, segment_pos):
        return None
    text = strategy_string(scan_strategy)
    # decided for M, dtypes and features (the graph's structure may not depend on sizes that
    # can be symbolic): the choice for a long sequence; the operators choose the loop config
    # for the real B and L inside, and run every B and L (library._layer_config)
    if not _runs_fused(strategy, 1, 1024, modes, str(x.dtype), str(x.device),
                       segment_pos is not None, state is not None,
                       needs_grad(x, params, state), text):
        return None
    dirs, scales, gamma = fused.operands(params)
    h0, seg = fused.kernel_state(state, segment_pos)
    return library.fused_layer(x.contiguous(), dirs, scales, gamma,
                                 params.nu_log.contiguous(), params.theta_log.contiguous(),
                                 seg, h0, text)
