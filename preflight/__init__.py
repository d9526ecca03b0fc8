"""preflight: declarative cluster preflight checks and launch configs for PyTorch distributed training."""

__version__ = "0.1.0"
