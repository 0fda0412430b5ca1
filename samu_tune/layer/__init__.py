"""The SAMU layer around the scan: reference, torch module, decode step, varlen helpers."""
from .module import SAMU
from .reference import SAMUParams, controller_reference, layer_reference, step_reference
from .varlen import cu_seqlens_to_segment_pos, reverse_segment_pos
from .varlen import scan as varlen_scan

__all__ = ["SAMU", "SAMUParams", "controller_reference", "layer_reference", "step_reference",
           "cu_seqlens_to_segment_pos", "reverse_segment_pos", "varlen_scan"]
