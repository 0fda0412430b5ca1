"""The SAMU layer's decode step (``SAMU.step``): problem, spec and strategies, the step."""
