"""Generic diagonal linear scans (real and complex) with Triton strategies."""
from samu_tune.ops.linear.launch import ChunkConfig, SerialConfig
from samu_tune.ops.linear.scan import ComplexScanOutput, RealScanOutput, complex_scan, real_scan

__all__ = ["real_scan", "complex_scan", "RealScanOutput", "ComplexScanOutput",
           "SerialConfig", "ChunkConfig"]
