"""Kimi Delta Attention: `naive.py` (the chunkwise and recurrent forms in plain PyTorch), `fused.py` (FLA's kernels)."""
