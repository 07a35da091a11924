"""The package's layout holds: one trial's training (`k3lab.runner.train`) loads neither Ray, MLflow nor
the sweep file parser."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TRAIN_MODULES = ("k3lab.runner.train", "k3lab.runner.train.trainer", "k3lab.runner.train.loop", "k3lab.runner.train.checks",
                 "k3lab.runner.train.checkpoint", "k3lab.runner.train.graphs", "k3lab.runner.train.ddp",
                 "k3lab.runner.train.diagnostics", "k3lab.registry.train_spec")


def test_train_imports_without_ray_mlflow_or_the_sweep_parser():
    code = (
        "import sys\n"
        "for name in ('ray', 'mlflow', 'cattrs'):\n"
        "    sys.modules[name] = None  # any import of them raises ImportError\n"
        f"import importlib\nfor module in {TRAIN_MODULES!r}:\n"
        "    importlib.import_module(module)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('k3lab.registry', 'k3lab.runner.tune', 'k3lab.store'))\n"
        "                and m not in ('k3lab.registry', 'k3lab.registry.train_spec'))\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# The packages from the top layer down (../shared/DESIGN.md's layout, with the card's runner/): a
# package may import only the packages below it, so the import graph has no circle and no arrow up.
LAYERS = ("k3lab.cli", "k3lab.commands", "k3lab.export", "k3lab.runner.tune",
          "k3lab.runner.runtime", "k3lab.runner.train", "k3lab.registry", "k3lab.report", "k3lab.store",
          "k3lab.data", "k3lab.optim", "k3lab.model", "k3lab.ops")
ABOVE = {package: LAYERS[:i] for i, package in enumerate(LAYERS) if i > 0}


def imported_modules(path: Path) -> set[str]:
    """Every k3lab module `path` imports, at its top or inside a function."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return {name for name in names if name.startswith("k3lab")}


def test_no_import_points_up_the_layers():
    upward = []
    for package, above in ABOVE.items():
        where = REPO / package.replace(".", "/")
        for path in sorted(where.rglob("*.py")) if where.is_dir() else [where.with_suffix(".py")]:
            upward += [f"{path.relative_to(REPO)} imports {name}" for name in imported_modules(path)
                       if name.startswith(above)]
    assert not upward, upward


def test_every_package_of_k3lab_has_its_layer():
    """A new package must take its place in LAYERS, or the test above would not look at it."""
    packages = {f"k3lab.{path.name}" for path in (REPO / "k3lab").iterdir() if (path / "__init__.py").exists()}
    packages |= {f"k3lab.runner.{path.name}" for path in (REPO / "k3lab" / "runner").iterdir() if path.is_dir()
                 and (path / "__init__.py").exists()}
    assert packages - {"k3lab.runner"} <= set(LAYERS), sorted(packages - {"k3lab.runner"} - set(LAYERS))


def test_cli_imports_every_command_group_statically():
    """Every command group is a module of k3lab/commands/ with `register`, and cli.py names each
    in an import statement (no importlib, no group registered from another package)."""
    import ast

    groups = {path.stem for path in (REPO / "k3lab" / "commands").glob("*.py")
              if any(isinstance(node, ast.FunctionDef) and node.name == "register"
                     for node in ast.parse(path.read_text()).body)}
    cli = REPO / "k3lab" / "cli.py"
    imported = {name.removeprefix("k3lab.commands.") for name in imported_modules(cli)
                if name.startswith("k3lab.commands.")}
    assert groups and groups <= imported, sorted(groups - imported)
    assert "importlib" not in cli.read_text()
    elsewhere = [str(path.relative_to(REPO)) for path in sorted((REPO / "k3lab").rglob("*.py"))
                 if path.parent.name != "commands" and "def register(subparsers" in path.read_text()]
    assert not elsewhere, elsewhere


def logic_lines(path: Path) -> int:
    """Lines of code: not blank, not comments, not docstrings."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        first = body[0] if body and isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(set(range(token.start[0], token.end[0] + 1)) - docstrings)
    return len(lines)


def test_every_command_module_is_thin():
    """A command parses, calls one function of a package and prints: under 120 lines of logic, no
    thread or signal of its own, and MLflow's server app is not one (issue 71)."""
    commands = sorted((REPO / "k3lab" / "commands").glob("*.py"))
    heavy = {path.name: logic_lines(path) for path in commands if logic_lines(path) >= 120}
    assert not heavy, heavy
    threads = [path.name for path in commands if re.search(r"^import (threading|signal)$", path.read_text(), re.M)]
    assert not threads, threads
    assert not (REPO / "k3lab" / "commands" / "ui_app.py").exists()
