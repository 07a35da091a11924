"""`k3lab ui [STORE]`: the MLflow UI on a k3lab store, opening on the science.

STORE is a SQLite store (`mlflow.db`, the folder holding it, or a compressed `*.db.xz` such as
those in docs/runs, unpacked first into --unpack-dir: `k3lab.store.archive`); default
`--tracking-uri`, MLFLOW_TRACKING_URI or ./mlflow.db. Before the server starts, a local store gets
what the UI needs to show it (`k3lab.report.ui_store`: never in a sweep whose driver runs); then
`mlflow server --app-name k3lab` (`k3lab.ui_app`: MLflow's app, starting a new browser in the
"Model training" view) serves it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from k3lab.errors import UserError

APP_NAME, APP = "k3lab", "k3lab.ui_app:app"
from k3lab.store.archive import UI_CACHE  # noqa: E402  (where a *.db.xz is unpacked)


def register(subparsers: argparse._SubParsersAction) -> None:
    ui = subparsers.add_parser("ui", help="open the MLflow UI on a k3lab store (its artifacts and plots included)")
    ui.add_argument("store", nargs="?", help="mlflow.db, its folder, or a *.db.xz (default: --tracking-uri)")
    ui.add_argument("--tracking-uri", help="the store (default: MLFLOW_TRACKING_URI or ./mlflow.db)")
    ui.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    ui.add_argument("--port", type=int, default=5000, help="the server's port (default 5000)")
    ui.add_argument("--workers", type=int, help="server processes (default: MLflow's, 4)")
    ui.add_argument("--unpack-dir", help=f"where a *.db.xz is unpacked (default: {UI_CACHE}/<name>)")
    ui.add_argument("--no-prepare", action="store_true",
                    help="serve the store as it is: no artifact relocation, views or rebuilt reports")
    ui.set_defaults(func=run_ui)


def store_uri(args) -> str:
    """The tracking URI of the store the arguments name (a *.db.xz unpacked first)."""
    from k3lab.store.archive import store_tracking_uri
    from k3lab.store.state import tracking_uri_or_default

    if args.store is None:
        return tracking_uri_or_default(args.tracking_uri)
    return store_tracking_uri(args.store, args.unpack_dir)


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
        from k3lab.report.ui_store import prepare_store

        prepare_store(uri)
    command = server_command(args, uri)
    print(f"MLflow UI for {uri} at http://{args.host}:{args.port} (Ctrl-C to stop)", flush=True)
    os.execve(command[0], command, os.environ | app_entry_point())
