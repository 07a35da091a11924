"""`k3lab ui [STORE]`: the MLflow UI on a k3lab store, opening on the science.

STORE is a SQLite store (`mlflow.db`, the folder holding it, or a compressed `*.db.xz` such as
those in docs/runs, unpacked first into --unpack-dir); default `--tracking-uri`, MLFLOW_TRACKING_URI
or ./mlflow.db. Before the server starts, a local store is made to show what it holds:

- its artifact locations (absolute paths in the database) point at the `mlartifacts/` beside it,
  so a store copied from another machine shows its artifacts (`relocate_store_artifacts`);
- a sweep whose parent run has no report artifacts (a store copied without `mlartifacts/`) gets
  its report rebuilt from the store and logged to the parent run (plots, summary.json), and one
  reported before k3lab wrote its verdicts into the store gets them (`k3lab.report.ui_verdicts`:
  the differences from the baselines the view's first chart draws);
- sweeps recorded before k3lab wrote the UI's current view and descriptions, or whose verdicts
  were just written, get them (`k3lab.store.views.present_earlier_sweeps`);

then `mlflow server --app-name k3lab` (`k3lab.commands.ui_app`: MLflow's app, starting a new
browser in the "Model training" view) serves it.
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import sys
import tempfile
from pathlib import Path

from k3lab.errors import UserError

APP_NAME, APP = "k3lab", "k3lab.commands.ui_app:app"
UI_CACHE = Path(os.environ.get("K3LAB_UI_DIR") or Path.home() / ".cache" / "k3lab" / "ui")  # unpacked stores


def register(subparsers: argparse._SubParsersAction) -> None:
    ui = subparsers.add_parser("ui", help="open the MLflow UI on a k3lab store (its artifacts and plots included)")
    ui.add_argument("store", nargs="?", help="mlflow.db, its folder, or a *.db.xz (default: --tracking-uri)")
    ui.add_argument("--tracking-uri", help="the store (default: MLFLOW_TRACKING_URI or ./mlflow.db)")
    ui.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    ui.add_argument("--port", type=int, default=5000, help="the server's port (default 5000)")
    ui.add_argument("--workers", type=int, help="server processes (default: MLflow's, 4)")
    ui.add_argument("--unpack-dir", help=f"where a *.db.xz is unpacked (default: {UI_CACHE}/<name>)")
    ui.add_argument("--no-prepare", action="store_true",
                    help="serve the store as it is: no artifact relocation, no views or rebuilt reports")
    ui.set_defaults(func=run_ui)


def store_uri(args) -> str:
    """The tracking URI of the store the arguments name (a *.db.xz unpacked first)."""
    from k3lab.store.state import tracking_uri_or_default

    if args.store is None:
        return tracking_uri_or_default(args.tracking_uri)
    path = Path(args.store)
    if path.is_dir():
        path = path / "mlflow.db"
    if not path.exists():
        raise UserError(f"{args.store}: no such store")
    if path.name.endswith(".xz"):
        name = path.name.removesuffix(".xz").removesuffix(".db")
        path = unpack(path, Path(args.unpack_dir) if args.unpack_dir else UI_CACHE / name)
    return f"sqlite:///{path.resolve()}"


def unpack(archive: Path, folder: Path) -> Path:
    """`folder`/mlflow.db from a compressed store, kept while it is newer than the archive (it
    then keeps what was added to it: rebuilt reports, views saved in the UI)."""
    database = folder / "mlflow.db"
    if database.exists() and database.stat().st_mtime >= archive.stat().st_mtime:
        return database
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--unpack-dir {folder}: is a file, not a folder")
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with lzma.open(archive) as source, tempfile.NamedTemporaryFile(dir=folder, delete=False) as target:
            shutil.copyfileobj(source, target)
    except (lzma.LZMAError, EOFError) as error:  # nothing left behind: the partial file, the folder made for it
        Path(target.name).unlink(missing_ok=True)
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        raise UserError(f"{archive}: not a complete .xz archive ({error})") from None
    os.replace(target.name, database)
    print(f"unpacked {archive} to {database}")
    return database


def prepare_store(tracking_uri: str, say=print) -> None:
    """What a local store needs before the UI shows it (see the module docstring)."""
    from k3lab.store.tracking import artifact_folder_for, relocate_store_artifacts
    from k3lab.store.views import present_earlier_sweeps

    moved = relocate_store_artifacts(tracking_uri)
    if moved:
        say(f"pointed {moved} runs' artifact locations at {artifact_folder_for(tracking_uri)}")
    rebuilt = rebuild_missing_reports(tracking_uri)
    for parent_run_id, name in rebuilt:
        say(f"rebuilt the report of {name} (parent run {parent_run_id}) from the store into its artifacts")
    recorded = record_missing_verdicts(tracking_uri)
    if recorded:
        say(f"wrote the verdicts and differences from the baselines of {len(recorded)} sweeps into the store")
    presented = present_earlier_sweeps(tracking_uri, refresh={run_id for run_id, _ in rebuilt} | set(recorded))
    if presented:
        say(f"added the current loss view and descriptions to {presented} sweeps")


def rebuild_missing_reports(tracking_uri: str) -> list[tuple[str, str]]:
    """Log a report (plots, summary.json) to every sweep's parent run that has none."""
    from k3lab.report.summary import build_report, stored_options
    from k3lab.store import runs

    client = runs.client(tracking_uri)
    rebuilt = []
    for parent in runs.sweep_runs(tracking_uri):
        run_id = parent.info.run_id
        try:
            if client.list_artifacts(run_id, "report"):
                continue
        except Exception:  # an artifact location this machine cannot read: nothing to add to
            continue
        trials = runs.trial_runs(tracking_uri, run_id)
        if not trials:
            continue
        with tempfile.TemporaryDirectory() as folder:
            summary = build_report(tracking_uri, run_id, out_dir=Path(folder),
                                   **(stored_options(tracking_uri, run_id) or options_of_old_store(parent, trials)))
            for path in summary["files"]:
                client.log_artifact(run_id, str(path), "report")
        rebuilt.append((run_id, client.get_experiment(parent.info.experiment_id).name))
    return rebuilt


def record_missing_verdicts(tracking_uri: str) -> list[str]:
    """Write the verdicts (`k3lab.report.ui_verdicts`) of every sweep with a trial that has no outcome
    tag (reported before k3lab wrote them); returns their parent run ids."""
    from k3lab.report.summary import build_report, stored_options
    from k3lab.store import runs
    from k3lab.store.verdicts import OUTCOME

    recorded = []
    for parent in runs.sweep_runs(tracking_uri):
        run_id = parent.info.run_id
        trials = runs.trial_runs(tracking_uri, run_id)
        if trials and any(OUTCOME not in t.data.tags for t in trials):
            build_report(tracking_uri, run_id, **(stored_options(tracking_uri, run_id) or
                                                  options_of_old_store(parent, trials)))
            recorded.append(run_id)
    return recorded


def options_of_old_store(parent, trials: list) -> dict:
    """`build_report` options for a store from before sweeps stored their design: its metric, every
    variant against its one recorded baseline (family-wise Bonferroni t-intervals), variants sorted
    with the baseline first. `k3lab report` with the sweep file stores the file's design instead."""
    from k3lab.store import runs

    baseline = parent.data.tags.get("k3lab.baseline") or None
    metric, _, mode = parent.data.params.get("metric", "val_loss:min").partition(":")
    names = sorted({runs.variant_of(t) for t in trials}, key=lambda n: (n != baseline, n))
    return {"metric": metric, "mode": mode or "min", "baseline": baseline if baseline in names else None,
            "variant_order": names}


def app_entry_point() -> dict[str, str]:
    """Environment for `mlflow server --app-name k3lab`: where k3lab is not installed (or installed
    from another checkout, without the entry point), a dist-info folder that declares it."""
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="mlflow.app") if e.name == APP_NAME]
    paths = [str(Path(__file__).resolve().parents[2])]  # this k3lab first, in the server's processes too
    if not found or found[0].value != APP:
        shim = UI_CACHE / "entry-point"
        info = shim / "k3lab_ui_app-0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: k3lab-ui-app\nVersion: 0\n")
        (info / "entry_points.txt").write_text(f"[mlflow.app]\n{APP_NAME} = {APP}\n")
        paths.insert(0, str(shim))
    return {"PYTHONPATH": os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])}


def server_command(args, uri: str) -> list[str]:
    mlflow = shutil.which("mlflow") or str(Path(sys.executable).parent / "mlflow")
    if not Path(mlflow).exists():
        raise UserError("the mlflow command is not installed in this environment")
    command = [mlflow, "server", "--app-name", APP_NAME, "--backend-store-uri", uri,
               "--host", args.host, "--port", str(args.port)]
    return command + (["--workers", str(args.workers)] if args.workers else [])


def check_address(host: str, port: int) -> None:
    """The server can listen at host:port: a port in range, free, on an address of this machine
    (MLflow's server prints its own error there and still exits 0)."""
    import socket

    if not 1 <= port <= 65535:
        raise UserError(f"--port: must be 1 .. 65535, got {port}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's own socket
            probe.bind((host, port))
    except OSError as error:
        raise UserError(f"--host {host} --port {port}: the UI cannot listen there ({error.strerror or error})") from None


def run_ui(args) -> int:
    from k3lab.store.tracking import holds_mlflow_runs, sqlite_path

    uri = store_uri(args)
    if uri.startswith(("http://", "https://")):
        raise UserError(f"--tracking-uri {uri} is already a server: open it in a browser")
    database = sqlite_path(uri)
    if database is not None and not database.exists():
        raise UserError(f"{database}: no such store")
    if database is not None and not holds_mlflow_runs(database):
        raise UserError(f"{database}: not an MLflow store (no MLflow tables in it)")
    check_address(args.host, args.port)
    if not args.no_prepare and sqlite_path(uri) is not None:
        prepare_store(uri)
    command = server_command(args, uri)
    print(f"MLflow UI for {uri} at http://{args.host}:{args.port} (Ctrl-C to stop)", flush=True)
    os.execve(command[0], command, os.environ | app_entry_point())
