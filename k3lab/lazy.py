"""A package's names imported from their modules on first use (PEP 562), so that importing the
package (as `k3lab --help` does) imports no torch, Ray or MLflow."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """(`__getattr__`, `__dir__`) for `package`: each name of `exports` (name -> its module) is
    imported on first use and kept in the package's namespace."""
    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
