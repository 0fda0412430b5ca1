"""samu_tune: autotuned GPU scan strategies for the SAMU complex diagonal recurrence.

``samu_tune.scan(eta, delta, nu_log, theta_log, br, bi, ...)`` dispatches to the fastest
registered strategy for the problem and GPU.
"""
from .dispatch import NoEligibleStrategy, resolve, scan
from .layer import SAMU, varlen_scan
from .ops import complex_scan, real_scan
from .problem import ScanProblem
from .reference import scan_reference
from .registry import Capability, Strategy, all_strategies, eligible, get, register
from .tensors import ScanInputs, ScanOutput

__version__ = "0.1.0"

__all__ = [
    "scan", "resolve", "NoEligibleStrategy", "ScanProblem", "scan_reference", "Capability",
    "Strategy", "all_strategies", "eligible", "get", "register", "ScanInputs", "ScanOutput",
    "__version__",
    "SAMU", "real_scan", "complex_scan", "varlen_scan",
]
