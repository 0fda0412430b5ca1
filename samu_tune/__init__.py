"""samu_tune: autotuned GPU scan strategies for the SAMU complex diagonal recurrence.

``samu_tune.scan(eta, delta, nu_log, theta_log, br, bi, ...)`` dispatches to the fastest
registered strategy for the problem and GPU; ``samu_tune.tune(problem)`` measures it;
``samu_tune.cache`` holds the winners; ``samu_tune.explain(...)`` says what dispatch does.
"""
__version__ = "0.1.0"

from . import cache  # noqa: E402
from .layer import SAMU, varlen_scan  # noqa: E402
from .ops import complex_scan, real_scan  # noqa: E402
from .dispatch import (Decision, Explanation, NoEligibleStrategy, choose, explain,  # noqa: E402
                       resolve, scan)
from .problem import DecodeProblem, ScanProblem  # noqa: E402
from .reference import scan_reference  # noqa: E402
from .registry import Capability, Strategy, all_strategies, eligible, get, register  # noqa: E402
from .rules import rule_choice  # noqa: E402
from .tensors import ScanInputs, ScanOutput  # noqa: E402
from .tuner import Candidate, TuneEvent, TuneResult, tune  # noqa: E402
from . import torch_ops  # noqa: E402,F401  (the samu_tune::* operators, before any trace)
from .settings import settings as _settings  # noqa: E402

_settings()   # read the environment now: torch.compile traces a read of it, not its parsing

__all__ = [
    "scan", "resolve", "choose", "explain", "Decision", "Explanation", "NoEligibleStrategy",
    "tune", "TuneResult", "TuneEvent", "Candidate", "cache", "rule_choice",
    "ScanProblem", "DecodeProblem", "scan_reference", "Capability", "Strategy", "all_strategies", "eligible",
    "get", "register", "ScanInputs", "ScanOutput", "__version__",
    "SAMU", "real_scan", "complex_scan", "varlen_scan",
]
