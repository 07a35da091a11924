"""What the README promises a new user: where a run's files land (and that git ignores them),
how to get a CPU-only torch, and the two quick-start commands, unchanged."""

import shutil
import subprocess
from pathlib import Path

import pytest

from k3lab.store.state import default_storage
from k3lab.store.tracking import artifact_folder_for

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
QUICK_START = (
    "python -m venv .venv && . .venv/bin/activate && pip install -e . && k3lab sweep experiments/attnres_block.yaml",
    'python -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && python -m pytest -q',
)


def what_a_run_writes(tmp_path) -> list[str]:
    """The names k3lab writes in the folder it runs from, by default."""
    database = tmp_path / "mlflow.db"
    return [database.name, artifact_folder_for(f"sqlite:///{database}").name + "/", f"{default_storage()}/"]


def test_readme_names_every_folder_a_run_writes(tmp_path):
    names = what_a_run_writes(tmp_path)
    assert names == ["mlflow.db", "mlartifacts/", "k3lab_runs/"]
    assert all(f"`{name}`" in README for name in names)


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_git_ignores_every_folder_a_run_writes(tmp_path):
    for name in what_a_run_writes(tmp_path):
        assert subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", name]).returncode == 0, name


def test_readme_says_how_to_get_a_cpu_only_torch_and_keeps_the_quick_start_commands():
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in README
    assert all(f"```bash\n{command}\n```" in README for command in QUICK_START)
