"""Library notices in a log file instead of among k3lab's own output.

Ray (its token-authentication notice, Tune's warnings) and MLflow (table creation,
alembic migrations) log through Python's `logging`. Inside `library_logs(path)` their
records go to `path`; `--verbose` passes None and leaves them on the terminal.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

# the loggers MLflow configures for itself (see mlflow.utils.logging_utils), and Ray's
LIBRARY_LOGGERS = ("ray", "mlflow", "alembic", "sqlalchemy.engine", "huey")


@contextlib.contextmanager
def library_logs(path: Path | None) -> Iterator[None]:
    """While inside, Ray's and MLflow's log records are appended to `path` (None: unchanged)."""
    if path is None:
        yield
        return
    import mlflow  # noqa: F401  -- MLflow sets its handlers on import: import first, then replace them

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    saved = [(logger.handlers, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers, logger.propagate = [handler], False
    try:
        yield
    finally:
        for logger, (handlers, propagate) in zip(loggers, saved):
            logger.handlers, logger.propagate = handlers, propagate
        handler.close()
