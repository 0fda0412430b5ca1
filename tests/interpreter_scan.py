"""A faster ``tl.associative_scan`` for the Triton CPU interpreter (tests only).

The interpreter's generic scan calls the combine function once per element from Python; a
[CHUNK, BLOCK_M] tile of four fp32 pairs takes seconds.  This version walks the scanned axis
once and combines whole slices (every other axis at once): the same sequential left fold, so
results are identical, in CHUNK calls instead of CHUNK * BLOCK_M.
"""
from __future__ import annotations

import numpy as np


def install() -> bool:
    """Patch the interpreter's ``ScanOps.generic_scan``; False when its layout is unknown."""
    try:
        from triton.runtime import interpreter
    except Exception:  # pragma: no cover - no triton
        return False
    scan_ops = getattr(interpreter, "ScanOps", None)
    if scan_ops is None or not hasattr(scan_ops, "generic_scan"):
        return False

    def generic_scan(self, input):
        axis = self.axis
        datas = [np.moveaxis(arg.handle.data, axis, 0) for arg in input]
        dtypes = [arg.dtype for arg in input]
        n = datas[0].shape[0]
        outs = [np.empty_like(d) for d in datas]
        acc = [d[0] for d in datas]
        for j, a in enumerate(acc):
            outs[j][0] = a
        for k in range(1, n):
            acc_t = tuple(self.to_tensor(np.ascontiguousarray(a), dt) for a, dt in zip(acc, dtypes))
            cur_t = tuple(self.to_tensor(np.ascontiguousarray(d[k]), dt)
                          for d, dt in zip(datas, dtypes))
            ret = self.combine_fn.fn(*acc_t, *cur_t)
            ret = ret if isinstance(ret, tuple) else (ret,)
            acc = []
            for j, r in enumerate(ret):
                val = r.handle.data if hasattr(r, "handle") else np.asarray(r)
                val = np.broadcast_to(val.reshape(val.shape or ()), datas[j].shape[1:])
                outs[j][k] = val
                acc.append(outs[j][k])
        return [self.to_tensor(np.ascontiguousarray(np.moveaxis(o, 0, axis)), dt)
                for o, dt in zip(outs, dtypes)]

    scan_ops.generic_scan = generic_scan
    return True
