"""Where a sweep runs and logs (`SweepRun`), and the checks on its folders before it starts.

    <storage>/<experiment>/           Ray Tune's experiment directory (fixed name, so --resume works)
    <storage>/<experiment>.k3lab.json the sweep's MLflow parent run id, for --resume (`k3lab.store.state`)
    <storage>/<experiment>.ddp/       Ray Train's run folders of the DDP trials
    <storage>/<experiment>.log        Ray's and MLflow's notices (on the terminal with --verbose)
    <storage>/<experiment>.lock       while it runs: its lock, with the driver's PID (`k3lab.runner.runtime.lock`)
    <storage>/<experiment>.ray.json   while it runs: the processes of its local Ray instance (`k3lab.runner.runtime.reaper`)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import attrs

from k3lab import hints
from k3lab.errors import UserError
from k3lab.registry import Sweep
from k3lab.registry.sweep_file import profile_option
from k3lab.runner.runtime.kernel_cache import resolve_kernel_cache
from k3lab.runner.runtime.lock import lock_file
from k3lab.runner.runtime.memory import Packing
from k3lab.runner.runtime.reaper import record_file
from k3lab.store.state import check_parent_run, first_difference, read_state, state_file, sweep_spec


@attrs.define
class SweepRun:
    """Where a sweep runs and logs."""

    sweep: Sweep
    storage: Path
    tracking_uri: str
    address: str | None = None
    resume: bool = False
    overwrite: bool = False
    max_failures: int = 2
    max_concurrent: int | None = None  # overrides the sweep file's resources.max_concurrent_trials
    kernel_cache_dir: str | None = None  # --kernel-cache; else the sweep file's, $K3LAB_KERNEL_CACHE, ~/.cache
    command: str = ""  # the command line that ran it, recorded on the parent run for reports
    resume_command: str = ""  # what continues it, as `k3lab sweep` prints it when stopped (default: `hint`'s)
    verbose: bool = False  # Ray's and MLflow's notices on the terminal instead of in `log_file`
    packing: Packing | None = None  # trials at once per GPU from their measured memory (`k3lab.runner.runtime.memory`)
    started: float = attrs.Factory(time.time)  # when its command started: its part's time counts from here

    @property
    def experiment(self) -> str:
        return self.sweep.name if self.sweep.profile is None else f"{self.sweep.name}-{self.sweep.profile}"

    @property
    def tune_dir(self) -> Path:
        return self.storage / self.experiment

    @property
    def state_file(self) -> Path:
        return state_file(self.storage, self.experiment)

    def parent_run_id(self) -> str:
        """The MLflow parent run of this sweep's earlier run (its state file must exist)."""
        return read_state(self.state_file, again=self.hint("sweep", overwrite=True))["parent_run_id"]

    @property
    def ddp_dir(self) -> Path:
        """Ray Train's run folders of this sweep's DDP trials (Train resumes from them)."""
        return self.storage / f"{self.experiment}.ddp"

    @property
    def kernel_cache(self) -> Path:
        return resolve_kernel_cache(self.kernel_cache_dir, self.sweep.kernel_cache)

    @property
    def uses_gpus(self) -> bool:
        resources = self.sweep.resources
        return (resources.gpus_per_trial or resources.gpu or 0) > 0

    @property
    def shares_gpus(self) -> bool:
        """Its trials take part of a GPU each, several on one (`k3lab.runner.runtime.mps`)."""
        return self.uses_gpus and self.sweep.resources.shares_a_gpu

    @property
    def ray_record(self) -> Path:
        """The processes of the sweep's local Ray instance, kept by its watchdog (`k3lab.runner.runtime.reaper`)."""
        return record_file(self.storage, self.experiment)

    @property
    def lock_file(self) -> Path:
        """Held while the sweep runs: one sweep of an experiment at a time (`k3lab.runner.runtime.lock`)."""
        return lock_file(self.storage, self.experiment)

    @property
    def log_file(self) -> Path:
        return self.storage / f"{self.experiment}.log"

    @property
    def on_cluster(self) -> bool:
        """The trials run on a Ray cluster (--address or RAY_ADDRESS), not on this machine."""
        return bool(self.address or os.environ.get("RAY_ADDRESS"))

    def hint(self, verb: str, **flags) -> str:
        """`k3lab VERB FILE --option value ... --flag` for a user to run next (`k3lab.hints`), with the
        options that point it at this sweep's store from the current folder, then `flags`."""
        return hints.command(verb, self.sweep.path, **self.pointing_options(verb), **flags)

    def pointing_options(self, verb: str) -> dict[str, str | None]:
        """--profile, --storage, --tracking-uri (and for `sweep`, --address), each where leaving it
        out would name another profile, folder, store or cluster (environment variables included,
        which another shell may not have)."""
        options = {"profile": profile_option(self.sweep),
                   "storage": None if self.storage == Path("k3lab_runs") else str(self.storage),
                   "tracking_uri": None if self.tracking_uri == local_tracking_uri() else self.tracking_uri}
        if verb == "sweep":
            options["address"] = self.address or os.environ.get("RAY_ADDRESS") or None
        return options


def check_options(max_concurrent: int | None, max_failures: int, resume: bool, overwrite: bool) -> None:
    """`k3lab sweep`'s options that say how it runs, each in its range, and not both --resume and --overwrite."""
    if max_concurrent is not None and max_concurrent < 1:
        raise UserError(f"--max-concurrent must be at least 1, got {max_concurrent}")
    if max_failures < 0:
        raise UserError(f"--max-failures must be 0 or more (retries of a crashed trial), got {max_failures}")
    if resume and overwrite:  # --overwrite would delete the very state --resume continues
        raise UserError("--resume and --overwrite: pass one (--resume continues the earlier run, --overwrite "
                        "discards it)")


def next_steps(run: SweepRun) -> str:
    """What to run after a sweep has ended: its report again, and the MLflow UI on its store (with
    the options that point at them from this folder)."""
    uri = run.tracking_uri
    if uri.startswith(("http://", "https://")):
        ui = f"open {uri} in a browser"
    else:
        ui = f"`{hints.command('ui', tracking_uri=None if uri == local_tracking_uri() else uri)}` opens it in MLflow"
    return f"next: `{run.hint('report')}` prints this report again, {ui}"


def local_tracking_uri() -> str:
    """The tracking store of a command run here without --tracking-uri or MLFLOW_TRACKING_URI."""
    return f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


def check_where(run: SweepRun) -> None:
    """What is checked with the experiment's lock held, before anything starts: the experiment
    folder (`check_experiment_dir`) and, on a cluster, that its Ray head answers."""
    check_experiment_dir(run)
    if run.on_cluster:
        check_ray_address(run.address or os.environ["RAY_ADDRESS"], "--address" if run.address else "RAY_ADDRESS")


def check_parent(run: SweepRun, say=print) -> None:
    """--resume, once the preflight found the tracking server answering: the earlier run's parent
    run is in the store (`check_parent_run`), and trials whose checkpoints were lost start again
    (`start_lost_trials_again`)."""
    if run.resume:
        check_parent_run(run.state_file, run.tracking_uri, run.hint("sweep", overwrite=True))
        start_lost_trials_again(run, say=say)


RAY_ADDRESS_TIMEOUT_S = 3.0


def check_ray_address(address: str, named_by: str) -> None:
    """A Ray head answers at HOST:PORT (or ray://HOST:PORT) within RAY_ADDRESS_TIMEOUT_S; ray.init
    would raise a traceback for a malformed address and retry an unanswered one for minutes.
    `auto` (a cluster of this machine, found by Ray) is left to Ray."""
    import socket

    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"{named_by} {address}: expected HOST:PORT (the Ray head's port, 6379 by default), "
                        "ray://HOST:10001 or auto")
    try:
        socket.create_connection((host, int(port)), timeout=RAY_ADDRESS_TIMEOUT_S).close()
    except OSError as error:
        raise UserError(f"{named_by} {address}: no Ray head answers there ({error.strerror or error})") from None


def check_experiment_dir(run: SweepRun) -> None:
    """A fixed directory per sweep: refuse to mix a new sweep into an old one by accident."""
    exists = run.tune_dir.exists() or run.state_file.exists()
    check_started(run)
    if run.resume and not (run.tune_dir.exists() and run.state_file.exists()):
        raise UserError(f"--resume: no earlier run of {run.experiment} under {run.storage}")
    if run.resume:
        state = read_state(run.state_file, again=run.hint("sweep", overwrite=True))
        check_same_spec(run, state.get("spec"))  # first: it names the field that changed
        saved = state.get("trials")
        if saved is not None and sorted(saved) != sorted(t.id for t in run.sweep.trials):
            raise UserError(f"--resume: {run.sweep.path} no longer describes the trials of the run under "
                            f"{run.tune_dir} (variants or seeds changed): `{run.hint('sweep', overwrite=True)}` "
                            "starts it again")
        check_tune_folder(run)
    if exists and not run.resume and not run.overwrite:
        raise UserError(f"{run.tune_dir} exists from an earlier run: `{run.hint('sweep', resume=True)}` "
                        f"continues it, `{run.hint('sweep', overwrite=True)}` starts it again")


def check_started(run: SweepRun) -> None:
    """A state file without the Tune folder is a run killed between writing the two, before any
    trial started: nothing to resume, and nothing that --resume would continue (it said "no earlier
    run", a plain run that the missing folder exists)."""
    if run.state_file.exists() and not run.tune_dir.exists() and not run.overwrite:
        raise UserError(f"{run.state_file}: the earlier run of {run.experiment} was stopped before any trial "
                        f"started (no {run.tune_dir}): `{run.hint('sweep', overwrite=True)}` starts it again")


def check_same_spec(run: SweepRun, saved: dict | None) -> None:
    """--resume: the sweep file trains and measures its trials as the earlier run did (`sweep_spec`);
    otherwise the resumed trials would run with other settings than the finished ones, in one report
    under the parent run's old params. A state file without a spec (older k3lab) is not checked."""
    if saved is None:
        return
    changed = first_difference(saved, sweep_spec(run.sweep))
    if changed:
        field, old, new = changed
        raise UserError(f"--resume: {run.sweep.path} changed {field} from {json.dumps(old)} to {json.dumps(new)} "
                        f"since the run under {run.tune_dir}: restore it, or `{run.hint('sweep', overwrite=True)}` "
                        "starts it again")


def check_tune_folder(run: SweepRun) -> None:
    """--resume: what `Tuner.restore` reads is there: tuner.pkl (all `Tuner.can_restore` checks) and
    the newest experiment_state-*.json, with its trials. Without them the restore failed after Ray
    started and the parent run was reopened (FileNotFoundError, KeyError 'trial'), leaving it FAILED."""
    folder = run.tune_dir

    def damaged(what: str) -> UserError:
        return UserError(f"--resume: {folder} is not a resumable Ray Tune experiment ({what}): "
                         f"`{run.hint('sweep', overwrite=True)}` starts it again")

    tuner = folder / "tuner.pkl"
    if not tuner.is_file() or tuner.stat().st_size == 0:
        raise damaged(f"{tuner.name} is {'empty' if tuner.is_file() else 'missing'}")
    states = sorted(folder.glob("experiment_state-*.json"))  # Tune restores the newest: the greatest name
    if not states:
        raise damaged("no experiment_state-*.json")
    try:
        state = json.loads(states[-1].read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise damaged(f"{states[-1].name} is not JSON") from None
    if not isinstance(state, dict) or not isinstance(state.get("trial_data"), list) or not state["trial_data"]:
        raise damaged(f"{states[-1].name} lists no trials")


def lost_checkpoints(tune_dir: Path) -> list[tuple[str, Path]]:
    """The checkpoint folders that the newest experiment state of an unfinished trial names and
    that are gone (deleted by hand, a cleaned disk): Tune's restore of such a trial fails at every
    `--resume` ("Could not recover from checkpoint as it does not exist on storage anymore").
    Returns (the trial's name, the folder) of each."""
    states = sorted(tune_dir.glob("experiment_state-*.json"))
    if not states:
        return []
    lost = []
    try:
        for trial, runtime in json.loads(states[-1].read_text()).get("trial_data", []):
            trial, runtime = (json.loads(part) if isinstance(part, str) else part for part in (trial, runtime))
            result = runtime.get("last_result") or {}
            name = result.get("checkpoint_dir_name")
            folders = sorted(tune_dir.glob(f"*_{trial.get('trial_id')}_*"))
            if name and not result.get("done") and folders and not (folders[0] / name).exists():
                lost.append((f"{result.get('variant', trial.get('trial_id'))}-s{result.get('seed', '?')}",
                             folders[0] / name))
    except (OSError, ValueError, TypeError, AttributeError):  # a state of another shape: Tune's restore says
        return []
    return lost


def start_lost_trials_again(run: SweepRun, say=print) -> None:
    """--resume: a trial whose checkpoint is gone (`lost_checkpoints`) starts again from its first
    step; an empty folder stands in for the checkpoint, which its trial reads as none (`load_ray_checkpoint`)."""
    for trial, folder in lost_checkpoints(run.tune_dir):
        folder.mkdir()
        say(f"{trial}: its checkpoint {folder} is gone: the trial starts again from its first step")


def discard_earlier_run(run: SweepRun) -> None:
    """--overwrite, once the new sweep has passed every check: remove the old run's folders."""
    for folder in (run.tune_dir, run.ddp_dir):
        shutil.rmtree(folder, ignore_errors=True)
    run.state_file.unlink(missing_ok=True)
