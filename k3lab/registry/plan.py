"""The plan of a sweep: the lines `k3lab variants`, `k3lab sweep --dry-run` and `k3lab sweep`
all print first, so a preview and the run it previews read the same.

    attnres_block (cpu profile): 5 variants x 1 seeds = 5 trials, 100 steps of 1,024 tokens
    not run: attnres_bs2_2 (duplicate of attnres_bs2)
    note: train.warmup_steps: the default 20 is clipped to steps=10
"""

from __future__ import annotations

import math

from k3lab.hints import command
from k3lab.registry.sweep_file import Sweep, profile_option
from k3lab.registry.model_variants import DUPLICATE
from k3lab.report.stop_rule import DECIDED, HALFWIDTH


def profile_label(sweep: Sweep) -> str:
    """'cpu profile', or 'top-level settings' when no profile applies."""
    return f"{sweep.profile} profile" if sweep.profile else "top-level settings"


def plan_header(sweep: Sweep) -> str:
    """One line: the sweep, its profile, variants x seeds = trials, and the length of a trial
    (the points of a compute curve are counted as variants here; `compute_lines` names them)."""
    if sweep.adaptive:
        policy = sweep.seed_policy
        return (f"{sweep.name} ({profile_label(sweep)}): {len(sweep.valid_variants)} variants x {policy.start} to "
                f"{policy.max} seeds = {len(sweep.valid_variants) * policy.start} to {len(sweep.trials)} trials, "
                f"{sweep.train.steps} steps of {sweep.train.tokens_per_step:,} tokens")
    return (f"{sweep.name} ({profile_label(sweep)}): {len(sweep.valid_variants)} variants x {len(sweep.seeds)} "
            f"seeds = {len(sweep.trials)} trials, {sweep.train.steps} steps of {sweep.train.tokens_per_step:,} tokens")


def compute_lines(sweep: Sweep) -> list[str]:
    """The baselines' compute curves: which trials they add and how long those train."""
    lines = []
    for baseline, points in sweep.compute_curves.items():
        steps = ", ".join(f"{name} {round(scale * sweep.train.steps)}" for name, scale in points.items())
        lines.append(f"compute curve: {baseline} also at {', '.join(f'{s:g}x' for s in points.values())} its tokens "
                     f"(steps: {steps}), with its seeds, for the compute multipliers")
    sizes = sweep.compute_sizes
    if sizes:
        pairs = ", ".join(f"{family} against {baseline}" for family, baseline in sizes["baselines"].items())
        lines.append(f"compute across sizes: each family's loss fitted against compute over its {sizes['axis']} "
                     f"values, the multiplier read at {sizes['at']:.3g} FLOPs ({pairs})")
    extra = [t for t in sweep.trials if t.variant.stretches]
    if extra:
        tokens = sum(sweep.train_of(t.variant).total_tokens for t in extra)
        lines.append(f"compute curve trials: {len(extra)}{' at most' if sweep.adaptive else ''}, {tokens:,} tokens, "
                     f"{100 * tokens / trial_tokens(sweep):.0f}% of the sweep's")
    return lines


def trial_tokens(sweep: Sweep) -> int:
    """Tokens every trial of the sweep trains together (a compute curve's trials train longer)."""
    return sum(sweep.train_of(trial.variant).total_tokens for trial in sweep.trials)


def plan_lines(sweep: Sweep, measured: dict[str, float] | None = None) -> list[str]:
    """The header, every variant the plan drops and why, the seeds policy and its worst case (a
    sweep with `seeds: {start, max, ...}`), a final evaluation larger than the others, the
    baselines by group, data that trials would repeat,
    then a note for every default adapted to the file's settings."""
    lines = [plan_header(sweep)] + dropped_lines(sweep) + compute_lines(sweep) + policy_lines(sweep, measured)
    lines += evaluation_lines(sweep)
    lines += checkpoint_lines(sweep)
    lines += group_lines(sweep)
    return lines + [f"note: {note}" for note in (*sweep.notes, *data_notes(sweep))]


def evaluation_lines(sweep: Sweep) -> list[str]:
    """Where the last evaluation is larger than the others (`train.final_eval_batches`): what each costs."""
    train = sweep.train
    if train.final_eval_batches in (None, train.eval_batches):
        return []
    return [f"evaluations: {train.num_evals} per trial (every {train.eval_interval} steps) on {train.eval_batches} "
            f"validation batches, the last on {train.final_eval_batches} (the val_loss the verdicts compare)"]


def checkpoint_lines(sweep: Sweep) -> list[str]:
    """Where trials checkpoint at fewer evaluations than all (`train.checkpoint_every`): what a crash repeats."""
    train = sweep.train
    if train.checkpoint_every == 1 or train.num_evals == 1:
        return []
    every = train.checkpoint_every * train.eval_interval
    return [f"checkpoints: every {every} steps (every {ordinal(train.checkpoint_every)} evaluation) and after the "
            f"last; a crashed trial trains up to {min(every, train.steps)} steps again"]


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


MAX_DROPPED_LINES = 10


def dropped_lines(sweep: Sweep, limit: int = MAX_DROPPED_LINES) -> list[str]:
    """One line per variant the sweep file describes but the plan does not run (a duplicate of an
    earlier variant, or rejected by the model's validation), with the reason `k3lab variants` gives."""
    dropped = [v for v in sweep.variants if not v.ok]
    lines = [f"not run: {v.name} ({v.reason if v.status == DUPLICATE else f'{v.status}: {v.reason}'})"
             for v in dropped[:limit]]
    if len(dropped) > limit:
        lines.append(f"not run: {len(dropped) - limit} more ({variants_command(sweep)} lists every variant)")
    return lines


def variants_command(sweep: Sweep) -> str:
    """`k3lab variants` of this sweep under its profile (`k3lab.hints`)."""
    return command("variants", sweep.path, profile=profile_option(sweep))


def looks_rule(policy, comparisons: int, metric: str, margin: float | None) -> str:
    """A looks design in words, with the pair spread its margin needs at `max` (item: equivalence
    a researcher can reach)."""
    from k3lab.report.sequential import Design
    from k3lab.report.stats import t_quantile

    design = Design(comparisons, policy.max, policy.start, policy.confidence, margin=margin,
                    looks=policy.looks).calibrated()
    rule = (f"then looks at {', '.join(map(str, policy.looks[1:]))} seeds; at each look the family is decided "
            f"together ({design.label}); a comparison not decided runs on to the next look, up to {policy.max}")
    if margin is None:
        return rule
    n = policy.max
    needs = [100 * margin * math.sqrt(n) / t_quantile(1 - design.levels[m - 1][-1] / 2, n - 1)
             for m in (comparisons, 1)]
    return (f"{rule}; equivalent within +/-{100 * margin:g}% of the baseline's {metric} needs, at a true difference "
            f"of 0 and {n} pairs, a pair spread (sd) under {needs[0]:.3g}% of the baseline's {metric} "
            f"({needs[1]:.3g}% once it is the last comparison open)")


def policy_lines(sweep: Sweep, measured: dict[str, float] | None = None) -> list[str]:
    """The seeds policy, the budget, and the worst-case trial count, tokens and time; measured:
    {GPU model: the sweep's aggregate tokens/s measured there} (`k3lab.runner.runtime.throughput`), which
    the file's budget.tokens_per_s overrides."""
    policy = sweep.seed_policy
    if policy is None:
        return []
    comparisons = len(sweep.baselines)
    metric = sweep.metric.name
    if sweep.metric.last != 1:
        metric = f"mean of the last {sweep.metric.last} {metric}"
    family = (f"family-wise {100 * policy.confidence:g}% repeated t-interval over {comparisons} "
              f"comparison{'s' if comparisons != 1 else ''}, valid at every look up to {policy.max} pairs")
    until, margin = policy.until, sweep.metric.margin
    if until.rule == HALFWIDTH:
        rule = (f"then a seed pair at a time for each comparison whose {family} is wider than "
                f"{100 * until.halfwidth:g}% of the baseline's {metric}, the widest first, up to {policy.max}")
    elif policy.looks is not None:
        rule = looks_rule(policy, comparisons, metric, margin)
    elif until.rule == DECIDED:
        equivalent = (f", equivalent where it lies inside +/-{100 * margin:g}% of the baseline's {metric}"
                      if margin is not None else "")
        rule = (f"then a seed pair at a time for each comparison not yet decided, the widest first, up to "
                f"{policy.max} (until decided: better or worse where its {family} on {metric} excludes 0"
                f"{equivalent})")
    else:
        rule = f"then seed pairs up to {policy.max} for every comparison ({family} on {metric}), the widest first"
    budget = sweep.budget
    limits = []
    if budget and budget.wall is not None:
        limits.append(f"wall {budget.wall}")
    if budget and budget.trials is not None:
        limits.append(f"{budget.trials} trials")
    lines = [f"seeds: {policy.start} per variant (seeds {policy.first}..{policy.first + policy.start - 1}), {rule}; "
             f"budget: {', '.join(limits) if limits else 'none'}"]
    worst = len(sweep.trials)
    tokens = trial_tokens(sweep)
    rate = budget.tokens_per_s if budget else None
    if rate:
        time = f"about {_minutes(tokens / rate)} at {rate:,.0f} tokens/s (budget.tokens_per_s)"
    elif measured:
        rate = min(measured.values())
        time = "; ".join(f"about {_minutes(tokens / r)} on {gpu} ({r:,.0f} tokens/s, measured by a sweep of these "
                         "trials there)" for gpu, r in sorted(measured.items()))
    else:
        time = ("not known (no sweep of these trials measured on a GPU yet; budget.tokens_per_s, the sweep's "
                "aggregate tokens/s, would give it)")
    capped = ""
    if budget and budget.trials is not None and budget.trials < worst:
        capped = f"; the budget stops it at {budget.trials} trials"
    if budget and budget.wall_s is not None and (not rate or tokens / rate > budget.wall_s):
        capped += f"; the wall budget ({budget.wall}) may stop it first"
    return lines + [f"worst case: {worst} trials, {tokens:,} tokens; time {time}{capped}"]


def group_lines(sweep: Sweep) -> list[str]:
    """The baseline the variants are compared with, or with `baseline: {axis: value}` (or two axes
    and no `baseline:`) which baseline each group is compared with."""
    if not sweep.baseline_axes:
        return [f"baseline: {sweep.baseline}"] if len(sweep.valid_variants) > 1 else []
    wanted = ", ".join(f"{k}={v}" for k, v in sweep.baseline_axes.items())
    groups = sorted(set(sweep.baselines.values()), key=list(sweep.baselines.values()).index)
    lines = [f"baselines: {wanted} in each group of the other axes' values ({len(groups)} group"
             f"{'s' if len(groups) != 1 else ''}: {', '.join(groups)})"]
    by_name = {v.name: v for v in sweep.variants}
    axes = {axis.name for axis in sweep.axes}
    outside = [name for name in sweep.baselines if set(by_name[name].overrides) != axes]
    if outside:  # explicit variants, in no group of the axes
        lines.append(f"baseline: {sweep.baseline} for {', '.join(outside)} (in no group of the axes)")
    return lines


def data_notes(sweep: Sweep) -> list[str]:
    """A note when one trial would train on more tokens than the corpus' training split has."""
    from k3lab.data.epochs import train_split_tokens

    known = train_split_tokens(sweep.train.dataset, sweep.train.tokenizer)
    if known is None:
        return []
    tokens, exact = known
    epochs = sweep.train.total_tokens / tokens if tokens else float("inf")
    if epochs <= (1 if exact else 0.9):  # an estimate (data not prepared yet) may be ~10% off
        return []
    about, verb = ("", "repeat") if exact else ("about ", "may repeat")
    return [f"data: a trial trains {sweep.train.total_tokens:,} tokens, {about}{epochs:.2f} epochs of "
            f"{sweep.train.dataset}'s {about}{tokens:,} training tokens: the trials {verb} data "
            "(train.dataset: packages is larger)"]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
