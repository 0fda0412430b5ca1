"""The SAMU layer around the scan: reference, torch module, decode step, varlen helpers."""
from .module import SAMU
from .reference import SAMUParams, controller_reference, layer_reference, step_reference

__all__ = ["SAMU", "SAMUParams", "controller_reference", "layer_reference", "step_reference"]
