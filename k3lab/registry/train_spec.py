"""`TrainSpec`: how one trial trains (optimiser, schedule, data, numerics), as validated data.

The `train:` section of a sweep file (`k3lab.registry`) and `k3lab train --set train.NAME=...`
both build one; the training loop (`k3lab.runner.train.trainer`) reads it.
"""

from __future__ import annotations

from typing import Any

import attrs

from k3lab.errors import FieldError
from k3lab.validators import non_empty, non_negative, one_of, positive, unit_interval

SCHEDULES = ("cosine", "constant")
INITS = ("paired", "sequential")  # k3lab.runner.train.init
DTYPES = ("float32", "bfloat16")
AUTOCAST_DTYPES = ("bfloat16", "float16")
DEFAULT_WARMUP_STEPS = 20  # clipped to `steps` when the file does not set warmup_steps


@attrs.frozen
class TrainSpec:
    """One training trial: optimiser, schedule, data and numerics.

    `lr` is the AdamW learning rate (embeddings, head, norms, gains, biases);
    `muon_lr` the Muon rate for hidden matrices, null meaning `lr` (Muon's
    update RMS is matched to AdamW's, see `k3lab.optim.assignment`).
    The schedule is linear warmup for `warmup_steps` (default 20, or `steps`
    when that is fewer), then `cosine` decay to `min_lr_ratio * lr` at `steps`,
    or `constant`. `dtype` is the parameter dtype; `autocast` (null, bfloat16,
    float16) the autocast dtype of the forward pass. `eval_interval` steps between evaluations of `eval_batches`
    validation batches; each evaluation is one Ray Tune report. `final_eval_batches` (null:
    `eval_batches`): the batches of the last evaluation, whose val_loss the verdicts compare,
    so that the curve's points can cost less GPU time than the answer's.
    `compile` torch.compiles the decoder blocks; `compile_muon` Muon's per-bucket steps too
    (`k3lab.optim.muon`): a few % shorter steps, for more compilation the first time a machine
    meets its matrix shapes, so it pays in long runs, or where the compiled graphs ship (the
    flagship's gpu profiles; docs/journal/kernel-headroom.md). `cuda_graph` captures the whole step
    (forward, backward, clipping, both optimizers, MoE bias update) as one CUDA graph (null:
    wherever it can run -- CUDA, no gradient accumulation, one process); `activation_checkpointing` recomputes each decoder layer in backward
    instead of storing its activations (less memory for large batches, ~1/3 more compute);
    `kda_keep_states` the other way round for FLA's KDA alone: its backward reads the chunk states
    the forward computed instead of recomputing them (more memory, less compute;
    `k3lab.model.kda.keep_kda_states`).
    `init`: `paired` draws each module's starting weights from (seed, its name), so trials
    of one seed start alike in every module they share (`k3lab.runner.train.init`); `sequential`
    draws the whole model from one stream seeded by the seed.
    `checkpoint_every`: a sweep's trial saves its checkpoint (crash recovery, `--resume`) at every
    Nth evaluation and at the last, and sends its metrics to MLflow with it; a crash then repeats at
    most N x eval_interval steps. Each checkpoint is the whole trainer state, written and then copied
    by Ray, while the trial's GPU share stands idle.
    `deterministic`: every torch operation uses its deterministic algorithm, so a trial on a GPU
    repeats itself to the last bit (cuDNN attention's backward in the MLA layers otherwise does
    not; docs/journal/determinism.md has how far apart two runs end); it costs step time.
    """

    steps: int = attrs.field(default=200, validator=positive)
    batch_size: int = attrs.field(default=8, validator=positive)
    seq_len: int = attrs.field(default=128, validator=positive)
    grad_accum: int = attrs.field(default=1, validator=positive)
    lr: float = attrs.field(default=3e-3, validator=positive)
    muon_lr: float | None = attrs.field(default=None, validator=positive)
    weight_decay: float = attrs.field(default=0.1, validator=non_negative)
    warmup_steps: int = attrs.field(default=attrs.Factory(lambda self: min(DEFAULT_WARMUP_STEPS, self.steps),
                                                          takes_self=True), validator=non_negative)
    schedule: str = attrs.field(default="cosine", validator=one_of(*SCHEDULES))
    min_lr_ratio: float = attrs.field(default=0.1, validator=unit_interval)
    grad_clip: float | None = attrs.field(default=1.0, validator=positive)
    eval_interval: int = attrs.field(default=50, validator=positive)
    eval_batches: int = attrs.field(default=8, validator=positive)
    final_eval_batches: int | None = attrs.field(default=None, validator=positive)
    checkpoint_every: int = attrs.field(default=1, validator=positive)
    dataset: str = attrs.field(default="stdlib", validator=non_empty)
    tokenizer: str = attrs.field(default="byte", validator=non_empty)
    compile: bool = False
    compile_muon: bool = False
    cuda_graph: bool | None = None
    activation_checkpointing: bool = False
    kda_keep_states: bool = False
    dtype: str = attrs.field(default="float32", validator=one_of(*DTYPES))
    autocast: str | None = attrs.field(default=None, validator=one_of(None, *AUTOCAST_DTYPES))
    log_interval: int = attrs.field(default=10, validator=positive)
    init: str = attrs.field(default="paired", validator=one_of(*INITS))
    deterministic: bool = False

    def __attrs_post_init__(self) -> None:
        if self.warmup_steps > self.steps:
            raise FieldError("warmup_steps", f"must not exceed steps={self.steps}, got {self.warmup_steps}")

    def default_notes(self, written: dict[str, Any]) -> tuple[str, ...]:
        """Defaults that were changed to fit the settings the user `written` (a train section)."""
        if "warmup_steps" not in written and self.warmup_steps < DEFAULT_WARMUP_STEPS:
            return (f"train.warmup_steps: the default {DEFAULT_WARMUP_STEPS} is clipped to steps={self.steps}",)
        return ()

    def stretched(self, scale: float) -> "TrainSpec":
        """The same training at `scale` times the token budget: steps and warmup scaled alike, so the
        learning-rate schedule keeps its shape over the longer (or shorter) run; evaluations stay
        every `eval_interval` steps. For a baseline's compute curve (`compute: {scales: [...]}`)."""
        steps = max(1, round(self.steps * scale))
        return attrs.evolve(self, steps=steps, warmup_steps=min(steps, round(self.warmup_steps * scale)))

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum

    @property
    def total_tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def eval_batches_at(self, step: int) -> int:
        """Validation batches of the evaluation at `step`: final_eval_batches at the last step."""
        return self.final_eval_batches if step >= self.steps and self.final_eval_batches else self.eval_batches

    def checkpoint_at(self, step: int) -> bool:
        """Whether the evaluation at `step` saves a checkpoint: every checkpoint_every-th, and the last."""
        return step >= self.steps or (step // self.eval_interval) % self.checkpoint_every == 0

    @property
    def num_evals(self) -> int:
        """Evaluations (Tune reports) in one trial: every eval_interval steps and
        after the last step."""
        return -(-self.steps // self.eval_interval)
