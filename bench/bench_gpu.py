"""One training step on one GPU: FLA's KDAForCausalLM against KimiK3 at matched shapes.

    python bench/bench_gpu.py --steps 10 --warmup 3 --batch 16 --seq 2048 --write
    python bench/bench_gpu.py --only fla_kda,k3_kda --steps 5 --warmup 2      # a subset
    python bench/bench_gpu.py --compile --only k3_kimi_linear                  # torch.compile'd KimiK3 blocks
    python bench/bench_gpu.py --graph --compile --write                        # as trials run on a GPU
    python bench/bench_gpu.py --graph --compile --kda-keep-states              # as the flagship's gpu trials run

One process runs the configurations one after another on the same shapes, each with
random tokens (B x T), bf16 autocast over fp32 weights and fused AdamW. TF32 is on for
the few fp32 matmuls left (FLA's fused cross-entropy accumulates dW with an fp32 GEMM).
Every row, FLA's too, runs the short convolutions on the backend k3lab picks
(`k3lab.ops.kda.fused`: FLA's Gluon one unless FLA_CONV_GLUON says otherwise); the header
line names it.

    fla_kda          FLA KDAForCausalLM: hidden 1024, 12 layers, 8 KDA heads x 128, vocab 32000,
                     SwiGLU MLP (FLA's default ratio 4 -> intermediate 2816), tied embeddings,
                     bounded gate (safe_gate, lower_bound -5) as KimiK3 uses, fused linear CE
    k3_kda           KimiK3 as close as the architectures allow: all KDA (fused), dense SiTU-GLU
                     FFN of width 2816 in every layer, no AttnRes, tied embeddings, chunked CE
    fla_kda_attnres  fla_kda with Block AttnRes, attnres_block_size = 2 * S (FLA counts sub-layers)
    k3_kda_attnres   k3_kda with Block AttnRes, attn_res_block_size = S (k3lab counts decoder layers)
    k3_kda_bf16res, k3_kda_attnres_bf16res, k3_kimi_linear_bf16res
                     the same with `residual_in_fp32: false`: a bf16 residual stream, as FLA's
    k3_kimi_linear   KimiK3 in the Kimi Linear shape: 3 KDA : 1 MLA, Stable LatentMoE after one
                     dense layer, Block AttnRes S, at about the active size of k3_kda

S = 3 decoder layers (FLA 6 sub-layers): both put a block boundary before layers 0, 3, 6, 9.

fla_kda_attnres: FLA 0.6.0's `fused_attnres` needs every residual source in one dtype (its
`attnres_fwd_kernel` picks among the source pointers with `tl.where`, which Triton refuses
for pointers of different types: a `CompilationError`).
Under autocast over fp32 weights, FLA's model feeds it the fp32 embedding output beside
bf16 sub-layer outputs; KimiK3 casts the sources to one dtype before the call. The bench
casts FLA's embedding output to bf16, so its residual stream is bf16 (KimiK3's is fp32).

Reported, all measured: tokens/s (B*T over the mean timed step), MFU, peak memory
(torch.cuda.max_memory_allocated over the whole run, weights and optimizer included),
the first step's time and the last loss. The first step includes Triton compilation and
FLA's autotuning only for kernels and shapes not already tuned in this process or found
in the kernel cache, so it depends on the order of the configurations and on the cache.
MFU = tokens/s * FLOPs per token / 989e12 (H200 dense bf16 peak). FLOPs per token:
KimiK3 -- `count_parameters(model, T)["flops_per_token"]`; FLA -- the same rule applied
to its parameters: 6 x (every 2-D weight a token is multiplied by: the tied embedding once,
as the head) + per KDA layer the chunk term of `counting.kda_flops_per_token`.

Kernel caches: k3lab's kernel cache, as sweeps use it (`--cache-dir DIR`, default
$K3LAB_KERNEL_CACHE or ~/.cache/k3lab/kernels; Triton's cache in DIR/triton), started from the
tunings k3lab ships for this GPU, so FLA's autotuning is paid once per machine kind.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import time
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s
HIDDEN, LAYERS, HEADS, HEAD_DIM, VOCAB = 1024, 12, 8, 128, 32000
FLA_INTERMEDIATE = 2816  # FLA GatedMLP: 256 * ceil(int(1024 * 4 * 2 / 3) / 256)
BLOCK = 3  # AttnRes block size in decoder layers
NAMES = ("fla_kda", "k3_kda", "fla_kda_attnres", "k3_kda_attnres", "k3_kimi_linear",
         "k3_kda_bf16res", "k3_kda_attnres_bf16res", "k3_kimi_linear_bf16res")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first is reported)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {', '.join(NAMES)}")
    parser.add_argument("--compile", action="store_true", help="torch.compile KimiK3's decoder blocks")
    parser.add_argument("--graph", action="store_true",
                        help="replay the whole step as one CUDA graph (k3lab.runner.train.graphs), both models")
    parser.add_argument("--kda-keep-states", action="store_true",
                        help="KimiK3's KDA backward reads the chunk states its forward kept (train.kda_keep_states); "
                             "FLA's model always recomputes them")
    parser.add_argument("--cache-dir", default=None,
                        help="kernel cache folder (default: $K3LAB_KERNEL_CACHE or ~/.cache/k3lab/kernels)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("--from-log", default=None, metavar="LOG",
                        help="write the table of a saved output into docs/benchmarks.md instead of measuring "
                             "(the log's first line says when, where and how it ran)")
    args = parser.parse_args()
    args.names = NAMES if args.only is None else tuple(n.strip() for n in args.only.split(","))
    unknown = set(args.names) - set(NAMES)
    if unknown:
        parser.error(f"unknown configuration(s) {sorted(unknown)}; choose from {', '.join(NAMES)}")
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    return args


# -- the models -----------------------------------------------------------------------------

def fla_model(seq: int, attn_res: bool):
    """FLA's KDAForCausalLM, its FLOPs per token and its 6N parameter count."""
    import torch
    from fla.models import KDAConfig, KDAForCausalLM

    config = KDAConfig(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_heads=HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB,
        max_position_embeddings=seq, safe_gate=True, lower_bound=-5.0, tie_word_embeddings=True,
        attnres_block_size=2 * BLOCK if attn_res else None, use_cache=False, fuse_cross_entropy=True,
    )
    model = KDAForCausalLM(config)
    assert model.model.layers[0].mlp.intermediate_size == FLA_INTERMEDIATE
    if attn_res:  # FLA 0.6.0's model breaks its own op's rule under autocast; see the docstring
        model.model.embeddings.register_forward_hook(lambda module, inputs, out: out.to(torch.bfloat16))
    return model, *fla_flops_per_token(model, seq)


def fla_flops_per_token(model, seq: int) -> tuple[int, int]:
    """(6 N + KDA chunk terms, N), N = 2-D weights a token is multiplied by (see the docstring)."""
    from k3lab.model.counting import kda_flops_per_token

    tied = model.lm_head.weight is model.model.embeddings.weight
    n = sum(p.numel() for name, p in model.named_parameters()  # a tied weight is listed once
            if p.ndim == 2 and "res_proj" not in name and (tied or name != "model.embeddings.weight"))
    kda = kda_flops_per_token(HEADS, HEAD_DIM, 64, seq)  # FLA's chunk_kda default chunk size is 64
    return 6 * n + LAYERS * kda, n


def k3_config(name: str, seq: int):
    from k3lab.model.config import KimiK3Config, kimi_linear_schedule

    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, max_seq_len=seq,
                  kda_implementation="fused", kda_num_heads=HEADS, kda_head_dim=HEAD_DIM, kda_chunk_size=64,
                  kda_gate_lower_bound=-5.0, attn_res_block_size=BLOCK,
                  residual_in_fp32=not name.endswith("_bf16res"))
    name = name.removesuffix("_bf16res")
    if name in ("k3_kda", "k3_kda_attnres"):
        return KimiK3Config(layer_types=("kda",) * LAYERS, num_dense_layers=LAYERS, intermediate_size=FLA_INTERMEDIATE,
                            use_attn_res=name == "k3_kda_attnres", **common)
    # Kimi Linear: KKKM x 3, MoE after the first layer; per MoE layer about 8.1M active
    # parameters (4 of 32 experts at 512 -> 768 -> 512, one shared expert 1024 -> 768,
    # latent projections) against the dense FFN's 8.65M
    return KimiK3Config(
        layer_types=kimi_linear_schedule(LAYERS), num_dense_layers=1, intermediate_size=FLA_INTERMEDIATE,
        use_attn_res=True, mla_num_heads=HEADS, mla_q_lora_rank=512, mla_kv_lora_rank=512,
        mla_qk_head_dim=128, mla_v_head_dim=128, num_experts=32, num_experts_per_token=4, num_shared_experts=1,
        moe_intermediate_size=768, moe_latent_size=512, **common,
    )


def k3_model(name: str, seq: int, compile_blocks_: bool, keep_states: bool = False):
    from k3lab.model.counting import count_parameters
    from k3lab.model.kda import KDAFused, keep_kda_states
    from k3lab.model.model import KimiK3, compile_blocks

    model = KimiK3(k3_config(name, seq))
    assert all(isinstance(layer.attn, KDAFused) for layer in model.layers if layer.layer_type == "kda")
    keep_kda_states(model, keep_states)
    if compile_blocks_:
        compile_blocks(model)
    counts = count_parameters(model, seq)
    return model, counts["flops_per_token"], counts["active_matmul"]


# -- one configuration ------------------------------------------------------------------------

@attrs.define
class Result:
    name: str
    params: int  # all parameters, a tied weight once
    matmul_params: int  # the N of 6N (active for MoE)
    flops_per_token: int
    first_step_s: float
    step_s: float
    tokens_per_s: float
    mfu: float
    peak_gib: float
    loss: float


def loss_function(model, is_fla: bool):
    """(idx, targets) -> the training loss under bf16 autocast, for either model."""
    import torch

    def loss_of(idx, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if is_fla:
                return model(input_ids=idx, labels=idx).loss  # FLA shifts the labels itself
            return model(idx, targets, return_logits=False)[1]
    return loss_of


class Stepper:
    """One training step; with `graph`, the whole step (forward, backward, optimizer, MoE bias
    update) is replayed as a CUDA graph from the third step on (the first two compile and
    autotune), as k3lab trials do."""

    def __init__(self, model, optimizer, is_fla: bool, graph: bool):
        from k3lab.runner.train.graphs import GraphedStep

        self.model, self.optimizer, self.is_fla, self.steps = model, optimizer, is_fla, 0
        self.loss_of = loss_function(model, is_fla)
        self.graphed = GraphedStep(self.step, model.parameters(), [optimizer]) if graph else None

    def step(self, idx, targets) -> dict:
        loss = self.loss_of(idx, targets)
        loss.backward()
        self.optimizer.step()
        if not self.is_fla:
            self.model.update_moe_biases()
        return {"loss": loss.detach()}

    def __call__(self, idx, targets):
        replay = self.graphed is not None and self.steps >= 2
        if replay:
            loss = self.graphed(idx, targets)["loss"]
        else:
            loss = self.step(idx, targets)["loss"]
            self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return loss


def measure(name: str, args: argparse.Namespace) -> Result:
    import torch

    is_fla = name.startswith("fla")
    # every configuration compiles from a clean slate: the compiled code of earlier models
    # counts towards dynamo's recompile limit (a run that hits it runs eagerly)
    gc.collect()
    torch._dynamo.reset()
    torch.manual_seed(0)
    if is_fla:
        model, flops, n = fla_model(args.seq, attn_res=name.endswith("attnres"))
    else:
        model, flops, n = k3_model(name, args.seq, args.compile, args.kda_keep_states)
    model = model.cuda().train()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True, capturable=args.graph)
    train_step = Stepper(model, optimizer, is_fla, args.graph)
    idx = torch.randint(0, VOCAB, (args.batch, args.seq), device="cuda")
    targets = torch.roll(idx, -1, dims=1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()

    start = time.perf_counter()
    train_step(idx, targets)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    print(f"{name}: first step {first:.1f} s", flush=True)
    for _ in range(args.warmup - 1):
        train_step(idx, targets)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step(idx, targets)
    torch.cuda.synchronize()
    step = (time.perf_counter() - start) / args.steps
    tokens_per_s = args.batch * args.seq / step
    return Result(name, params, n, flops, first, step, tokens_per_s, tokens_per_s * flops / H200_BF16_PEAK,
                  torch.cuda.max_memory_allocated() / 2**30, loss.item())


def free_memory() -> None:
    import torch

    gc.collect()
    torch.cuda.empty_cache()


# -- report ----------------------------------------------------------------------------------

def table(results: list, failures: dict) -> str:
    rows = ["| configuration | params | 6N: N | FLOPs/token | first step (s) | step (ms) | tokens/s | MFU | peak mem (GiB) | loss |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r.name} | {r.params / 1e6:.1f}M | {r.matmul_params / 1e6:.1f}M | {r.flops_per_token / 1e9:.2f}G "
                    f"| {r.first_step_s:.1f} | {r.step_s * 1e3:.0f} | {r.tokens_per_s:,.0f} | {r.mfu:.1%} "
                    f"| {r.peak_gib:.1f} | {r.loss:.3f} |")
    for name, error in failures.items():
        rows.append(f"| {name} | failed: {error} | | | | | | | | |")
    return "\n".join(rows)


SECTION = "GPU training step: FLA KDA vs KimiK3"


def body_from_log(path: str) -> tuple[str, str]:
    """(the log's first line, the report it ends with: the settings line and the table) of a saved
    output of this bench; a one-line exit when the log holds no report (a run stopped early)."""
    lines = Path(path).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("B=")), None)
    if start is None:  # also an empty log
        sys.exit(f"{path}: no report of bench_gpu.py in it (a line starting 'B=' then the table)")
    return lines[0].lstrip("# "), "\n".join(lines[start:])


def main() -> None:
    args = parse_args()
    if args.from_log:
        from bench.report import write_section

        origin, body = body_from_log(args.from_log)
        write_section(SECTION, body, measured_on=origin)
        return
    from k3lab.runner.runtime.kernel_cache import open_kernel_cache

    open_kernel_cache(args.cache_dir)  # before FLA is imported; k3lab's cache, started from its shipped tunings
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    importlib.import_module("k3lab.ops.kda.fused")  # sets the convolution backend for every row, FLA's rows first

    conv = "Gluon" if os.environ.get("FLA_CONV_GLUON", "0") != "0" else "Triton"
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; TRITON_CACHE_DIR="
          f"{os.environ.get('TRITON_CACHE_DIR', '(default)')}; FLA's {conv} causal convolution in every row",
          flush=True)
    results, failures = [], {}
    for name in args.names:
        try:
            results.append(measure(name, args))
            print(table(results[-1:], {}).splitlines()[-1], flush=True)
        except torch.cuda.OutOfMemoryError:
            failures[name] = "out of memory"
        except Exception as error:  # report and go on: GPU time is scarce
            failures[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
            print(f"{name}: {failures[name]}", flush=True)
        free_memory()
    body = (f"B={args.batch}, T={args.seq}, {args.warmup} warm-up + {args.steps} timed steps, bf16 autocast, "
            f"fused AdamW, random tokens, KimiK3 blocks {'torch.compile' if args.compile else 'eager'}"
            f"{', the whole step as a CUDA graph' if args.graph else ''}"
            f"{', KimiK3 with KDA chunk states kept for the backward' if args.kda_keep_states else ''}. "
            f"AttnRes block size {BLOCK} decoder layers (FLA: {2 * BLOCK} sub-layers). "
            f"FLA's {conv} causal convolution in every row. "
            "MFU against 989 TFLOP/s; FLOPs per token as in bench/bench_gpu.py's docstring. First step: "
            "includes compilation/autotuning not already cached, so it depends on run order and cache.\n\n"
            + table(results, failures))
    print(body)
    if args.write:
        from bench.report import write_section

        write_section(SECTION, body)


if __name__ == "__main__":
    main()
