"""``samu_tune.launcher``: direct launches of compiled Triton kernels.

A fake ``JITFunction`` (its launches recorded, each normal launch returning a fresh fake
compiled kernel whose launcher records its calls) checks the key and the direct call: the
first call of a specialisation goes through the kernel, the next ones to the launcher with
the padded grid, the stream, the kernel's function and metadata, no hooks and every
parameter in signature order; a change Triton specialises on goes through the kernel again;
a failing direct launch is redone through the kernel and turns the direct path off; the
interpreter, ``SAMU_TUNE_FAST_LAUNCH=0``, launch hooks and a swapped kernel never go direct.
A real ``JITFunction`` run by Triton's own ``JITFunction.run`` (a fake driver; its compile
returns a fake compiled kernel) checks the direct call against Triton's launcher call and
each direct launch against the binary Triton's cache gives the same arguments.  Under the
interpreter a real kernel through the wrapper gives the plain launch's result.
GPU-marked: the look-back scan with the direct path on and off, bitwise equal.
"""
from __future__ import annotations

import inspect
import sys
import types
import warnings

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction, KernelParam

from samu_tune.launch_options import LAUNCH_OPTIONS
from samu_tune.launcher import FastKernel, fast
from samu_tune.settings import reload_settings, settings

STREAM = 0x5EED


class FakeCompiled:
    """A compiled kernel: ``run`` is its launcher, which records its calls."""

    def __init__(self, fail: bool = False):
        self.calls = []
        self.function = 0xF00D
        self.packed_metadata = (4, 1, 0)
        self.fail = fail

    @property
    def run(self):
        return self._launch

    def launch_metadata(self, grid, stream, *args):
        return "launch metadata"

    def _launch(self, *args):
        if self.fail:
            raise RuntimeError("launcher refused the arguments")
        self.calls.append(args)


class FakeJIT(JITFunction):
    """A ``JITFunction`` of ``pyfn``'s signature without Triton's compile machinery: a launch
    ``kernel[grid](*args, **kwargs)`` is recorded and returns a fresh :class:`FakeCompiled`."""

    def __init__(self, pyfn, fail: bool = False):   # JITFunction.__init__ deliberately skipped
        self.fn = pyfn
        self.module = pyfn.__module__
        self.signature = inspect.signature(pyfn)
        self.params = [KernelParam(i, p, False, False)
                       for i, p in enumerate(self.signature.parameters.values())]
        self.pre_run_hooks = []
        self.launches = []
        self.compiled = []
        self.fail = fail
        self.refuse = False

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if self.refuse:
                raise ValueError("pointer argument cannot be accessed from Triton")
            self.launches.append((grid, args, kwargs))
            self.compiled.append(FakeCompiled(self.fail))
            return self.compiled[-1]
        return launch


def _kernel(x_ptr, y_ptr, g_ptr, n, scale, flag, A: tl.constexpr, B: tl.constexpr = 7,
            C: tl.constexpr = None):
    pass


def _wrapped(fail: bool = False) -> tuple[FakeJIT, FastKernel]:
    k = FakeJIT(_kernel, fail)
    return k, FastKernel(k, device=lambda: 0, stream=lambda device: STREAM)


@pytest.fixture
def direct(monkeypatch):
    """The direct path allowed (no interpreter, switch on) for the test's duration."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("SAMU_TUNE_FAST_LAUNCH", raising=False)
    reload_settings()
    yield
    monkeypatch.undo()
    reload_settings()


def _addresses(args):
    """``args`` as the direct launch passes them to the launcher: each tensor by its address."""
    return tuple(a.data_ptr() if type(a) is torch.Tensor else a for a in args)


def _args(x=None, y=None, g=None, n=40, scale=0.5, flag=True):
    x = torch.zeros(64, dtype=torch.bfloat16) if x is None else x
    y = torch.zeros(64, dtype=torch.float32) if y is None else y
    return (x, y, g, n, scale, flag)


def test_second_launch_goes_direct_with_every_parameter_in_order(direct):
    k, w = _wrapped()
    args = _args()
    assert w[(3,)](*args, A=2, num_warps=4) is k.compiled[0]
    assert len(k.launches) == 1 and not k.compiled[0].calls and w.reason is None
    assert k.launches[0] == ((3,), args, {"A": 2, "num_warps": 4})
    got = w[(3,)](*args, A=2, num_warps=4)
    assert got is k.compiled[0] and len(k.launches) == 1
    assert k.compiled[0].calls == [(3, 1, 1, STREAM, 0xF00D, (4, 1, 0), None, None, None,
                                    *_addresses(args), 2, 7, None)]
    assert type(k.compiled[0].calls[0][9]) is int     # a tensor goes as its address
    # other tensors and ints of the same specialisation, a 2-D and a 3-D grid
    args2 = _args(n=8, scale=2.0, flag=False)
    w[(5, 2)](*args2, A=2, num_warps=4)
    w[(5, 2, 6)](*args2, A=2, num_warps=4)
    assert len(k.launches) == 1 and (w.direct, w.normal) == (3, 1)
    assert [c[:3] for c in k.compiled[0].calls[1:]] == [(5, 2, 1), (5, 2, 6)]
    assert k.compiled[0].calls[-1][9:] == (*_addresses(args2), 2, 7, None)


@pytest.mark.parametrize("change", ["misaligned", "int_one", "int64", "int_mod16", "dtype",
                                    "constexpr", "constexpr_type", "none", "option", "device",
                                    "float_for_int", "bool_for_int"])
def test_a_new_specialisation_goes_through_the_kernel(direct, change):
    """Each change is one Triton compiles for (or may): a new launch through the kernel, then
    direct for the new key while the first key stays direct."""
    k, w = _wrapped()
    devices = iter([0, 0, 1, 1, 0])
    if change == "device":
        w._device = lambda: next(devices)
    base, kw = _args(), {"A": 2, "num_warps": 4}
    x = torch.zeros(64, dtype=torch.bfloat16)
    variant, kw2 = {
        "misaligned": (_args(x=x[1:]), kw),           # data_ptr + 2 bytes: not 16-aligned
        "int_one": (_args(n=1), kw),
        "int64": (_args(n=1 << 40), kw),
        "int_mod16": (_args(n=32), kw),
        "dtype": (_args(x=torch.zeros(64, dtype=torch.float16)), kw),
        "constexpr": (base, {"A": 3, "num_warps": 4}),
        "constexpr_type": (base, {"A": 2.0, "num_warps": 4}),
        "none": (_args(g=torch.zeros(4)), kw),
        "option": (base, {"A": 2, "num_warps": 8}),
        "device": (base, kw),
        "float_for_int": (_args(n=40.0), kw),
        "bool_for_int": (_args(n=True), kw),
    }[change]
    assert x[1:].data_ptr() % 16 != 0
    w[(1,)](*base, **kw)
    w[(1,)](*base, **kw)
    assert len(k.launches) == 1 and len(k.compiled[0].calls) == 1
    w[(1,)](*variant, **kw2)
    assert len(k.launches) == 2, change
    w[(1,)](*variant, **kw2)
    assert len(k.launches) == 2 and len(k.compiled[1].calls) == 1, change
    w[(1,)](*base, **kw)
    assert len(k.launches) == 2 and len(k.compiled[0].calls) == 2, change


def test_a_kept_keyword_dict_is_keyed_by_identity(direct):
    """``launch(grid, args, kwargs)``: the same dict object goes direct after its first
    launch; an equal but different dict is another key (one more launch through the kernel);
    the argument specialisations still count; the dict is kept while its record lives."""
    k, w = _wrapped()
    kw = {"A": 2, "num_warps": 4}
    args = _args()
    assert w.launch((3,), args, kw) is k.compiled[0]
    w.launch((3,), args, kw)
    assert len(k.launches) == 1 and k.compiled[0].calls == [
        (3, 1, 1, STREAM, 0xF00D, (4, 1, 0), None, None, None, *_addresses(args), 2, 7, None)]
    w.launch((3,), _args(n=1), kw)                   # an int 1: a new specialisation
    assert len(k.launches) == 2
    w.launch((3,), args, dict(kw))                   # another dict: another key
    assert len(k.launches) == 3
    w.launch((3,), args, {"A": 5, "num_warps": 4})
    assert len(k.launches) == 4 and k.launches[-1][2] == {"A": 5, "num_warps": 4}
    assert id(kw) in w._kept and w._kept[id(kw)] is kw
    w.reset()
    assert not w._kept and not w._records


def test_records_are_bounded(direct, monkeypatch):
    import samu_tune.launcher as launcher
    monkeypatch.setattr(launcher, "_MAX_RECORDS", 3)
    k, w = _wrapped()
    for i in range(5):
        w.launch((1,), _args(), {"A": i})
    assert len(w._records) <= 3 and len(w._kept) <= 3 and len(k.launches) == 5


def test_not_specialised_on_values_triton_ignores(direct):
    """Other ints of the same class, other floats and bools, other aligned tensors: direct."""
    k, w = _wrapped()
    w[(1,)](*_args(n=40, scale=0.5, flag=True), A=2)
    for n, scale, flag in ((41, 3.0, False), (-7, -1.0, True), (2 ** 31 - 1, 1e30, False)):
        w[(1,)](*_args(x=torch.ones(128, dtype=torch.bfloat16), n=n, scale=scale, flag=flag),
                A=2)
    assert len(k.launches) == 1 and w.direct == 3


def test_a_failing_direct_launch_is_redone_through_the_kernel_and_turns_direct_off(direct):
    k, w = _wrapped(fail=True)
    args = _args()
    w[(2,)](*args, A=2)
    with pytest.warns(RuntimeWarning, match="direct launch failed: RuntimeError.* for Triton "
                                            "kernel _kernel"):
        got = w[(2,)](*args, A=2)
    assert got is k.compiled[1] and len(k.launches) == 2
    assert w.reason.startswith("direct launch failed") and w.direct == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # warned once
        w[(2,)](*args, A=2)
    assert len(k.launches) == 3 and w.normal == 3


def test_a_call_failing_both_ways_raises_and_keeps_the_direct_path(direct):
    """An error of the call itself (the kernel refuses it too) is the caller's: raised, and
    the direct path stays open."""
    k, w = _wrapped(fail=True)
    args = _args()
    w[(2,)](*args, A=2)
    k.refuse = True
    with pytest.raises(ValueError, match="cannot be accessed"):
        w[(2,)](*args, A=2)
    assert w.reason is None and w.direct == 0


def test_switch_off_never_goes_direct(direct, monkeypatch):
    monkeypatch.setenv("SAMU_TUNE_FAST_LAUNCH", "0")
    assert reload_settings().fast_launch is False
    k, w = _wrapped()
    for _ in range(3):
        w[(2,)](*_args(), A=2)
    assert len(k.launches) == 3 and w.direct == 0 and w.reason == "SAMU_TUNE_FAST_LAUNCH=0"
    monkeypatch.delenv("SAMU_TUNE_FAST_LAUNCH")
    reload_settings()                              # read again: direct from the next call
    w[(2,)](*_args(), A=2)
    w[(2,)](*_args(), A=2)
    assert w.reason is None and w.direct == 1


def test_interpreter_never_goes_direct(direct, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reload_settings()
    k, w = _wrapped()
    for _ in range(3):
        w[(2,)](*_args(), A=2)
    assert len(k.launches) == 3 and w.direct == 0 and w.reason == "TRITON_INTERPRET=1"


def test_not_a_jit_function_never_goes_direct(direct):
    calls = []

    class Plain:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append(grid)

    w = fast(Plain())
    w[(1,)](1, 2)
    w[(1,)](1, 2)
    assert calls == [(1,), (1,)] and w.reason.startswith("not a JITFunction")


def test_launch_hooks_pre_run_hooks_and_unusual_calls_go_through_the_kernel(direct):
    from triton import knobs
    k, w = _wrapped()
    args = _args()
    w[(1,)](*args, A=2)
    chain = knobs.runtime.launch_enter_hook
    knobs.runtime.launch_enter_hook = lambda metadata: None
    try:
        w[(1,)](*args, A=2)
    finally:
        knobs.runtime.launch_enter_hook = chain
    if hasattr(knobs.runtime.launch_exit_hook, "add"):    # a hook chain (Triton 3.6+)
        hook = lambda metadata: None  # noqa: E731
        knobs.runtime.launch_exit_hook.add(hook)
        try:
            w[(1,)](*args, A=2)
        finally:
            knobs.runtime.launch_exit_hook.remove(hook)
    k.pre_run_hooks.append(lambda *a, **kw: None)
    w[(1,)](*args, A=2)
    k.pre_run_hooks.clear()
    w[[1]](*args, A=2)                                  # a list grid
    w[(1,)](*args, 2)                                   # a constexpr passed positionally
    w[(1,)](*args[:5], object(), A=2)                   # an argument of an unknown type
    assert w.direct == 0
    w[(1,)](*args, A=2)
    assert w.direct == 1 and len(k.compiled[0].calls) == 1


def test_a_kernel_swapped_on_its_module_is_called(direct, monkeypatch):
    """Tests and profiling scripts replace a kernel on its module by a counting stub."""
    module = types.ModuleType("samu_test_fake_kernels")
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def kern(x_ptr, n, A: tl.constexpr):
        pass

    kern.__module__ = module.__name__
    module.kern = k = FakeJIT(kern)
    w = FastKernel(k, device=lambda: 0, stream=lambda device: STREAM)
    calls = []

    class Stub:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((grid, a, kw))

    w[(1,)](torch.zeros(4), 3, A=1)
    monkeypatch.setattr(module, "kern", Stub())
    w[(1,)](torch.zeros(4), 3, A=1)
    assert len(calls) == 1 and len(k.launches) == 1 and not k.compiled[0].calls
    monkeypatch.setattr(module, "kern", k)
    w[(1,)](torch.zeros(4), 3, A=1)
    assert len(k.compiled[0].calls) == 1


def test_fast_of_a_wrapper_is_the_wrapper():
    k, w = _wrapped()
    assert fast(w) is w


def test_settings_switch_parses():
    from samu_tune.settings import _from_env
    assert _from_env({}).fast_launch is True
    assert _from_env({"SAMU_TUNE_FAST_LAUNCH": "0"}).fast_launch is False
    assert _from_env({"SAMU_TUNE_FAST_LAUNCH": "1"}).fast_launch is True


# ---- Triton's own JITFunction.run, compiling nothing ----------------------------------------

class _FakeDriver:
    """Triton's active driver for a JITFunction on the CPU: device 0, a stream, sm_90."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return STREAM

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)


def _real_kernel(x_ptr, y_ptr, g_ptr, n, scale, flag, A: tl.constexpr, B: tl.constexpr = 7,
                 C: tl.constexpr = None):
    pass


@pytest.fixture
def real_jit(monkeypatch):
    """A real ``JITFunction`` run by Triton's ``JITFunction.run`` with a fake driver; its
    compile returns a :class:`FakeCompiled` (kept in Triton's kernel cache), listed in
    ``compiled``.  The modules Triton's argument specialisation imports on first use are
    imported first, while the interpreter setting they were made under holds."""
    from triton.runtime import driver
    from triton.runtime.jit import mangle_type
    mangle_type(torch.zeros(1))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("SAMU_TUNE_FAST_LAUNCH", raising=False)
    reload_settings()
    monkeypatch.setattr(driver, "_active", _FakeDriver())
    fn = JITFunction(_real_kernel)
    compiled = []

    def do_compile(key, signature, device, constexprs, options, attrs, warmup):
        kernel = FakeCompiled()
        fn.device_caches[device][0][key] = kernel
        compiled.append(kernel)
        return kernel

    fn._do_compile = do_compile
    yield fn, compiled
    monkeypatch.undo()
    reload_settings()


def test_the_direct_launch_passes_what_triton_passes(real_jit):
    """The launcher gets the grid, stream, function, metadata and every parameter (constexprs
    and defaults included) exactly as from ``JITFunction.run``; None for metadata and hooks."""
    fn, compiled = real_jit
    w = FastKernel(fn)
    args = _args()
    assert w[(3, 2)](*args, A=2, num_warps=4, **LAUNCH_OPTIONS) is compiled[0]
    assert w[(3, 2)](*args, A=2, num_warps=4, **LAUNCH_OPTIONS) is compiled[0]
    assert w.reason is None and (w.direct, w.normal) == (1, 1) and len(compiled) == 1
    through_triton, direct_call = compiled[0].calls
    assert len(through_triton) == len(direct_call) == 9 + 9
    assert through_triton[:6] == direct_call[:6] == (3, 2, 1, STREAM, 0xF00D, (4, 1, 0))
    assert direct_call[6:9] == (None, None, None)
    # the same values, each tensor by its address (the launcher takes an int pointer as is)
    assert direct_call[9:] == _addresses(through_triton[9:])
    assert all(a is b for a, b in zip(through_triton[9:], direct_call[9:])
               if type(a) is not torch.Tensor)


def test_a_direct_launch_uses_the_binary_triton_would(real_jit):
    """Calls differing in what Triton specialises on: each wrapper call returns the compiled
    kernel a plain launch returns (Triton's cache), so no record serves a call Triton would
    compile or look up differently."""
    fn, compiled = real_jit
    w = FastKernel(fn)
    x = torch.zeros(64, dtype=torch.bfloat16)
    kw = {"A": 2, "num_warps": 4, **LAUNCH_OPTIONS}
    calls = [(_args(), kw), (_args(x=x[1:]), kw), (_args(n=1), kw), (_args(n=32), kw),
             (_args(n=1 << 40), kw), (_args(n=-(1 << 40) + 1), kw), (_args(n=1 << 63), kw),
             (_args(n=40.0), kw), (_args(n=True), kw), (_args(n=None), kw),
             (_args(x=torch.zeros(64, dtype=torch.float16)), kw),
             (_args(g=torch.zeros(4, dtype=torch.int32)), kw), (_args(scale=3), kw),
             (_args(flag=2), kw), (_args(), {**kw, "A": 3}),
             (_args(), {**kw, "A": 2.0}), (_args(), {**kw, "A": True}),
             (_args(), {**kw, "num_warps": 8}), (_args(), {**kw, "B": 8}),
             (_args(), {**kw, "C": 1}), (_args(), {**kw, "num_stages": 2}),
             (_args(), {**kw, "enable_fp_fusion": False})]
    for rounds in range(2):
        for args, kwargs in calls:
            got = w[(1,)](*args, **kwargs)
            assert got is fn[(1,)](*args, **kwargs), (args[3:], kwargs)
    assert w.direct == len(calls) and len(compiled) <= w.normal == len(calls)


# ---- a real kernel under the interpreter ---------------------------------------------------

@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, NEG: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = alpha * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)
    if NEG:
        v = -v
    tl.store(out_ptr + offs, v, mask=mask)


_fast_axpy = fast(_axpy)


@pytest.mark.skipif(not settings().interpret, reason="interpreter test (TRITON_INTERPRET=1)")
def test_a_real_kernel_under_the_interpreter_matches_the_plain_launch():
    x, y = torch.randn(37), torch.randn(37)
    for neg in (False, True):
        want, got = torch.empty(37), torch.empty(37)
        _axpy[(3,)](x, y, want, 37, 0.5, BLOCK=16, NEG=neg)
        for _ in range(2):
            got.fill_(float("nan"))
            _fast_axpy[(3,)](x, y, got, 37, 0.5, BLOCK=16, NEG=neg)
            assert torch.equal(got, want)
    assert _fast_axpy.direct == 0 and _fast_axpy.reason == "TRITON_INTERPRET=1"


# ---- GPU ---------------------------------------------------------------------------------

def _lookback_on_and_off(device: str, B: int, L: int, M: int, inner: str, monkeypatch):
    """The look-back scan (chained: a fixed combination order, bitwise reproducible; loop
    walks need the deterministic mode for it) forward and backward through
    ``samu_tune.scan``, twice with the direct path on, then once with it off: the outputs and
    gradients of the three runs, the scan kernel's wrapper and its direct launches after each
    run."""
    import samu_tune
    from samu_tune.ops.scan.strategies import lookback as lb
    from samu_tune.ops.scan.strategies.lookback import LookbackConfig
    cfg = LookbackConfig(chunk=32, block_m=64 if inner == "tile" else 128, num_warps=2,
                         inner=inner, lookback="chained")
    gen = torch.Generator(device=device).manual_seed(3)

    def rnd(*shape, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen, device=device) * 0.5).to(dtype)

    base = [rnd(B, L), rnd(B, L), rnd(M), rnd(M), rnd(B, L, M, dtype=torch.bfloat16),
            rnd(B, L, M, dtype=torch.bfloat16), rnd(B, M), rnd(B, M)]
    seg = torch.arange(L, device=device).repeat(B, 1) % 301

    def run():
        leaves = [t.clone().requires_grad_(True) for t in base]
        eta, delta, nu_log, theta_log, br, bi, h0r, h0i = leaves
        out = samu_tune.scan(eta, delta, nu_log, theta_log, br, bi, initial_state=(h0r, h0i),
                             segment_pos=seg, output_final_state=True, strategy=("lookback", cfg))
        loss = (out.real.float() * 1.5).sum() + out.imag.float().sum() + out.final_state[0].sum()
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return [out.real, out.imag, *out.final_state, *(t.grad for t in leaves)]

    kernel = lb._scan_kernel
    monkeypatch.delenv("SAMU_TUNE_FAST_LAUNCH", raising=False)
    reload_settings()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        runs, direct = [], []
        for switch in ("1", "1", "0"):
            monkeypatch.setenv("SAMU_TUNE_FAST_LAUNCH", switch)
            reload_settings()
            runs.append(run())
            direct.append(kernel.direct)
    finally:
        torch.use_deterministic_algorithms(False)
        monkeypatch.undo()
        reload_settings()
    return runs, kernel, direct


@pytest.mark.gpu
@pytest.mark.parametrize("inner", ["tile", "loop"])
def test_gpu_lookback_direct_and_through_triton_bitwise_equal(inner, monkeypatch):
    """The second run launches the scan directly (forward and backward), the third through
    Triton; outputs and gradients bitwise equal."""
    (first, second, third), kernel, direct = _lookback_on_and_off("cuda", 2, 1000, 96, inner,
                                                                  monkeypatch)
    assert direct[1] >= direct[0] + 2 and direct[2] == direct[1], (direct, kernel)
    assert kernel.reason == "SAMU_TUNE_FAST_LAUNCH=0"
    for a, b, c in zip(first, second, third):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_every_launch_site_passes_its_kept_keyword_dict(monkeypatch):
    """The scan, the fused layer (controller, operands, scan) and the decode step launch with
    ``FastKernel.launch``: a second identical call passes the very same keyword dicts as the
    first (a fresh dict per call would miss the direct path's key every time).  The operands
    kernel runs forward in a no-grad layer forward (its result kept between such calls:
    invalidated here); a training forward's controller writes the operands itself."""
    import samu_tune
    seen: dict = {}
    original = FastKernel.launch

    def recording(self, grid, args, kwargs):
        seen.setdefault(self.fn.__name__, []).append(kwargs)   # the dicts, kept alive
        return original(self, grid, args, kwargs)

    monkeypatch.setattr(FastKernel, "launch", recording)
    g = torch.Generator().manual_seed(0)
    layer = samu_tune.SAMU(72, strategy="fused", generator=g)
    x = torch.randn(1, 40, 144, generator=g, requires_grad=True)

    def calls():
        y, _ = layer(x)
        y.sum().backward()
        with torch.no_grad():
            layer.invalidate_decode_cache()        # the no-grad forward's operands again
            layer(x)
            layer.step(x[:, 0].detach())
            samu_tune.scan(torch.randn(1, 40), torch.randn(1, 40), torch.randn(8) - 1,
                           torch.randn(8), torch.randn(1, 40, 8), torch.randn(1, 40, 8),
                           strategy="lookback")

    calls()
    first = {name: len({id(kw) for kw in dicts}) for name, dicts in seen.items()}
    calls()
    assert {"lookback_scan", "controller_forward", "controller_backward", "layer_operands",
            "layer_operands_backward", "samu_decode_step"} <= set(seen)
    assert {name: len({id(kw) for kw in dicts}) for name, dicts in seen.items()} == first


def test_a_tensor_subclass_goes_to_the_launcher_as_itself(direct):
    """Only plain tensors are passed by address: a subclass (nn.Parameter) is passed as the
    object, which the launcher asks for its address and checks with the driver itself."""
    k, w = _wrapped()
    x = torch.nn.Parameter(torch.zeros(64, dtype=torch.bfloat16))
    args = _args(x=x)
    w[(2,)](*args, A=2)
    w[(2,)](*args, A=2)
    assert w.direct == 1
    passed = k.compiled[0].calls[0][9:15]
    assert passed[0] is x and passed[1] == args[1].data_ptr() and passed[2] is None
