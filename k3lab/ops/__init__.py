"""Kernels beside their plain-PyTorch twins, one folder per op: `naive.py` the reference, the fused path beside it."""
