"""Library notices in a log file instead of among k3lab's own output.

Ray (its token-authentication notice, Tune's warnings) and MLflow (table creation,
alembic migrations) log through Python's `logging`; k3lab itself prints with rich,
not through `logging`. Inside `library_logs(path)` those records go to `path`;
`--verbose` passes None and leaves them on the terminal.

MLflow gives its loggers handlers of their own (see mlflow.utils.logging_utils):
those are swapped for the file. Ray gives its `ray` logger a stderr handler on import
and keeps its records there (`ray.init(configure_logging=False)` then drops the
handler, so they reach Python's last-resort stderr output): with `ray=True` that logger
passes its records up to the root logger instead, where the file is added.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

MLFLOW_LOGGERS = ("mlflow", "alembic", "sqlalchemy.engine", "huey")


@contextlib.contextmanager
def library_logs(path: Path | None, ray: bool = False) -> Iterator[None]:
    """While inside, MLflow's (and with `ray`, Ray's) log records are appended to `path`
    (None: unchanged)."""
    if path is None:
        yield
        return
    import mlflow  # noqa: F401  -- both set up their loggers on import: import first, then change them

    if ray:
        import ray as _ray  # noqa: F401
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    routes = {name: ([handler], False) for name in MLFLOW_LOGGERS} | ({"ray": ([], True)} if ray else {})
    loggers = {name: logging.getLogger(name) for name in routes}
    saved = {name: (logger.handlers, logger.propagate) for name, logger in loggers.items()}
    for name, logger in loggers.items():
        logger.handlers, logger.propagate = routes[name]
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for name, logger in loggers.items():
            logger.handlers, logger.propagate = saved[name]
        handler.close()
