"""The sections of a sweep file as frozen, validated attrs classes.

`TrainSpec`, `MetricSpec`, `ResourceSpec`, `SchedulerSpec` and `MatchSpec`
are plain data with a sensible default for every field, so other parts of
k3lab (the training loop, Ray Tune orchestration) can build them directly;
`TrainSpec` has a module of its own, `k3lab.registry.train_spec`: the training loop reads it
without loading the sweep file parser.
Validators raise `FieldError`, which names the offending field.
`SweepSpec` is the whole file as written (before a profile is applied and
before the base model and the axes are resolved; see `k3lab.registry.sweep_file`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs

from k3lab.errors import FieldError
from k3lab.model.fidelity import FIDELITIES
from k3lab.report.stop_rule import DECIDED, HALFWIDTH, RULES
from k3lab.registry.train_spec import TrainSpec
from k3lab.validators import non_empty, non_negative, one_of, open_unit_interval, positive

METRIC_MODES = ("min", "max")
METRICS = ("val_loss", "val_bpb", "train_loss")  # what every trial reports at each evaluation
SCHEDULER_KINDS = ("none", "asha")
TIME_ATTRS = ("training_iteration", "tokens")
STRATEGIES = ("ddp",)
MATCH_BY = ("active_params", "total_params")
ADJUSTABLE_FIELDS = ("intermediate_size", "moe_intermediate_size", "moe_latent_size")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
NAME_MAX = 100  # a sweep's name is part of file names (its folder, state file, log), with suffixes
SEED_MAX = 2**31 - 1  # torch, numpy and the data sampler all take seeds 0 .. 2**31 - 1
DIVERGED_RISE = 0.2  # a metric 20% worse than the trial's own best: it blew up
SEEDS_POLICY_MAX = 1000  # seeds a policy may add per variant: more is a typo (and a long plan to list)
COMPUTE_SCALES_MAX = 8  # points of a baseline's compute curve: more is a typo (each is a whole trial per seed)


# -- sections -------------------------------------------------------------------


@attrs.frozen
class MetricSpec:
    """The metric the sweep optimises and compares, e.g. val_loss (min). `last`: the verdicts
    compare the mean of a trial's last N evaluations of it (1: the final value; with
    `train.final_eval_batches`, the N - 1 before the final one are over `eval_batches`).
    `margin`: differences within +/- margin x |the baseline's metric| do not matter (relative;
    a comparison whose interval lies inside is "equivalent"; none: no such verdict).
    `diverged`: a trial whose metric ends up more than this fraction worse than its own best so far
    (or is not finite) diverged, even if it trained every step, and enters no comparison."""

    name: str = attrs.field(default="val_loss", validator=one_of(*METRICS))
    mode: str = attrs.field(default="min", validator=one_of(*METRIC_MODES))
    last: int = attrs.field(default=1, validator=positive)
    margin: float | None = attrs.field(default=None,
                                       validator=attrs.validators.optional(open_unit_interval(" (relative)")))
    diverged: float | None = attrs.field(default=DIVERGED_RISE, validator=attrs.validators.optional(positive))


@attrs.frozen
class UntilSpec:
    """When a comparison has seeds enough: `decided` (better, worse, or equivalent within
    `metric.margin`; the default), `max` (never before max seeds), or `{halfwidth: h}` (its
    family-wise interval's half-width is at most h x |the baseline's metric|, e.g. 0.0025)."""

    rule: str = attrs.field(default=DECIDED, validator=one_of(*RULES))  # the sequential design's rules
    halfwidth: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(open_unit_interval(" (relative to the baseline's metric)")))

    def __attrs_post_init__(self) -> None:
        if (self.rule == HALFWIDTH) != (self.halfwidth is not None):
            raise FieldError("halfwidth", "goes with until: {halfwidth: H} and only there")


@attrs.frozen
class SeedsSpec:
    """`seeds: {start: 4, max: 16, until: decided}`: seeds first .. first + max - 1, every variant
    starting with `start` of them, more added while a comparison is not yet as `until` asks (see
    `k3lab.runner.tune.seeds`); `confidence` is family-wise."""

    start: int = attrs.field(default=3)
    max: int = attrs.field(default=16)
    until: UntilSpec = attrs.field(factory=UntilSpec)
    first: int = attrs.field(default=0, validator=non_negative)
    confidence: float = attrs.field(default=0.95, validator=open_unit_interval())
    looks: tuple[int, ...] | None = attrs.field(default=None, converter=lambda v: None if v is None else tuple(v))

    @start.validator
    def _check_start(self, attribute, value) -> None:
        if value < 2:
            raise FieldError(attribute.name, f"must be at least 2 (one pair gives no interval), got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.max < self.start:
            raise FieldError("max", f"must be at least start={self.start}, got {self.max}")
        if self.max > SEEDS_POLICY_MAX:
            raise FieldError("max", f"must be at most {SEEDS_POLICY_MAX} seeds, got {self.max}")
        if self.looks is not None:
            self._check_looks()
        if self.first + self.max - 1 > SEED_MAX:
            raise FieldError("first", f"its seeds {self.first} .. {self.first + self.max - 1} must stay at most "
                                      f"{SEED_MAX}")

    def _check_looks(self) -> None:
        """`looks: [6, 7, 8, 10, 12, 16]`: rising seed counts from `start` to `max`, 3 or more each, with `until: decided`."""
        looks = list(self.looks)
        if not looks or looks != sorted(set(looks)) or looks[0] != self.start or looks[-1] != self.max:
            raise FieldError("looks", f"must rise from start={self.start} to max={self.max}, got {looks}")
        if looks[0] < 3:
            raise FieldError("looks", f"must start at 3 seeds or more (a t-test needs 2 degrees of freedom), "
                                      f"got {looks}")
        if self.until.rule != DECIDED:
            raise FieldError("looks", "go with until: decided only")

    @property
    def seeds(self) -> tuple[int, ...]:
        """Every seed the policy may use, in the order it uses them."""
        return tuple(range(self.first, self.first + self.max))


DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def duration_seconds(value: float | str) -> float | None:
    """30m, 1h30m, 90s, 2h or a number of seconds -> seconds; None when it is none of those."""
    if isinstance(value, (int, float)):
        return float(value)
    match = DURATION.match(value.strip())
    if not value.strip() or match is None or not any(match.groups()):
        return None
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return 3600 * hours + 60 * minutes + seconds


@attrs.frozen
class BudgetSpec:
    """How much a sweep with a seeds policy may spend: `wall` (30m, 1h30m, 90s or seconds: no
    trial starts once the time left is shorter than a typical trial), `trials` (at most this
    many trials in all). `tokens_per_s`: the sweep's measured aggregate throughput, only for the
    plan's worst-case time."""

    wall: float | str | None = attrs.field(default=None)
    trials: int | None = attrs.field(default=None, validator=positive)
    tokens_per_s: float | None = attrs.field(default=None, validator=positive)

    @wall.validator
    def _check_wall(self, attribute, value) -> None:
        if value is None:
            return
        seconds = duration_seconds(value)
        if seconds is None or seconds <= 0:
            raise FieldError(attribute.name,
                             f"expected a duration such as 30m, 1h30m or 90s (or seconds), got {value!r}")

    @property
    def wall_s(self) -> float | None:
        return None if self.wall is None else duration_seconds(self.wall)


@attrs.frozen
class ComputeSpec:
    """What the variants are worth in compute (`k3lab.report.compute_multipliers`). `scales: [1.25, 1.6, 2.0]`:
    the baseline of every group also trains at these multiples of the file's token budget (steps,
    warmup and decay stretched alike; same seeds and data order), and each variant's multiplier is
    the baseline compute that reaches its loss, over its own. `sizes: AXIS` with `at: FLOPS`: the
    axis that sets the model's size; each variant's loss is fitted against compute over the sizes,
    and its multiplier is read at that training compute (as the AttnRes paper reads its own)."""

    scales: tuple[float, ...] = attrs.field(default=(), converter=tuple)
    sizes: str | None = attrs.field(default=None, validator=attrs.validators.optional(non_empty))
    at: float | None = attrs.field(default=None, validator=attrs.validators.optional(positive))

    @scales.validator
    def _check_scales(self, attribute, value) -> None:
        if len(value) > COMPUTE_SCALES_MAX:
            raise FieldError(attribute.name, f"must list at most {COMPUTE_SCALES_MAX} multiples, got {len(value)}")
        for i, scale in enumerate(value):
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 100:
                raise FieldError(f"{attribute.name}[{i}]", f"must be a number in (0, 100], got {scale!r}")
            if scale == 1:
                raise FieldError(f"{attribute.name}[{i}]", "must not be 1: the baseline itself is the curve's 1x")
        if len(set(value)) != len(value):
            raise FieldError(attribute.name, f"must not repeat a multiple, got {list(value)}")

    def __attrs_post_init__(self) -> None:
        if not self.scales and self.sizes is None:
            raise FieldError("scales", "must list at least one multiple of the token budget, e.g. [1.5, 2.0] "
                                       "(or set sizes: AXIS and at: FLOPS)")
        if (self.sizes is None) != (self.at is None):
            raise FieldError("at" if self.sizes is not None else "sizes",
                             "goes with sizes: AXIS and at: FLOPS, the training compute to read the multiplier at")


@attrs.frozen
class ResourceSpec:
    """Resources per trial. `gpu` may be fractional (0.5: two trials share a GPU)
    and above 1 must be whole. Multi-GPU trials set `gpus_per_trial` and
    `strategy: ddp`, which then replaces `gpu`. `max_concurrent_trials` null
    lets Ray Tune run as many trials as resources allow. `reuse_actors` runs the next
    trial in the process of one that ended (Ray Tune's option): imports, the CUDA context
    and in-memory kernel caches are kept, so start-up is shorter. `training_slots` lets at
    most that many of the trials on one GPU (or one CPU host) train at once; the others do
    their start-up and wait for a slot (`k3lab.runner.runtime.slots`). `mps`: trials that share a GPU run
    their kernels side by side through an MPS daemon of the sweep's own (`k3lab.runner.runtime.mps`);
    unset, wherever it can; true, or the sweep stops before it starts; false, in turns."""

    cpu: float = attrs.field(default=1.0, validator=positive)
    gpu: float = attrs.field(default=0.0, validator=non_negative)
    max_concurrent_trials: int | None = attrs.field(default=None, validator=positive)
    gpus_per_trial: int | None = attrs.field(default=None, validator=positive)
    strategy: str | None = attrs.field(default=None, validator=one_of(None, *STRATEGIES))
    reuse_actors: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    training_slots: int | None = attrs.field(default=None, validator=positive)
    mps: bool | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool)))

    def __attrs_post_init__(self) -> None:
        if self.gpu > 1 and self.gpu != int(self.gpu):
            raise FieldError("gpu", f"must be at most 1 or a whole number, got {self.gpu}")
        if self.strategy is not None and self.gpus_per_trial is None:
            raise FieldError("gpus_per_trial", f"must be set with strategy: {self.strategy}")
        if self.gpus_per_trial is not None and self.strategy is None:
            raise FieldError("strategy", "must be set (ddp) with gpus_per_trial")
        if self.reuse_actors and self.strategy is not None:  # Ray cannot hand a running Train job to the next trial
            raise FieldError("reuse_actors", f"must be false with strategy: {self.strategy}")
        if self.training_slots is not None:
            self._check_training_slots()
        if self.mps and not self.shares_a_gpu:
            raise FieldError("mps", f"needs trials that share a GPU (gpu between 0 and 1, no strategy), got gpu: "
                                    f"{self.gpu:g}" + (f", strategy: {self.strategy}" if self.strategy else ""))

    @property
    def shares_a_gpu(self) -> bool:
        """Trials take part of one GPU each, so several run on it at once."""
        return self.strategy is None and 0 < self.gpu < 1

    def _check_training_slots(self) -> None:
        """Slots are per GPU (per host on CPU): they must be fewer than the trials that share one."""
        if self.strategy is not None:  # a DDP trial holds whole GPUs
            raise FieldError("training_slots", f"must be unset with strategy: {self.strategy}")
        if self.gpu >= 1:
            raise FieldError("training_slots", f"needs trials that share a GPU (gpu below 1), got gpu: {self.gpu:g}")
        sharing = [("max_concurrent_trials", self.max_concurrent_trials)] if self.max_concurrent_trials else []
        if self.gpu > 0:
            sharing.append((f"gpu: {self.gpu:g}", math.floor(1 / self.gpu + 1e-9)))
        if sharing:
            why, most = min(sharing, key=lambda item: item[1])
            if self.training_slots >= most:
                raise FieldError("training_slots", f"must be fewer than the {most} trials that can share a GPU "
                                                   f"({why}), or no trial waits; got {self.training_slots}")

    def tune_resources(self) -> dict[str, float]:
        """The `tune.with_resources` mapping for one trial."""
        gpu = self.gpus_per_trial if self.gpus_per_trial is not None else self.gpu
        return {"cpu": self.cpu, "gpu": gpu}


@attrs.frozen
class SchedulerSpec:
    """The trial scheduler: `none` (every trial runs to the end) or `asha`.

    `time_attr` is `training_iteration` (Tune reports, one per evaluation) or
    `tokens` (training tokens seen). `max_t` null means the whole trial:
    `TrainSpec.num_evals` reports or `TrainSpec.total_tokens` tokens; see
    `resolved`. A sweep file may write just `scheduler: asha`.
    """

    kind: str = attrs.field(default="none", validator=one_of(*SCHEDULER_KINDS))
    max_t: int | None = attrs.field(default=None, validator=positive)
    grace_period: int = attrs.field(default=1, validator=positive)
    reduction_factor: float = attrs.field(default=2.0)
    time_attr: str = attrs.field(default="training_iteration", validator=one_of(*TIME_ATTRS))

    @reduction_factor.validator
    def _check_reduction(self, attribute, value) -> None:
        if not value > 1:
            raise FieldError(attribute.name, f"must be above 1, got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.max_t is not None and self.grace_period > self.max_t:
            raise FieldError("grace_period", f"must not exceed max_t={self.max_t}, got {self.grace_period}")

    def resolved(self, train: TrainSpec) -> "SchedulerSpec":
        """A copy with `max_t` filled in from the training spec when null."""
        if self.max_t is not None:
            return self
        max_t = train.num_evals if self.time_attr == "training_iteration" else train.total_tokens
        return attrs.evolve(self, max_t=max_t, grace_period=min(self.grace_period, max_t))


@attrs.frozen
class MatchSpec:
    """Parameter matching: resize `adjust` in every variant until its `by` count
    lies within `tolerance` (relative) of the base model's."""

    by: str = attrs.field(default="active_params", validator=one_of(*MATCH_BY))
    tolerance: float = attrs.field(default=0.02, validator=open_unit_interval())
    adjust: str = attrs.field(default="intermediate_size", validator=one_of(*ADJUSTABLE_FIELDS))


@attrs.frozen
class BaseSpec:
    """The base model: a preset name or a model YAML path (relative to the sweep
    file), or neither (KimiK3Config defaults), then a fidelity's choices
    (`k3lab.model.fidelity`: design, k3, kimi_linear), then field overrides. Written
    as `base: tiny` or `base: {preset: tiny, fidelity: k3, num_layers: 8}`."""

    preset: str | None = None
    fidelity: str | None = attrs.field(default=None, validator=one_of(None, *FIDELITIES))
    overrides: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen
class SweepSpec:
    """A sweep file as written; `profiles` stay raw partial documents."""

    name: str = attrs.field()
    base: BaseSpec = attrs.field()
    description: str = ""
    axes: dict[str, Any] = attrs.Factory(dict)
    variants: list[Any] = attrs.Factory(list)
    seeds: list[int] | SeedsSpec = attrs.field(factory=lambda: [0])  # a list, or a policy (SeedsSpec)
    baseline: Any = attrs.field(default=None)  # a variant name, or {axis: value} (null: see `Sweep.baseline`)
    budget: BudgetSpec | None = None  # with a seeds policy only
    train: TrainSpec = TrainSpec()
    metric: MetricSpec = MetricSpec()
    resources: ResourceSpec = ResourceSpec()
    scheduler: SchedulerSpec = SchedulerSpec()
    match: MatchSpec | None = None
    compute: ComputeSpec | None = None  # the baselines' compute curves (`compute: {scales: [...]}`)
    kernel_cache: str | None = None  # GPU kernel cache folder; null: $K3LAB_KERNEL_CACHE or ~/.cache/k3lab/kernels
    profiles: dict[str, Any] = attrs.Factory(dict)

    @name.validator
    def _check_name(self, attribute, value) -> None:
        if not NAME_PATTERN.match(value):
            raise FieldError(attribute.name, f"must be letters, digits, '_', '.' or '-', got {value!r}")
        if len(value) > NAME_MAX:
            raise FieldError(attribute.name, f"must be at most {NAME_MAX} characters (it names files), "
                                             f"got {len(value)}")

    @property
    def seed_policy(self) -> SeedsSpec | None:
        """The seeds policy (`seeds: {start, max, until}`), or None for a list of seeds."""
        return self.seeds if isinstance(self.seeds, SeedsSpec) else None

    @property
    def all_seeds(self) -> tuple[int, ...]:
        """Every seed the sweep may use: the list, or every seed of the policy."""
        return self.seeds.seeds if isinstance(self.seeds, SeedsSpec) else tuple(self.seeds)

    @seeds.validator
    def _check_seeds(self, attribute, value) -> None:
        if isinstance(value, SeedsSpec):
            return
        if not value:
            raise FieldError(attribute.name, "must list at least one seed")
        if len(set(value)) != len(value):
            raise FieldError(attribute.name, f"must not repeat a seed, got {value}")
        bad = next((i for i, seed in enumerate(value) if not 0 <= seed <= SEED_MAX), None)
        if bad is not None:
            raise FieldError(f"{attribute.name}[{bad}]", f"must be 0 .. {SEED_MAX}, got {value[bad]}")

    @baseline.validator
    def _check_baseline(self, attribute, value) -> None:
        if value is not None and not isinstance(value, (str, dict)):
            raise FieldError(attribute.name, f"expected a variant name or a mapping of axis names to values, "
                                             f"got {type(value).__name__} {value!r}")
        if isinstance(value, dict) and not value:
            raise FieldError(attribute.name, "must name at least one axis value")

    def __attrs_post_init__(self) -> None:
        if self.budget is not None and not isinstance(self.seeds, SeedsSpec):
            raise FieldError("budget", "needs a seeds policy (seeds: {start: ..., max: ...}), not a list of seeds")
        if self.compute is not None and self.metric.mode != "min":
            raise FieldError("compute", "needs a metric that falls with compute (metric.mode: min, a loss), got "
                                        f"mode {self.metric.mode}")
        if isinstance(self.seeds, SeedsSpec) and self.scheduler.kind != "none":
            raise FieldError("scheduler", f"must be none with a seeds policy (a trial that {self.scheduler.kind} "
                                          f"stops early has no final metric to compare), got {self.scheduler.kind}")
        evaluations = -(-self.train.steps // self.train.eval_interval)  # every eval_interval steps, and the last
        if self.metric.last > evaluations:
            raise FieldError("metric.last", f"must be at most the {evaluations} evaluation(s) a trial makes "
                                            f"(train.steps {self.train.steps}, train.eval_interval "
                                            f"{self.train.eval_interval}), got {self.metric.last}")
