"""What compiling Muon costs, counted on CPU: the first and second step of the `small` model's
Muon with `compile=True`, the graphs Dynamo made and the kernels Inductor generated.

    python scripts/muon_compile_count.py TREE     # TREE: a folder holding k3lab/ (e.g. `git archive REV k3lab`)

Random gradients; no forward. Run it with a fresh TORCHINDUCTOR_CACHE_DIR, or the second run of a
tree reads its kernels from the cache. A CPU's compile time is a proxy for a GPU machine's, not its value.
"""

from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path

import torch
import yaml


def main(tree: str) -> None:
    sys.path.insert(0, tree)
    from torch._dynamo.utils import counters
    from torch._inductor import metrics

    from k3lab.model.config import KimiK3Config
    from k3lab.model.model import KimiK3
    from k3lab.optim.muon import Muon
    from k3lab.optim.assignment import build_optimizers

    config = KimiK3Config(**yaml.safe_load((Path(tree) / "k3lab/presets/small.yaml").read_text()))
    model = KimiK3(config)
    muon = build_optimizers(model, lr=3e-3, weight_decay=0.1)[0]
    (group,) = muon.param_groups
    muon = Muon(group["params"], lr=3e-3, weight_decay=0.1, adjust_lr_fn=group["adjust_lr_fn"], compile=True)
    for p in group["params"]:
        p.grad = 1e-3 * torch.randn_like(p)
    times = []
    for _ in range(2):
        began = time.perf_counter()
        muon.step()
        times.append(time.perf_counter() - began)
    compiled = [name for name in ("stack", "orthogonalise", "apply") if hasattr(muon, name)]
    print(f"{tree}: Muon(compile=True) over {len(group['params'])} parameters ({', '.join(compiled)}; "
          f"build_optimizers takes compile: {'compile' in inspect.signature(build_optimizers).parameters}): "
          f"first step {times[0]:.1f} s, second {times[1]:.2f} s, {counters['stats']['unique_graphs']} graphs, "
          f"{metrics.generated_kernel_count} generated kernels")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
