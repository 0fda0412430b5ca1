"""The SAMU layer around the scan: reference, torch module, decode step, varlen helpers."""
from samu_tune.ops.layer.module import SAMU
from samu_tune.ops.layer.reference import SAMUParams, controller_reference, layer_reference, step_reference
from samu_tune.ops.layer.varlen import cu_seqlens_to_segment_pos, reverse_segment_pos
from samu_tune.ops.layer.varlen import scan as varlen_scan

__all__ = ["SAMU", "SAMUParams", "controller_reference", "layer_reference", "step_reference",
           "cu_seqlens_to_segment_pos", "reverse_segment_pos", "varlen_scan"]
