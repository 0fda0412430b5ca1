"""The SAMU layer's parameter operands, forward and backward, in one launch each.

From the raw parameters (phase and radial directions p_c [K1], K1 = 2M + 1; amplitudes a_c,
0-d; nu_log [M]), all fp32::

    dirs[c] = p_c / n_c,   n_c = max(|p_c|, 1e-12)          scales[c] = tanh(a_c) / sqrt(M)
    gamma = sqrt(1 - exp(-2 nu)) + 1e-8,   nu = exp(nu_log)

Backward, from g_dirs [2, K1], g_scales [2], g_gamma [M]::

    grad p_c = (g_c - dirs[c] (g_c . dirs[c])) / n_c   (g_c / n_c where |p_c| < 1e-12)
    grad a_c = g_scales[c] (1 - tanh(a_c)^2) / sqrt(M)
    grad nu_log = g_gamma nu exp(-2 nu) / sqrt(1 - exp(-2 nu))

Grid (2 + cdiv(M, BLOCK),): programs 0 and 1 normalise one direction each (two passes over
K1), the others compute BLOCK entries of gamma.  These are what the controller kernels and the
fused scan read (:mod:`samu_tune.kernels.controller`); one launch replaces about a dozen tiny
torch kernels per forward (and twenty in backward).
"""
import triton
import triton.language as tl

from samu_tune.kernels.complex_math import tanh


@triton.jit
def norm(src, K1, BLOCK: tl.constexpr):
    """max(|src[:K1]|, 1e-12): the norm a direction is divided by (the same reduction in
    every kernel that normalises, so that their unit directions agree bitwise)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for k in range(0, K1, BLOCK):
        v = tl.load(src + k + offs, mask=k + offs < K1, other=0.0)
        acc += v * v
    return tl.maximum(tl.sqrt(tl.sum(acc, axis=0)), 1e-12)


@triton.jit
def _unit(src, dst, amp, scale_out, K1, inv_sqrt_m, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    n = norm(src, K1, BLOCK)
    for k in range(0, K1, BLOCK):
        mask = k + offs < K1
        v = tl.load(src + k + offs, mask=mask, other=0.0)
        tl.store(dst + k + offs, v / n, mask=mask)
    tl.store(scale_out, tanh(tl.load(amp)) * inv_sqrt_m)


@triton.jit
def _unit_backward(src, g_dirs, g_src, amp, g_scale, g_amp, K1, inv_sqrt_m,
                   BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    dot = tl.zeros([BLOCK], tl.float32)
    for k in range(0, K1, BLOCK):
        mask = k + offs < K1
        v = tl.load(src + k + offs, mask=mask, other=0.0)
        g = tl.load(g_dirs + k + offs, mask=mask, other=0.0)
        acc += v * v
        dot += g * v
    norm = tl.sqrt(tl.sum(acc, axis=0))
    n = tl.maximum(norm, 1e-12)
    along = tl.where(norm > 1e-12, tl.sum(dot, axis=0) / (n * n), 0.0)   # (g . d) / n
    for k in range(0, K1, BLOCK):
        mask = k + offs < K1
        v = tl.load(src + k + offs, mask=mask, other=0.0)
        g = tl.load(g_dirs + k + offs, mask=mask, other=0.0)
        tl.store(g_src + k + offs, (g - v * along) / n, mask=mask)
    t = tanh(tl.load(amp))
    tl.store(g_amp, tl.load(g_scale) * (1.0 - t * t) * inv_sqrt_m)


@triton.jit
def layer_operands(pd, rd, pa, ra, nu_log, dirs, scales, gamma, K1, M, inv_sqrt_m,
                   BLOCK: tl.constexpr):
    """dirs [2, K1], scales [2], gamma [M] (fp32, contiguous) from the raw parameters."""
    operands_job(tl.program_id(0), pd, rd, pa, ra, nu_log, dirs, scales, gamma, K1, M,
                 inv_sqrt_m, BLOCK)


@triton.jit
def operands_job(job, pd, rd, pa, ra, nu_log, dirs, scales, gamma, K1, M, inv_sqrt_m,
                 BLOCK: tl.constexpr):
    """Job ``job`` of the 2 + cdiv(M, BLOCK) that write the operands: 0 and 1 one direction
    and its scale each, the others BLOCK entries of gamma."""
    if job == 0:
        _unit(pd, dirs, pa, scales, K1, inv_sqrt_m, BLOCK)
    elif job == 1:
        _unit(rd, dirs + K1, ra, scales + 1, K1, inv_sqrt_m, BLOCK)
    else:
        offs = (job - 2) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < M
        nu = tl.exp(tl.load(nu_log + offs, mask=mask, other=0.0))
        tl.store(gamma + offs, tl.sqrt(1.0 - tl.exp(-2.0 * nu)) + 1e-8, mask=mask)


@triton.jit
def layer_operands_backward(pd, rd, pa, ra, nu_log, g_dirs, dirs_stride, g_scales,
                            scales_stride, g_gamma, g_nu_in, g_pd, g_rd, g_pa, g_ra, g_nu, K1, M,
                            inv_sqrt_m, BLOCK: tl.constexpr, HAS_NU_IN: tl.constexpr):
    """The parameters' gradients from those of dirs ([2, K1], rows ``dirs_stride`` apart),
    scales ([2], ``scales_stride`` apart) and gamma (module docstring); ``HAS_NU_IN``: plus
    ``g_nu_in`` [M], nu_log's gradient through the scan (one sum, no add kernel after)."""
    pid = tl.program_id(0)
    if pid == 0:
        _unit_backward(pd, g_dirs, g_pd, pa, g_scales, g_pa, K1, inv_sqrt_m, BLOCK)
    elif pid == 1:
        _unit_backward(rd, g_dirs + dirs_stride, g_rd, ra, g_scales + scales_stride, g_ra, K1,
                       inv_sqrt_m, BLOCK)
    else:
        offs = (pid - 2) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < M
        nu = tl.exp(tl.load(nu_log + offs, mask=mask, other=0.0))
        e = tl.exp(-2.0 * nu)
        g = tl.load(g_gamma + offs, mask=mask, other=0.0)
        out = g * nu * e / tl.sqrt(1.0 - e)
        if HAS_NU_IN:
            out += tl.load(g_nu_in + offs, mask=mask, other=0.0)
        tl.store(g_nu + offs, out, mask=mask)
