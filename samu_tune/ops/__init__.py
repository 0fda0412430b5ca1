"""The ops, one package each: its problem, spec (the tuner's hooks), float64 reference,
strategies and ``torch.library`` operators.  The core (registry, tuner, cache, dispatch,
timing) knows an op only through :data:`BUILTIN` and what the op registers.

- ``scan``: the SAMU scan (``samu_tune.scan``);
- ``layer``: the SAMU layer (``samu_tune.SAMU``), fused or around the scan;
- ``decode``: the layer's one-token step (``SAMU.step``);
- ``linear``: the generic real / complex diagonal scans (``samu_tune.real_scan``, ...).
"""

# op -> the module whose import registers the op's spec and strategies
BUILTIN: dict[str, str] = {
    "scan": "samu_tune.ops.scan.spec",
    "decode": "samu_tune.ops.decode.spec",
    "layer": "samu_tune.ops.layer.spec",
    "linear": "samu_tune.ops.linear.spec",
}
