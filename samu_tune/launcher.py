"""Direct launches of compiled Triton kernels: the host work of ``JITFunction.run`` once per
specialisation instead of once per launch.

``kernel[grid](*args, **kwargs)`` runs ``JITFunction.run`` on every call: it binds the
arguments, specialises each one (``native_specialize_impl``), builds and looks up a cache key,
builds launch metadata and reads Triton's knobs, then calls the compiled kernel's launcher.
With ~30 arguments that is tens of microseconds of host time per launch.  :func:`fast` wraps a
kernel in a :class:`FastKernel`, called the same way::

    _scan_kernel = fast(lookback_kernels.lookback_scan)        # once, at module import
    _scan_kernel[(slots,)](a, b, ..., HAS_RESETS=True, num_warps=4, **LAUNCH_OPTIONS)

The first call for a specialisation key goes through ``kernel[grid](...)`` (compiling when
needed), which returns the ``CompiledKernel``; the wrapper keeps its launcher, ``function`` and
``packed_metadata`` and the values of the parameters after the positional ones (constexprs
given by keyword, defaults), and a later call with the same key calls the launcher itself,
with the arguments ``JITFunction.run`` passes (Triton 3.6 and 3.9, ``runtime/jit.py``)::

    kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata,
               launch_metadata, launch_enter_hook, launch_exit_hook, *bound_args.values())

``bound_args`` holds every parameter of the kernel's signature in order, constexprs and None
included, defaults applied (the launcher drops the constexprs itself).  The wrapper passes
each plain tensor by its address (an int), which the launcher takes as it is: for a tensor
object it would call ``data_ptr()`` and ask the driver whether the address is device memory
(``cuPointerGetAttribute``), once per tensor and launch.  The wrapper passes
None for the launch metadata and both hooks: it launches directly only while Triton's launch
hooks are unset or empty hook chains (Triton 3.6 and 3.9 default to empty chains, which call
nothing), so the launcher skips the hook calls Triton would make to no effect.  The grid is a
tuple padded to three dimensions; the stream is the device's current one, read the way
Triton reads it (``driver.active.get_current_stream``: torch's current raw CUDA stream), so
launches inside CUDA graph capture are captured as with the normal path; nothing here
synchronises the host.

The key holds everything Triton specialises a binary on (``native_specialize_impl`` of
``python/src/specialize.cc``: ``handle_tensor``, ``handle_long_type``, ``handle_bool_type``,
``handle_float_type``; the same results from Triton 3.6.0 and 3.9.0):

* the current device (Triton keeps a kernel cache, and loaded binaries, per device);
* every keyword argument, name, type and value: constexprs and compile options
  (``num_warps``, ``num_stages``, ``enable_fp_fusion``, ...);
* per positional argument: None (a ``constexpr`` None); a tensor's dtype and whether its
  ``data_ptr()`` is a multiple of 16 (``tt.divisibility`` 16); an int's type (i32 for
  [-2**31, 2**31), i64 up to 2**63, u64 beyond), whether it is 1 (a ``constexpr`` 1) and
  whether it is a multiple of 16; a bool (``u1``) or a float (``fp32``) by type alone, as
  Triton does.  A positional argument of any other type launches through Triton.

The key is finer than Triton's where that is cheaper (an int 1 of a ``do_not_specialize``
parameter, an alignment of a ``do_not_specialize_on_alignment`` one): a finer key costs one
more launch through Triton, never a wrong binary.  Building it costs a type check,
``data_ptr()`` and ``dtype`` per tensor and a few hundred nanoseconds for the keywords
(generated code, :func:`_key_function`).

A call launches through Triton instead, and records nothing, when Triton would do more than
launch: a launch hook installed, ``knobs.runtime.debug`` or an instrumentation mode on, a
pipeline-stages inspection hook set, the kernel's ``pre_run_hooks`` non-empty, a grid that is
not a tuple, a constexpr passed positionally, or the kernel object on its module replaced
(tests and profiling scripts swap a kernel for a counting stub: the stub is called).  The
wrapper launches through Triton for good, with :attr:`FastKernel.reason` saying why, when
``SAMU_TUNE_FAST_LAUNCH=0``, under ``TRITON_INTERPRET=1``, when the kernel is not a
``JITFunction``, when Triton's ``JITFunction.run`` does not call the launcher as above (read
from its source once, so a Triton that calls it differently is caught before any direct
launch), or when a direct launch raises and the same launch through Triton succeeds (a warning
says so once; an error Triton raises too is the caller's and leaves the direct path open).

Triton's check that the module globals a kernel reads have not changed since it compiled runs
on the launches through Triton only.
"""
from __future__ import annotations

import functools
import inspect
import logging
import sys
import warnings
import weakref
from typing import Any, Callable, Optional

import torch

from samu_tune.settings import settings as _settings

log = logging.getLogger(__name__)

_Tensor = torch.Tensor
_NO_DIRECT = object()        # a record: this key launches through Triton
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U64_MAX = (1 << 64) - 1
# the launcher call of ``JITFunction.run``, whitespace removed (Triton 3.6 and 3.9)
_LAUNCH_CALL = ("kernel.run(grid_0,grid_1,grid_2,stream,kernel.function,kernel.packed_metadata,"
                "launch_metadata,knobs.runtime.launch_enter_hook,"
                "knobs.runtime.launch_exit_hook,*bound_args.values())")


# records of one kernel before they are dropped (each is re-made by one launch through Triton)
_MAX_RECORDS = 4096


class _Unsupported(Exception):
    """A positional argument of a type the key does not describe."""


# Triton's knobs and default (empty) launch hook chains, set by _triton()
_RT: Any = None
_COMP: Any = None
_ENTER: Any = None
_EXIT: Any = None


@functools.lru_cache(maxsize=1)
def _triton() -> tuple[Optional[str], Any]:
    """(why the direct path is unavailable or None, ``JITFunction``): Triton's
    ``JITFunction.run`` checked, from its source, to call the launcher with the arguments
    this module passes; its knobs kept for the per-call checks."""
    global _RT, _COMP, _ENTER, _EXIT
    try:
        from triton.runtime.jit import JITFunction
    except Exception as exc:  # pragma: no cover - no triton
        return f"triton not importable: {exc!r}", None
    try:
        from triton import knobs
        rt, comp = knobs.runtime, knobs.compilation
    except Exception:
        return ("triton has no knobs module (older than 3.4): launcher call convention not "
                "checked", JITFunction)
    try:
        source = "".join(inspect.getsource(JITFunction.run).split())
    except (OSError, TypeError) as exc:
        return f"JITFunction.run source unreadable: {exc!r}", JITFunction
    if _LAUNCH_CALL not in source:
        return ("JITFunction.run does not call the launcher as expected "
                "(kernel.run(grid_0, ..., *bound_args.values()))", JITFunction)
    _RT, _COMP = rt, comp
    _ENTER, _EXIT = rt.launch_enter_hook, rt.launch_exit_hook
    return None, JITFunction


def _triton_busy(fn) -> bool:
    """Whether ``JITFunction.run`` does more than launch on this call: a launch hook
    installed, debug or an instrumentation mode on, a pipeline-stages inspection hook, the
    kernel's pre-run hooks.  The hooks are idle while they are Triton's default (empty) hook
    chains, or None."""
    rt = _RT
    enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook
    return bool((enter is not _ENTER and enter is not None) or (enter is _ENTER and _ENTER.calls)
                or (exit_ is not _EXIT and exit_ is not None) or (exit_ is _EXIT and _EXIT.calls)
                or rt.debug or getattr(_COMP, "instrumentation_mode", None)
                or getattr(rt, "add_stages_inspection_hook", None) is not None
                or fn.pre_run_hooks)


def _spec(a):
    """The key entry of a positional argument other than a torch.Tensor or None."""
    t = type(a)
    if t is int:
        if a == 1:
            return 2                               # constexpr 1
        if _I32_MIN <= a <= _I32_MAX:
            return 3 if a & 15 else 4
        if _I64_MIN <= a <= _I64_MAX:
            return 5 if a & 15 else 6
        if 0 <= a <= _U64_MAX:
            return 7 if a & 15 else 8
        return 9                                   # Triton raises: never recorded
    if t is bool:
        return "u1"
    if t is float:
        return "fp32"
    if isinstance(a, _Tensor):                     # a subclass (nn.Parameter)
        return a.dtype if not a.data_ptr() & 15 else (a.dtype, "misaligned")
    raise _Unsupported


@functools.lru_cache(maxsize=None)
def _key_function(n: int, fixed: bool = False) -> Callable:
    """``key(device, kwargs, a0, ..., a{n-1})`` -> (key, arguments): the specialisation key of
    a call with ``n`` positional arguments, one flat tuple: the device, the keywords' names,
    values and value types (True, 1 and 1.0 are equal keys but different constexprs), then one
    entry per argument: a 16-byte aligned tensor's dtype, ``(dtype, "misaligned")``, None, or
    :func:`_spec`'s entry; and the arguments for the launcher, each ``torch.Tensor`` replaced
    by its address.  The launcher takes an int pointer as it is, where for a tensor it calls
    ``data_ptr()`` and asks the driver whether the address is device memory
    (``cuPointerGetAttribute``, once per tensor and launch; Triton 3.6 and 3.9): the callers
    pass CUDA tensors of the current device (the public entry points check devices), and
    the first launch of every key goes through Triton with the tensors themselves.  Generated
    code without a loop: a tensor costs its type check, ``data_ptr()`` and ``dtype``.
    ``fixed``: ``key(device, id_of_kwargs, a0, ...)``, for keywords whose dict is kept
    (:meth:`FastKernel.launch`)."""
    names = [f"a{i}" for i in range(n)]
    body = []
    for i, a in enumerate(names):
        body += [f"    if type({a}) is T:",
                 f"        p{i} = {a}.data_ptr()",
                 f"        k{i} = {a}.dtype if not p{i} & 15 else ({a}.dtype, 'misaligned')",
                 f"    elif {a} is None:",
                 f"        p{i} = k{i} = None",
                 "    else:",
                 f"        p{i} = {a}",
                 f"        k{i} = spec({a})"]
    keys = ", ".join(f"k{i}" for i in range(n))
    ptrs = ", ".join(f"p{i}" for i in range(n)) + ("," if n == 1 else "")
    if fixed:
        src = (f"def key(device, kw_id, {', '.join(names)}):\n" + "\n".join(body) + "\n"
               f"    return (device, 'fixed', kw_id, {keys}), ({ptrs})\n")
    else:
        src = (f"def key(device, kw, {', '.join(names)}):\n" + "\n".join(body) + "\n"
               f"    values = tuple(kw.values())\n"
               f"    return (device, tuple(kw), values, tuple(map(type, values)), {keys}), "
               f"({ptrs})\n")
    namespace = {"T": _Tensor, "spec": _spec}
    exec(compile(src, f"<samu_tune.launcher key/{n}>", "exec"), namespace)
    return namespace["key"]


def _driver_device_stream() -> tuple[Callable[[], int], Callable[[int], int]]:
    """Triton's current-device and current-stream functions (its active driver).  Torch's
    ``current_device`` (CUDA's lazy init, then ``torch._C._cuda_getDevice``) is called once
    here, as Triton's first launch would, and replaced by the getter."""
    from triton.runtime import driver
    active = driver.active
    device, stream = active.get_current_device, active.get_current_stream
    if device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
        device()
        device = torch._C._cuda_getDevice
    return device, stream


def _home(kernel) -> tuple[Optional[dict], Optional[str]]:
    """The namespace and name the kernel is bound to on its defining module, when it is."""
    fn = getattr(kernel, "fn", None)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    name = getattr(fn, "__name__", None)
    if module is not None and name and getattr(module, name, None) is kernel:
        return vars(module), name
    return None, None


class FastKernel:
    """A Triton kernel launched as ``wrapper[grid](*args, **kwargs)``: through Triton on the
    first call of each specialisation, directly through its compiled launcher after.

    ``direct`` and ``normal`` count the launches each way; ``reason`` says why the wrapper
    launches through Triton only (None while the direct path is open).  ``device`` and
    ``stream`` (tests) replace Triton's current-device and current-stream functions."""

    __slots__ = ("fn", "direct", "normal", "reason", "_failed", "_records", "_settings",
                 "_n_plain", "_home_ns", "_home_name", "_device", "_stream", "_kept",
                 "__weakref__")

    def __init__(self, fn, *, device: Optional[Callable[[], int]] = None,
                 stream: Optional[Callable[[int], int]] = None):
        self.fn = fn
        self.direct = 0
        self.normal = 0
        self.reason: Optional[str] = "not configured"
        self._failed: Optional[str] = None
        self._records: dict = {}
        self._kept: dict[int, dict] = {}         # id -> a fixed keyword dict in a key
        self._settings = None
        self._n_plain = 0
        self._home_ns, self._home_name = _home(fn)
        self._device = device
        self._stream = stream

    def __repr__(self) -> str:
        state = "direct" if self.reason is None else f"through Triton: {self.reason}"
        return f"FastKernel({self.fn!r}, {state}, direct={self.direct}, normal={self.normal})"

    def __getitem__(self, grid):
        launch = self._launch
        return lambda *args, **kwargs: launch(grid, args, kwargs)

    def launch(self, grid: tuple, args: tuple, kwargs: dict):
        """``self[grid](*args, **kwargs)`` for a ``kwargs`` dict that the caller keeps and
        never changes (a memoized launch plan's keywords): the key holds the dict's identity
        instead of its items, and nothing is repacked (~1.5 us less host time per launch on
        the development CPU).  The record keeps the dict alive, so its identity is never
        another dict's."""
        return self._launch(grid, args, kwargs, fixed=True)

    def reset(self) -> None:
        """Forget the records, the counts and a failure (tests)."""
        self._records.clear()
        self._kept.clear()
        self.direct = self.normal = 0
        self._failed = None
        self._settings = None

    # ---------------------------------------------------------------- configuration -----
    def _configure(self, s) -> None:
        self._settings = s
        self.reason = self._why_not(s)

    def _why_not(self, s) -> Optional[str]:
        if self._failed is not None:
            return self._failed
        if not s.fast_launch:
            return "SAMU_TUNE_FAST_LAUNCH=0"
        if s.interpret:
            return "TRITON_INTERPRET=1"
        unavailable, jit_function = _triton()
        if unavailable is not None:
            return unavailable
        if not isinstance(self.fn, jit_function):
            return f"not a JITFunction: {type(self.fn).__name__}"
        if not isinstance(getattr(self.fn, "pre_run_hooks", None), list):
            return "kernel without pre_run_hooks"
        params = list(getattr(self.fn, "params", ()))
        signature = getattr(self.fn, "signature", None)
        if not params or signature is None or any(
                p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY)
                for p in signature.parameters.values()):
            return "kernel signature not plain positional parameters"
        # positional arguments are keyed by type: only those before the first constexpr
        self._n_plain = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
        if self._device is None or self._stream is None:
            try:
                device, stream = _driver_device_stream()
            except Exception as exc:
                return f"no Triton driver: {exc!r}"
            self._device = self._device or device
            self._stream = self._stream or stream
        return None

    # ---------------------------------------------------------------- launch -------------
    def _launch(self, grid, args: tuple, kwargs: dict, fixed: bool = False):
        fn = self.fn
        if self._home_ns is not None and self._home_ns.get(self._home_name) is not fn:
            self.normal += 1                       # the kernel swapped on its module
            return self._home_ns[self._home_name][grid](*args, **kwargs)
        s = _settings()
        if s is not self._settings:
            self._configure(s)
        if (self.reason is not None or type(grid) is not tuple or len(args) > self._n_plain
                or _triton_busy(fn)):
            self.normal += 1
            return fn[grid](*args, **kwargs)
        device = self._device()
        try:
            if fixed:
                key, ptrs = _key_function(len(args), True)(device, id(kwargs), *args)
            else:
                key, ptrs = _key_function(len(args))(device, kwargs, *args)
            record = self._records.get(key)
        except (_Unsupported, TypeError):          # TypeError: an unhashable keyword value
            self.normal += 1
            return fn[grid](*args, **kwargs)
        if record is None:
            self.normal += 1
            kernel = fn[grid](*args, **kwargs)
            if len(self._records) >= _MAX_RECORDS:  # bounds the kept keyword dicts too
                self._records.clear()
                self._kept.clear()
            self._records[key] = self._record(kernel, len(args), kwargs)
            if fixed:
                self._kept[id(kwargs)] = kwargs
            return kernel
        if record is _NO_DIRECT:
            self.normal += 1
            return fn[grid](*args, **kwargs)
        kernel, launcher, function, packed, tail = record
        n = len(grid)
        try:
            launcher(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
                     self._stream(device), function, packed, None, None, None, *ptrs, *tail)
        except Exception as exc:
            self.normal += 1
            kernel = fn[grid](*args, **kwargs)     # raises when the call itself is wrong
            self._fail(f"direct launch failed: {exc!r}")
            return kernel
        self.direct += 1
        return kernel

    def _record(self, kernel, n_args: int, kwargs: dict):
        """What a direct launch of this key needs, or ``_NO_DIRECT``."""
        if kernel is None:                         # a jit cache hook skipped the compile
            return _NO_DIRECT
        missing = [a for a in ("run", "function", "packed_metadata") if not hasattr(kernel, a)]
        if missing or kernel.function is None:
            self._fail(f"the launched kernel ({type(kernel).__name__}) has no "
                       f"{', '.join(missing) or 'loaded function'}")
            return _NO_DIRECT
        params = self.fn.params
        tail = []
        for p in params[n_args:]:
            if p.name in kwargs:
                if not p.is_constexpr:             # a runtime value: not fixed by the key
                    return _NO_DIRECT
                tail.append(kwargs[p.name])
            else:
                default = p.default
                if default is inspect.Parameter.empty:
                    return _NO_DIRECT
                tail.append(default)
        return kernel, kernel.run, kernel.function, kernel.packed_metadata, tuple(tail)

    def _fail(self, reason: str) -> None:
        """Launch through Triton from now on, saying why once (a warning and the log)."""
        name = getattr(getattr(self.fn, "fn", None), "__name__", None) or repr(self.fn)
        self._failed = self.reason = reason
        self._records.clear()
        self._kept.clear()
        message = (f"samu_tune: {reason} for Triton kernel {name}; it launches through "
                   f"Triton from now on")
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


# every wrapper :func:`fast` made (the host benchmark reports their launch counts)
WRAPPERS: "weakref.WeakSet[FastKernel]" = weakref.WeakSet()


def fast(kernel) -> FastKernel:
    """``kernel`` (a ``@triton.jit`` function) wrapped in a :class:`FastKernel`; a wrapper is
    returned as it is."""
    if isinstance(kernel, FastKernel):
        return kernel
    WRAPPERS.add(wrapper := FastKernel(kernel))
    return wrapper
