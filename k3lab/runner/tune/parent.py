"""A sweep's parent MLflow run: created by the first run, reopened by `--resume`, never left RUNNING.

    with ParentRun(run) as parent:      # creates or reopens the run
        record_sweep(run, parent)       # first run only: params, sweep file, state file
        ...                             # trials, report
        parent.status = "FAILED"        # when trials failed (default FINISHED)

However the block ends, the run ends with it: with `status`, or KILLED on Ctrl-C
(or SIGTERM while Ray runs), or FAILED on any other exception. It logs the wall
time of this invocation (from its command's start, `SweepRun.started`): `sweep_wall_s` for the
first run, `resume_wall_s` (step 1, 2, ... per resume) for each `--resume`, so the first run's time
is kept (a first run killed before its end gets it from its last beat when resumed), and
`sweep_parts_wall_s` / `sweep_parts`: the wall time of every invocation so far, summed,
and how many there were (a sweep run in parts, as on preemptible nodes, took that long).
While it runs, each invocation also keeps its time so far in the tag `k3lab.part_wall_s.<part>`
(0 for the first run), rewritten every PART_BEAT_S seconds (`PartClock`), so a part that never
reached its end (`kill -9`, a lost machine) still counts, up to its last beat.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from pathlib import Path

import attrs

import k3lab
from k3lab.report.efficiency import crashes, figures_of, sweep_efficiency, time_shares
from k3lab.report.stop_rule import BUDGET, STOPPED
from k3lab.report.summary import SweepReport, build_report
from k3lab.store import runs
from k3lab.store.runs import write_design
from k3lab.store.state import sweep_spec, write_state
from k3lab.store.tracking import MLflowTracker, flatten, relocate_artifacts
from k3lab.store.views import present_sweep
from k3lab.runner.tune.run import SweepRun
from k3lab.runner.tune.seeds import report_options
from k3lab.runner.tune.system import SweepSystemMetrics
from k3lab.runner.tune.trial import value_params


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(k3lab.__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


PART_WALL = "sweep_part_wall_s"  # stores from before PART_BEAT: a part's wall time so far, at step = its number
PART_BEAT = "k3lab.part_wall_s"  # the tag PART_BEAT.<part>: a running part's wall time so far, rewritten
PART_BEAT_S = 5.0  # how often a running part writes it
PART_WALLS = ("sweep_wall_s", "resume_wall_s", PART_WALL)  # what earlier parts logged of their time


class PartClock:
    """Writes the tag `PART_BEAT`.<part> for one part of a sweep, at its start and every `every`
    seconds, on a thread of its own (with its own client) until `stop`; a failed write is skipped.
    A tag, rewritten, not a metric: a metric's history would hold a point per beat at one step."""

    def __init__(self, tracking_uri: str, run_id: str, part: int, started: float, every: float = PART_BEAT_S):
        self.client, self.run_id, self.part, self.started = runs.client(tracking_uri), run_id, part, started
        self.stopped = threading.Event()
        self.beat()
        self.thread = threading.Thread(target=self.loop, args=(every,), name="k3lab-part-clock", daemon=True)
        self.thread.start()

    def beat(self) -> None:
        with contextlib.suppress(Exception):  # the store busy or gone: the next beat, or the part's end, counts
            self.client.set_tag(self.run_id, f"{PART_BEAT}.{self.part}", f"{time.time() - self.started:.3f}")

    def loop(self, every: float) -> None:
        while not self.stopped.wait(every):
            self.beat()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


def earlier_parts(history: dict[str, list], tags: dict[str, str] | None = None) -> dict[int, float]:
    """part -> its wall time, from the metric histories of `PART_WALLS` (what a part logged at its
    end: `sweep_wall_s` for part 0, `resume_wall_s` at step N for part N) and the parent's
    `PART_BEAT` tags (a part's last beat, for a part that never reached its end)."""
    walls: dict[int, float] = {}
    for metrics in history.values():
        for metric in metrics:
            walls[metric.step] = max(walls.get(metric.step, 0.0), metric.value)
    for key, value in (tags or {}).items():
        part = key.removeprefix(PART_BEAT + ".")
        if part != key and part.isdigit():
            walls[int(part)] = max(walls.get(int(part), 0.0), float(value))
    return walls


class ParentRun:
    """The parent run of one invocation of a sweep (see the module docstring)."""

    def __init__(self, run: SweepRun):
        self.run = run
        self.status = "FINISHED"
        self.tracker: MLflowTracker | None = None
        self.started = 0.0
        self.earlier: dict[int, float] = {}  # earlier parts' wall times, by part
        self.clock: PartClock | None = None
        self.system: SweepSystemMetrics | None = None

    @property
    def part(self) -> int:
        """This invocation's part: 0 for the first run, then one more than any earlier part."""
        return max(self.earlier, default=-1) + 1

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def __enter__(self) -> "ParentRun":
        self.started = self.run.started
        # a store copied from another folder or machine first gets its artifact locations moved here
        relocate_artifacts(self.run.tracking_uri, self.run.experiment)
        if self.run.resume:
            self.tracker = MLflowTracker(self.run.tracking_uri, self.run.parent_run_id())
            self.tracker.client.update_run(self.run_id, status="RUNNING")
            history = {name: self.tracker.client.get_metric_history(self.run_id, name) for name in PART_WALLS}
            self.earlier = earlier_parts(history, self.tracker.client.get_run(self.run_id).data.tags)
            if not history["sweep_wall_s"] and 0 in self.earlier:  # the first run never reached its end
                self.tracker.log_metrics({"sweep_wall_s": self.earlier[0]}, step=0)
            self.tracker.set_tags(runs.reopen_tags())  # this process drives it now (it may have been interrupted)
            record_resume_command(self.tracker, self.run.command)
        else:
            self.tracker = create_parent_run(self.run)
            present(self.run, self.run_id)
        self.clock = PartClock(self.run.tracking_uri, self.run_id, self.part, self.started)
        self.system = SweepSystemMetrics(self.run.tracking_uri, self.run_id, lambda: self.parts_wall_s()[0])
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        self.clock.stop()
        with contextlib.suppress(Exception):  # the GPUs' busy share of this part, at its step
            self.tracker.log_metrics(self.system.stop(), step=self.part)
        if error is None:
            self.end(self.status)
            return False
        # Ctrl-C, SIGTERM (Ray's driver turns it into SystemExit) or --stop-after: stopped from outside
        stopped = isinstance(error, (KeyboardInterrupt, SystemExit))
        resumable = stopped and self.run.state_file.exists() and self.run.tune_dir.exists()
        with contextlib.suppress(Exception):  # the sweep's own error is the one to show
            self.end_unfinished_trials()
        with contextlib.suppress(Exception):  # the verdicts so far, in the store as at a sweep's end
            write_report(self.run, self, STOPPED)
        with contextlib.suppress(Exception):
            # a resumable stop is no failure: FINISHED (MLflow's UI draws KILLED as a red cross), tagged stopped
            self.end("FINISHED" if resumable else "KILLED" if stopped else "FAILED",
                     runs.STOPPED if resumable else None)
        return False

    def end_unfinished_trials(self) -> None:
        """Trial runs a stopped sweep leaves RUNNING (Ray kills their processes) end KILLED;
        `--resume` reopens them."""
        for trial in runs.trial_runs(self.run.tracking_uri, self.run_id, running_only=True):
            self.tracker.client.set_terminated(trial.info.run_id, "KILLED")

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.tracker.log_metrics(metrics, step=0)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.tracker.log_artifact(path, artifact_path)

    def parts_wall_s(self, this_part_s: float | None = None) -> tuple[float, int]:
        """(seconds, count) of every invocation of this sweep so far, this one (default: up to
        now) included."""
        this_part_s = time.time() - self.started if this_part_s is None else this_part_s
        return sum(self.earlier.values()) + this_part_s, len(self.earlier) + 1

    def end(self, status: str, state: str | None = None) -> None:
        """Log this invocation's wall time and close the run with `status` (`state` STOPPED: stopped
        and resumable, so its description and `k3lab.status` say so)."""
        wall = time.time() - self.started
        total, parts = self.parts_wall_s(wall)
        self.tracker.log_metrics({"sweep_parts_wall_s": total, "sweep_parts": float(parts)}, step=0)
        if self.run.resume:
            self.tracker.log_metrics({"resume_wall_s": wall}, step=self.part)
        else:
            self.tracker.log_metrics({"sweep_wall_s": wall}, step=0)
        with contextlib.suppress(Exception):  # what ran; the UI's links to every trial: not worth failing for
            record_what_ran(self.run, self.run_id, final=state is None and status == "FINISHED")
            present(self.run, self.run_id, state)
        self.tracker.set_tags(runs.end_tags(state or status))
        self.tracker.finish(status)


def present(run: SweepRun, parent_run_id: str, state: str | None = None) -> None:
    """The sweep in the MLflow UI: its experiment's loss view and description, the parent's
    description with links to its trials (and, `state` interrupted, what to do), a colour per
    variant (`k3lab.store.views`)."""
    sweep = run.sweep
    axis_params = list(value_params(axis.name for axis in sweep.axes).values())
    present_sweep(run.tracking_uri, parent_run_id, axis_params=axis_params,
                  metric=sweep.metric.name, variant_order=[v.name for v in sweep.valid_variants],
                  description=sweep.description, title=sweep_title(run), state=state,
                  next_steps=(run.resume_command or run.hint("sweep", resume=True), run.hint("report", close=True)))


def sweep_title(run: SweepRun) -> str:
    sweep = run.sweep
    return f"k3lab sweep {sweep.name}" + (f" ({sweep.profile} profile)" if sweep.profile else "")


def create_parent_run(run: SweepRun) -> MLflowTracker:
    sweep = run.sweep
    tags = runs.sweep_tags(sweep.name, sweep.profile, k3lab.__version__, git_commit(), sweep.description,
                           run.command, sweep.baseline)
    return MLflowTracker.start(run.tracking_uri, run.experiment, run.experiment, tags=tags)


def record_resume_command(tracker: MLflowTracker, command: str) -> None:
    """Add the command of a resume to the parent's `k3lab.resumed_with` tag (one line each)."""
    earlier = tracker.client.get_run(tracker.run_id).data.tags.get(runs.RESUMED_WITH)
    tracker.set_tags(runs.resume_tags(earlier, command))


def record_sweep(run: SweepRun, parent: ParentRun) -> None:
    """The sweep's params and file on the parent run, and the state file `--resume` reads."""
    sweep = run.sweep
    params = {"sweep": sweep.name, "profile": sweep.profile, "planned.seeds": list(sweep.seeds),
              "planned.variants": len(sweep.valid_variants), "planned.trials": len(sweep.trials),
              "metric": f"{sweep.metric.name}:{sweep.metric.mode}"}  # what ran: `record_what_ran`
    resources = attrs.evolve(sweep.resources,  # --max-concurrent, as the trials ran
                             max_concurrent_trials=run.max_concurrent or sweep.resources.max_concurrent_trials)
    params |= flatten("train", attrs.asdict(sweep.train)) | flatten("resources", attrs.asdict(resources))
    params |= flatten("scheduler", attrs.asdict(sweep.scheduler))
    if sweep.compute is not None:
        params["compute.scales"] = list(sweep.compute.scales)
    parent.tracker.log_params(params)
    write_design(run.tracking_uri, parent.run_id, report_options(sweep).to_record())
    parent.log_artifact(sweep.path)
    write_state(run.state_file, parent.run_id, run.tracking_uri, [t.id for t in sweep.trials], sweep_spec(sweep))


def record_sharing(parent: ParentRun, sharing: str | None) -> None:
    """How the trials shared a GPU ("mps", or why not), on the parent run; nothing where none was shared."""
    if sharing is not None:
        parent.tracker.set_tags({runs.GPU_SHARING: sharing})


def write_report(run: SweepRun, parent: ParentRun, unfinished: str) -> SweepReport:
    """The sweep's report (`k3lab.report.summary.build_report`) with its verdicts written into the
    store for the MLflow UI, its files logged to the parent run; at the sweep's end and when it is
    stopped (`unfinished`: why its comparisons have no more seeds), so that a plain `mlflow ui` on
    the store shows the verdicts without k3lab in between."""
    report = build_report(run.tracking_uri, parent.run_id, report_options(run.sweep),
                          out_dir=run.storage / f"{run.experiment}_report", unfinished=unfinished)
    for path in report.files:
        parent.log_artifact(path, "report")
    return report


def record_what_ran(run: SweepRun, parent_run_id: str, final: bool) -> None:
    """What ran of the plan (the params `planned.*`): the tag `k3lab.ran` at every part's end
    ("31 of 80 planned trials: ..."), and at the sweep's end the params `trials`, `seeds` and
    `variants` of the trials that ran (params cannot change, so only once)."""
    trials = runs.trial_runs(run.tracking_uri, parent_run_id)
    client = runs.client(run.tracking_uri)
    client.set_tag(parent_run_id, runs.RAN, runs.ran_line(trials, len(run.sweep.trials)))
    if final:
        for key, value in runs.ran_params(trials).items():
            client.log_param(parent_run_id, key, value)


def report_sweep(run: SweepRun, parent: ParentRun, hardware: dict) -> SweepReport:
    """The sweep's report (`k3lab.report.summary`), its files logged to the parent run, and the
    sweep's efficiency (tokens/s, MFU, warm-up and start-up) logged and added to it."""
    report = write_report(run, parent, BUDGET)  # the trials ran to the sweep's end
    wall_s, parts = parent.parts_wall_s()  # a resumed sweep: over every part, summed
    trials = runs.trial_runs(run.tracking_uri, parent.run_id)
    efficiency = sweep_efficiency(figures_of(trials), wall_s, hardware["gpus"], hardware.get("device_name"),
                                  hardware.get("seconds", 0.0)) | {"sweep_parts": parts}
    efficiency |= time_shares(run.tracking_uri, trials, wall_s) | crashes(trials)
    logged_by_end = {"sweep_wall_s", "sweep_parts"} | ({"kernel_warmup_s"} if run.resume else set())
    parent.log_metrics({k: v for k, v in efficiency.items() if k not in logged_by_end})
    return attrs.evolve(report, efficiency=efficiency)
