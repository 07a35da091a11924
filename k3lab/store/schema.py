"""A new local store's tables, made ahead of need: `StoreAhead`.

Opening a SQLite tracking store that does not exist yet makes MLflow create its tables and run
its schema migrations (2 s on a 2-core machine, more on a GPU host's slower cores), and a sweep
opens its store only after Ray has started and shown that one trial fits the cluster, so that a
sweep refused there leaves no store behind. `StoreAhead` makes those tables in a file of its own
on a thread while Ray starts, and `install()` moves the file into place once the sweep goes on;
`discard()` removes it when the sweep stops first. Nothing is written where the store goes
before `install()`.

    ahead = StoreAhead(tracking_uri)   # the thread starts; nothing to do for a server or an existing file
    ...                                # Ray starts, checks pass
    ahead.install()                    # mlflow.db in place with MLflow's tables (or left as it is)
    ahead.discard()                    # in a `finally`: removes what was not installed
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

from k3lab.store.tracking import sqlite_path

NEW_SUFFIX = ".k3lab-new"  # the file copied beside the store, then linked into place


class StoreAhead:
    """MLflow's tables for the SQLite store at `tracking_uri`, made on a thread in a temporary
    folder when that file does not exist yet (else nothing is done)."""

    def __init__(self, tracking_uri: str | None):
        database = sqlite_path(tracking_uri)
        self.target = database.absolute() if database is not None and not database.exists() else None
        self.folder: str | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        if self.target is not None:
            self.folder = tempfile.mkdtemp(prefix="k3lab-store-")
            self.thread = threading.Thread(target=self._make_tables, name="k3lab-store", daemon=True)
            self.thread.start()

    @property
    def made(self) -> Path | None:
        return Path(self.folder) / self.target.name if self.folder else None

    def _make_tables(self) -> None:
        try:
            from mlflow.tracking import MlflowClient

            MlflowClient(f"sqlite:///{self.made}").search_experiments()  # creates and migrates the tables
        except BaseException as error:  # the store is then made where it goes, as without this
            self.error = error

    def install(self) -> bool:
        """Wait for the tables, and put their file where the store goes unless a file is there by
        now (another sweep's store: kept). True when the file was put in place."""
        if self.thread is None:
            return False
        self.thread.join()
        if self.error is not None or self.target.exists():
            return False
        self.target.parent.mkdir(parents=True, exist_ok=True)
        staged = self.target.with_name(self.target.name + NEW_SUFFIX)
        shutil.copyfile(self.made, staged)
        try:
            os.link(staged, self.target)  # never over a store made in the meantime
        except FileExistsError:
            return False
        finally:
            staged.unlink(missing_ok=True)
        return True

    def discard(self) -> None:
        """Remove the temporary folder (after `install`, or instead of it)."""
        if self.thread is not None:
            self.thread.join()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
