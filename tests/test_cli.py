"""The `k3lab` command itself: --version, a --help that loads no heavy library, help on every
option, and the small things a first hour trips on (an empty sweep file, a variants table)."""

import subprocess
import sys
from pathlib import Path

import pytest

import k3lab
from k3lab.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "ray", "mlflow", "pyarrow")


def test_k3lab_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0 and capsys.readouterr().out.strip() == f"k3lab {k3lab.__version__}"


def test_help_loads_neither_torch_ray_mlflow_nor_pyarrow():
    """`k3lab --help` imported torch through every command module's imports: seconds before any help."""
    code = ("import sys, contextlib, io\n"
            "from k3lab.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--help'])\n"
            f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def options_without_help(parser) -> list[str]:
    """'command --option' for every option of every sub-command that has no help text."""
    missing = []
    for action in parser._subparsers._group_actions:
        for name, sub in action.choices.items():
            nested = [a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction"]
            if nested:
                missing += [f"{name} {m}" for m in options_without_help(sub)]
            missing += [f"{name} {a.option_strings[-1]}" for a in sub._actions
                        if a.option_strings and not a.help and a.dest != "help"]
    return missing


def test_every_option_of_every_command_says_what_it_does():
    """`train --seed` had no help text."""
    assert options_without_help(build_parser()) == []


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_an_empty_sweep_file_is_said_to_be_empty(tmp_path, capsys, text):
    """It said 'got null'."""
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    assert main(["variants", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}: the file is empty: expected a mapping of sweep settings (name, base, axes, ...)\n"


def test_the_variants_table_never_wraps_inside_an_override_or_crops_a_column(tmp_path, capsys):
    """`--dry-run` (a 120-column console) wrapped `attn_res_block_size=16` as `attn_res_block_size` / `=16,`."""
    text = (REPO / "experiments" / "attnres_block.yaml").read_text().replace(
        "  attn_res_block_size: [off, full, 2, 4, 8]\n",
        "  attn_res_block_size: [off, full, 2, 4, 8, 16]\n  num_experts_per_token: [1, 2]\n").replace(
        "baseline: attnres_off", "")
    path = tmp_path / "two.yaml"
    path.write_text(text)
    for argv in (["variants", str(path), "--profile", "cpu"],
                 ["sweep", str(path), "--profile", "cpu", "--dry-run", "--storage", str(tmp_path / "runs")]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        table = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
        assert sum("attn_res_block_size=16," in line for line in table) == 2, out
        assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in table), out
