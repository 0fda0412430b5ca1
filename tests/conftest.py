"""Test environment: Triton on the CPU interpreter (no GPU), poisoned outputs, a private cache.

Set before samu_tune is imported (settings are read once).
"""
import os
import tempfile

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from interpreter_scan import install as _install_fast_scan  # noqa: E402

    _install_fast_scan()
os.environ["SAMU_TUNE_POISON"] = "1"
# every test verifies its candidates (the store of passes is tested on its own)
os.environ.setdefault("SAMU_TUNE_VERIFY_CACHE", "0")
os.environ.setdefault("SAMU_TUNE_CACHE_DIR", tempfile.mkdtemp(prefix="samu_tune_test_cache_"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine: tools/gpu_run.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
