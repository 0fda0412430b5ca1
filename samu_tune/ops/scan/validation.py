"""Input checks of :func:`samu_tune.scan`: every error names the argument, expected and actual."""
from __future__ import annotations

from typing import Optional

import torch

from samu_tune.settings import settings
from samu_tune.ops.scan.tensors import ScanInputs

WRITE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
CONTROL_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
SPECTRUM_DTYPES = (torch.float32, torch.float64)


def _names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def _tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _shape(name: str, t: torch.Tensor, expected: tuple[int, ...], labels: str) -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"{name} must have shape [{labels}] = {list(expected)}, "
                         f"got {list(t.shape)}")


def _dtype(name: str, t: torch.Tensor, allowed) -> None:
    if t.dtype not in allowed:
        raise TypeError(f"{name} must have dtype in ({_names(allowed)}), got "
                        f"{str(t.dtype).removeprefix('torch.')}")


def validate(eta, delta, nu_log, theta_log, br, bi, *,
             initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
             segment_pos: Optional[torch.Tensor] = None,
             output_final_state: bool = False) -> ScanInputs:
    """Check every argument and return contiguous :class:`ScanInputs`.

    Raises ``TypeError`` for a wrong type or dtype and ``ValueError`` for a wrong shape or
    device; with ``SAMU_TUNE_CHECK_FINITE=1`` also for a non-finite spectrum.  A size of 0 is
    valid (the scan then runs the reference: see :func:`samu_tune.ops.scan.api.scan`).
    A call that passes every check in one expression returns at once (about a fifth of the
    host time of the checks one by one); any other goes through them in order, which names
    the first failure.
    """
    if (initial_state is None and segment_pos is None and type(br) is torch.Tensor
            and type(bi) is torch.Tensor and type(eta) is torch.Tensor
            and type(delta) is torch.Tensor and type(nu_log) is torch.Tensor
            and type(theta_log) is torch.Tensor and br.dim() == 3
            and type(output_final_state) is bool):
        shape = br.shape
        B, L, M = shape
        device = br.device
        if (B and L and M and bi.shape == shape and eta.shape == (B, L)
                and delta.shape == (B, L) and nu_log.shape == (M,) and theta_log.shape == (M,)
                and br.dtype in WRITE_DTYPES and bi.dtype == br.dtype
                and eta.dtype in CONTROL_DTYPES and delta.dtype == eta.dtype
                and nu_log.dtype in SPECTRUM_DTYPES and theta_log.dtype in SPECTRUM_DTYPES
                and bi.device == device and eta.device == device and delta.device == device
                and nu_log.device == device and theta_log.device == device
                and device.type != "meta" and not settings().check_finite):
            return ScanInputs(eta.contiguous(), delta.contiguous(), nu_log.contiguous(),
                              theta_log.contiguous(), br.contiguous(), bi.contiguous(),
                              None, None, output_final_state)
    return _validate(eta, delta, nu_log, theta_log, br, bi, initial_state=initial_state,
                     segment_pos=segment_pos, output_final_state=output_final_state)


def _validate(eta, delta, nu_log, theta_log, br, bi, *,
              initial_state: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
              segment_pos: Optional[torch.Tensor] = None,
              output_final_state: bool = False) -> ScanInputs:
    if not isinstance(output_final_state, bool):
        raise TypeError(f"output_final_state must be a bool, got "
                        f"{type(output_final_state).__name__} {output_final_state!r}")
    br = _tensor("br", br)
    if br.ndim != 3:
        raise ValueError(f"br must have shape [B, L, M], got {list(br.shape)} ({br.ndim} dims)")
    B, L, M = br.shape
    bi = _tensor("bi", bi)
    eta, delta = _tensor("eta", eta), _tensor("delta", delta)
    nu_log, theta_log = _tensor("nu_log", nu_log), _tensor("theta_log", theta_log)
    _shape("bi", bi, (B, L, M), "B, L, M")
    _shape("eta", eta, (B, L), "B, L")
    _shape("delta", delta, (B, L), "B, L")
    _shape("nu_log", nu_log, (M,), "M")
    _shape("theta_log", theta_log, (M,), "M")
    _dtype("br", br, WRITE_DTYPES)
    if bi.dtype != br.dtype:
        raise TypeError(f"bi must have br's dtype {br.dtype}, got {bi.dtype}")
    _dtype("eta", eta, CONTROL_DTYPES)
    if delta.dtype != eta.dtype:
        raise TypeError(f"delta must have eta's dtype {eta.dtype}, got {delta.dtype}")
    _dtype("nu_log", nu_log, SPECTRUM_DTYPES)
    _dtype("theta_log", theta_log, SPECTRUM_DTYPES)
    named = {"br": br, "bi": bi, "eta": eta, "delta": delta, "nu_log": nu_log,
             "theta_log": theta_log}
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise TypeError("initial_state must be a pair (h0_r, h0_i) of [B, M] tensors")
        h0_r, h0_i = (_tensor(f"initial_state[{i}]", t) for i, t in enumerate(initial_state))
        for i, h in enumerate((h0_r, h0_i)):
            _shape(f"initial_state[{i}]", h, (B, M), "B, M")
            if not h.is_floating_point():
                raise TypeError(f"initial_state[{i}] must be floating point, got {h.dtype}")
            named[f"initial_state[{i}]"] = h
        initial_state = (h0_r.contiguous(), h0_i.contiguous())
    if segment_pos is not None:
        segment_pos = _tensor("segment_pos", segment_pos)
        _shape("segment_pos", segment_pos, (B, L), "B, L")
        if segment_pos.is_floating_point() or segment_pos.is_complex() or segment_pos.dtype == torch.bool:
            raise TypeError(f"segment_pos must have an integer dtype, got {segment_pos.dtype}")
        named["segment_pos"] = segment_pos
        segment_pos = segment_pos.contiguous()
    devices = {name: t.device for name, t in named.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    if br.device.type == "meta":
        raise ValueError("the scan needs tensors with data (cuda or cpu), got meta tensors")
    if settings().check_finite and not _capturing(br):
        for name, t in (("nu_log", nu_log), ("theta_log", theta_log)):
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} has non-finite values")
    return ScanInputs(eta.contiguous(), delta.contiguous(), nu_log.contiguous(),
                      theta_log.contiguous(), br.contiguous(), bi.contiguous(),
                      initial_state, segment_pos, output_final_state)


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()
