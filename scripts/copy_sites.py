"""On a GPU machine, from the repository root: `python scripts/copy_sites.py`.

Where a `small` trial's step (16 x 512 tokens, bf16 residual stream, compiled blocks, Muon +
capturable AdamW) spends device-to-device copies and memsets: three eager whole steps, then one
under torch.profiler; prints the step's kernels by count and, for each cudaMemcpyAsync and
cudaMemsetAsync, the chain of ops above it. In a captured step each is a graph node of its own.
Its runs: docs/runs/copies-*.log (docs/journal/kernel-headroom.md).
"""
import sys
from collections import Counter

import torch
from torch.profiler import profile, ProfilerActivity

sys.path.insert(0, ".")
from k3lab.model.model import KimiK3, compile_blocks
from k3lab.optim.assignment import build_optimizers
from k3lab.registry.presets import load_preset
from k3lab.runner.runtime.kernel_cache import open_kernel_cache

open_kernel_cache(None)
torch.backends.cuda.matmul.allow_tf32 = True
config = load_preset("small").replace(kda_implementation="fused", max_seq_len=1024, residual_in_fp32=False)
torch.manual_seed(0)
model = KimiK3(config).cuda().train()
compile_blocks(model)
optimizers = build_optimizers(model, lr=3e-3, weight_decay=0.1, capturable=True)
idx = torch.randint(0, config.vocab_size, (16, 512), device="cuda")
targets = torch.roll(idx, -1, dims=1)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, targets, return_logits=False)[1]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for o in optimizers:
        o.step()
    model.update_moe_biases()
    for o in optimizers:
        o.zero_grad(set_to_none=True)


for _ in range(3):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True, record_shapes=True) as prof:
    step()
    torch.cuda.synchronize()
kernels = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        kernels[e.name] = kernels.get(e.name, 0) + 1
print("kernels in the eager step:", sum(kernels.values()))
for name, n in sorted(kernels.items(), key=lambda kv: -kv[1])[:25]:
    print(f"{n:6d}  {name[:110]}")
print("\n== cudaMemcpyAsync by op chain and stack")
sites = Counter()
for e in prof.events():
    if e.name not in ("cudaMemcpyAsync", "cudaMemsetAsync"):
        continue
    chain, parent, stack = [], e.cpu_parent, []
    while parent is not None:
        chain.append(parent.name)
        if not stack and parent.stack:
            stack = [f for f in parent.stack if "site-packages/torch" not in f][:4]
        parent = parent.cpu_parent
    sites[(e.name + ": " + " < ".join(chain[:5]), " | ".join(stack))] += 1
for (chain, stack), n in sites.most_common(45):
    print(f"{n:5d}  {chain}\n         {stack}")
