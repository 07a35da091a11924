"""Attention Residuals: `naive.py` (plain PyTorch, the reference and the kernels' twins), `fused.py` (the
endpoint buffer and autograd functions over `buffer_kernel.py`'s Triton kernels), `kernel.py` (the kernels
over a tuple of sources, before the buffer: bench/bench_attnres.py's rows)."""
