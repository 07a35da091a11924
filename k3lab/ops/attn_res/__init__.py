"""Attention Residuals: `naive.py` (plain PyTorch), `fused.py` (autograd functions over `kernel.py`'s Triton kernels)."""
