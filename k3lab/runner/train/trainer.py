"""One training trial's `Trainer`: a KimiK3 variant on cached token shards, its optimizer steps
(eager or CUDA-graphed), evaluation, and state for checkpoints. `k3lab.runner.train.loop` runs it:

    result = train(config, train_spec, tracker=None, checkpoint=None, seed=0)
    result = fit(trainer, tracker, checkpoint, on_eval=..., progress=...)   # a Trainer built already

Used in-process (`k3lab train`) and inside Ray Tune trials (`k3lab.runner.tune.trial`).
Per-step values stay on the device and are fetched once per `log_interval` window,
so the loop does not wait on the host every step; NaN/inf is caught at that point and
stops the trial with status "diverged".
"""

from __future__ import annotations

import math
import os
import time
import warnings
from pathlib import Path

import attrs
import torch
import torch.distributed as dist

from k3lab.data import BatchSampler, prepare_dataset
from k3lab.errors import UserError
from k3lab.model.config import KimiK3Config
from k3lab.model.counting import count_parameters
from k3lab.model.inference import eager_if_compiled
from k3lab.model.kda import keep_kda_states
from k3lab.model.model import KimiK3, compile_blocks
from k3lab.optim.assignment import build_optimizers
from k3lab.registry.train_spec import TrainSpec
from k3lab.runner.train.ddp import DDPOptions, wrap_ddp
from k3lab.runner.train.checks import check_seq_len, check_splits, check_vocab
from k3lab.runner.train.checkpoint import rng_state, save_checkpoint, set_rng_state
from k3lab.runner.train.graphs import GraphedStep, cuda_graph_blocker
from k3lab.runner.train.init import init_paired

FINISHED, DIVERGED = "finished", "diverged"
EAGER_STEPS_BEFORE_CAPTURE = 2  # kernels compiled and autotuned, allocator warm
# 2: MoE experts stored as (E, out, in) stacks, each a Muon parameter; 1 (no "format" key):
# one 2-D parameter per expert matrix
CHECKPOINT_FORMAT = 2


@attrs.define
class TrainResult:
    status: str  # "finished" or "diverged"
    step: int  # optimizer steps done
    tokens: int  # training tokens seen
    val_loss: float | None = None
    val_bpb: float | None = None
    train_loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    error: str | None = None
    startup_s: float | None = None
    counts: dict = attrs.Factory(dict)
    trained_tokens: int = 0  # tokens trained in this call (a resumed run counts from its checkpoint)
    train_seconds: float = 0.0  # time in training steps, evaluations excluded
    slot_wait_s: float = 0.0  # time waiting for a training slot (`fit`'s wait_to_train)

    @property
    def average_tokens_per_s(self) -> float | None:
        """The run's throughput: tokens trained / time training (`tokens_per_s` is the last window's)."""
        return self.trained_tokens / self.train_seconds if self.train_seconds > 0 else None


def lr_factor(step: int, spec: TrainSpec) -> float:
    """Multiplier of the base learning rate after `step` optimizer steps: linear warmup,
    then cosine decay to min_lr_ratio at spec.steps (or constant)."""
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    if spec.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps))
    return spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def initial_model(config: KimiK3Config, spec: TrainSpec, seed: int) -> KimiK3:
    """The model a trial of `seed` starts from, on the CPU in the spec's dtype; seeds the global
    generator with `seed` first (the draws of `KimiK3.__init__` come from it)."""
    torch.manual_seed(seed)
    model = KimiK3(config)
    if spec.init == "paired":  # the weights of shared modules alike across a seed's trials
        init_paired(model, seed)
    return model.to(dtype=getattr(torch, spec.dtype))


def use_deterministic_algorithms() -> None:
    """Every torch operation's deterministic algorithm, for this process (`train.deterministic`).
    New tensors are not filled with NaN first (torch's default in this mode): nothing in a step
    reads memory it has not written, and the fill would cost every allocation."""
    import torch.utils.deterministic

    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False


def model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of `model` (MoE bias and load statistics included), in order."""
    return [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def reset_in_place(optimizer: torch.optim.Optimizer) -> None:
    """Zero every state tensor of `optimizer` (moments, step counts) where it lies: the state a
    new optimizer starts from, at the addresses a captured CUDA graph updates."""
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                value.zero_()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of `tensor` over all ranks (a new tensor)."""
    tensor = tensor.clone()
    dist.all_reduce(tensor)
    return tensor / dist.get_world_size()


def keep_states_where_kda_is_fused(model: KimiK3, keep: bool, device: torch.device) -> bool:
    """Sets `train.kda_keep_states` on the model's fused KDA layers; whether it takes effect:
    only FLA's kernels on CUDA keep states (the CPU reference and chunkwise KDA have none)."""
    keep_kda_states(model, keep)
    return keep and device.type == "cuda" and model.config.kda_implementation == "fused"


class Trainer:
    """Model, optimizers, schedules and samplers of one trial, with their full state."""

    def __init__(self, config: KimiK3Config, spec: TrainSpec, seed: int = 0, device=None, dataset=None,
                 rank: int = 0, world_size: int = 1, progress: bool = False, ddp: DDPOptions = DDPOptions()):
        self.spec = spec
        self.device = resolve_device(device)
        config = self.config = config.resolve_kda(cuda=self.device.type == "cuda")
        if spec.deterministic:
            use_deterministic_algorithms()
        check_seq_len(config, spec)
        started = time.perf_counter()
        self.dataset = dataset or prepare_dataset(spec.dataset, spec.tokenizer, progress=progress)
        self.data_s = time.perf_counter() - started  # opening the prepared corpus: part of a trial's start-up
        check_vocab(config, self.dataset.vocab_size)
        check_splits(spec, self.dataset)
        self.model = initial_model(config, spec, seed).to(device=self.device)
        self.counts = count_parameters(self.model, spec.seq_len)
        self.model.checkpoint_layers = spec.activation_checkpointing
        self.kda_states_kept = keep_states_where_kda_is_fused(self.model, spec.kda_keep_states, self.device)
        if spec.compile:
            compile_blocks(self.model)
        self.distributed = world_size > 1
        self.forward = self.model
        if self.distributed:  # the process group is set up by the launcher (Ray Train, torchrun)
            self.forward = wrap_ddp(self.model, self.device, ddp)
        self.autocast = self._autocast_dtype()
        self.rank, self.world_size = rank, world_size
        self.tokens_per_step = spec.tokens_per_step * world_size  # global: all ranks together
        self.graph_blocker = self._graph_blocker()
        self.optimizers = build_optimizers(self.model, lr=spec.lr, muon_lr=spec.muon_lr,
                                           weight_decay=spec.weight_decay, capturable=self.graph_blocker is None,
                                           compile=spec.compile_muon)
        self._start_run(seed)
        self.graphed, self.cuda_graph = self._graphed_step()
        self.eager_steps = 0  # in this process: the graph is captured after EAGER_STEPS_BEFORE_CAPTURE
        self.restarted = False  # by `restart`: this trial took an earlier trial's model, compile and graph

    def _start_run(self, seed: int) -> None:
        """Fresh schedules and samplers for a run of `seed` from step 0 (the optimizers are built
        once, in `__init__`, and reset in place by `restart`)."""
        spec = self.spec
        self.seed = seed
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, spec))
                           for opt in self.optimizers]
        self.sampler = BatchSampler(self.dataset.train_tokens, spec.batch_size, spec.seq_len, seed=seed,
                                    rank=self.rank, world_size=self.world_size)
        self.val_sampler = BatchSampler(self.dataset.val_tokens, spec.batch_size, spec.seq_len, seed=seed,
                                        rank=self.rank, world_size=self.world_size)
        self.step = 0

    @torch.no_grad()
    def restart(self, seed: int) -> None:
        """Make this trainer a new trial of the same variant with `seed`, as if built anew: the
        starting weights a new Trainer of `seed` draws, copied into the model's own tensors, the
        optimizers' state zeroed where it lies (what new optimizers start from: the captured step
        updates it there), and fresh schedules and batches. The compiled blocks and the captured
        CUDA graph stay (they read the same tensors), so the new trial skips the model build, the
        compile and the capture: in a sweep, the next seed of a variant starts in about a second."""
        weights = initial_model(self.config, self.spec, seed)
        for target, source in zip(model_tensors(self.model), model_tensors(weights), strict=True):
            target.copy_(source)
        for optimizer in self.optimizers:
            reset_in_place(optimizer)
        self._start_run(seed)
        self.restarted = True

    def _graph_blocker(self) -> str | None:
        """Why this trial's step will not be captured as a CUDA graph, or None when it will."""
        if self.spec.cuda_graph is False:
            return "cuda_graph: false"
        return cuda_graph_blocker(self.device, self.spec.grad_accum, self.distributed)

    def _graphed_step(self) -> tuple[GraphedStep | None, str]:
        """The CUDA-graphed training step, or None, and what was decided ("on" / "off: why")."""
        if self.graph_blocker is not None:
            if self.spec.cuda_graph:
                warnings.warn(f"train.cuda_graph: running eagerly: {self.graph_blocker}")
            return None, f"off: {self.graph_blocker}"
        return GraphedStep(self.graph_step, self.model.parameters(), self.optimizers), "on"

    def execution(self) -> dict[str, str]:
        """How this trial runs, resolved for its device: logged with every trial."""
        resolved = {"kda_implementation": self.config.kda_implementation,
                    "cuda_graph": self.cuda_graph, "compile": str(self.spec.compile),
                    "kda_keep_states": str(self.kda_states_kept),
                    "trainer": "restarted" if self.restarted else "built"}
        if os.environ.get("TRITON_CACHE_DIR"):  # set by GPU sweeps for every trial and DDP worker
            resolved["kernel_cache"] = str(Path(os.environ["TRITON_CACHE_DIR"]).parent)
        return resolved

    def micro_batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.autocast_context():
            return self.forward(x, y, return_logits=False)[1]

    def _autocast_dtype(self) -> torch.dtype | None:
        """The spec's autocast dtype; unset means bf16 on CUDA and none on CPU."""
        if self.spec.autocast is not None:
            return getattr(torch, self.spec.autocast)
        return torch.bfloat16 if self.device.type == "cuda" else None

    def autocast_context(self):
        enabled = self.autocast is not None
        return torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=enabled)

    @property
    def warmed_up(self) -> bool:
        """Whether this process has compiled the step and captured its CUDA graph (where it has
        one): all that is left is training."""
        if self.graphed is not None:
            return self.graphed.graph is not None
        return self.eager_steps >= 1

    # -- one step -------------------------------------------------------------------

    def train_step(self) -> dict:
        """One optimizer step (with gradient accumulation). Returns device tensors, no host sync:
        train_loss, grad_norm, lr and the MoE loads ({layer: (E,)}) the biases were balanced on."""
        self.model.train()
        lr = self.schedulers[-1].get_last_lr()[0]
        values = None
        if self.graphed is not None and self.eager_steps >= EAGER_STEPS_BEFORE_CAPTURE:
            values = self.graphed_train_step()
        if values is None:
            values = self.eager_train_step()
        for scheduler in self.schedulers:
            scheduler.step()
        self.step += 1
        return values | {"lr": torch.tensor(lr)}

    def eager_train_step(self) -> dict:
        """Forward and backward of grad_accum micro-batches, then `update`."""
        total = torch.zeros((), device=self.device)
        for _ in range(self.spec.grad_accum):
            x, y = self.sampler.next_batch(self.device)
            loss = self.micro_batch_loss(x, y)
            (loss / self.spec.grad_accum).backward()
            total += loss.detach() / self.spec.grad_accum
        self.eager_steps += 1
        if self.graphed is None:
            values = self.update(total)
        else:  # the learning rates a replay reads: the same step before capture as after
            with self.graphed.device_learning_rates(), warnings.catch_warnings():
                # AdamW's advice for capturable optimizers never captured: this one will be
                warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True")
                values = self.update(total)
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        return values

    def graph_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        """The step a CUDA graph captures: forward and backward of one micro-batch, then `update`;
        the MoE loads come stacked (layers, E), one tensor to copy out of the graph."""
        loss = self.micro_batch_loss(x, y)
        loss.backward()
        values = self.update(loss.detach())
        values["loads"] = torch.stack(list(values["loads"].values())) if values["loads"] else None
        return values

    def graphed_train_step(self) -> dict | None:
        """The CUDA-graph replay of one step; None (and eager from now on) if the capture fails,
        with the reason in `cuda_graph` and a warning."""
        x, y = self.sampler.next_batch(self.device)
        try:
            values = self.graphed(x, y)
        except RuntimeError as error:  # e.g. an operation that cannot be captured
            self.graphed = None
            self.cuda_graph = f"off: capture failed: {str(error).splitlines()[0][:200]}"
            warnings.warn(f"train.cuda_graph: running eagerly: {self.cuda_graph}")
            self.sampler.step -= 1  # the eager step takes this batch again
            for optimizer in self.optimizers:
                optimizer.zero_grad(set_to_none=True)
            return None
        layers = [i for i, _ in self.model.moe_layers()]
        loads = values["loads"].clone().unbind(0) if layers else []  # the next replay overwrites them
        return {"train_loss": values["train_loss"].clone(), "grad_norm": values["grad_norm"].clone(),
                "loads": dict(zip(layers, loads))}

    def update(self, loss: torch.Tensor) -> dict:
        """After the backward: clip, both optimizers' steps and the MoE bias balancing."""
        if self.distributed:  # the logged loss and the MoE balancing see the global batch
            loss = all_reduce_mean(loss)
            for _, moe in self.model.moe_layers():
                dist.all_reduce(moe.load_counts)
                moe.score_quantiles.copy_(all_reduce_mean(moe.score_quantiles))
        clip = self.spec.grad_clip if self.spec.grad_clip is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        for optimizer in self.optimizers:
            optimizer.step()
        loads = self.model.update_moe_biases()
        return {"train_loss": loss, "grad_norm": grad_norm, "loads": loads}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean validation loss (nats/token) over the fixed eval windows, and bits per byte;
        as many batches as the spec gives this step (`TrainSpec.eval_batches_at`).

        Compiled blocks run eagerly here: the graphs torch.compile builds for a no-grad forward
        of the fused model gave wrong losses where the eager and the compiled training forward
        agreed on the same weights (docs/journal/sweep-ceiling.md has the run).
        """
        self.model.eval()
        losses = []
        with eager_if_compiled(self.model):
            for x, y in self.val_sampler.eval_batches(self.spec.eval_batches_at(self.step), self.device):
                with self.autocast_context():
                    _, loss = self.forward(x, y, return_logits=False)
                losses.append(loss.float())
        val_loss = torch.stack(losses).mean()
        val_loss = (all_reduce_mean(val_loss) if self.distributed else val_loss).item()
        return {"val_loss": val_loss, "val_bpb": self.dataset.bits_per_byte(val_loss)}

    # -- state ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "config": self.config.to_dict(),  # what the weights are: `k3lab export` rebuilds the model from it
            "model": self.model.state_dict(),
            "optimizers": [opt.state_dict() for opt in self.optimizers],
            "schedulers": [sched.state_dict() for sched in self.schedulers],
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        check_checkpoint_format(state)
        self.model.load_state_dict(state["model"])
        for opt, opt_state in zip(self.optimizers, state["optimizers"]):
            opt.load_state_dict(opt_state)  # new state tensors: a graph captured before cannot update them
        if self.graphed is not None and self.graphed.graph is not None:  # capture again, after eager steps
            (self.graphed, _), self.eager_steps = self._graphed_step(), 0
        for sched, sched_state in zip(self.schedulers, state["schedulers"]):
            sched.load_state_dict(sched_state)
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = state["step"]


def check_checkpoint_format(state: dict) -> None:
    """Refuse a format-1 MoE checkpoint: its optimizer state has one entry per expert matrix,
    which no longer lines up with the stacked experts (its weights alone still load)."""
    if state.get("format", 1) >= CHECKPOINT_FORMAT:
        return
    if any(".experts.w_" in key and key.rsplit(".", 1)[1].isdigit() for key in state["model"]):
        raise UserError("checkpoint: written by an older k3lab with one matrix per expert (format 1); its "
                        "optimizer state cannot resume a trial of this version -- rerun the trial "
                        "(its sweep again with --overwrite), or load only the weights with KimiK3.load_state_dict")


def save_trainer(trainer: Trainer, path: str | Path, extra: dict | None = None) -> None:
    save_checkpoint(trainer.state_dict() | {"extra": extra or {}}, path)
