"""The package's layout holds: one trial's training (`k3lab.train`) loads neither Ray, MLflow nor
the sweep file parser."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TRAIN_MODULES = ("k3lab.train", "k3lab.train.trainer", "k3lab.train.spec", "k3lab.train.checkpoint",
                 "k3lab.train.graphs", "k3lab.train.ddp", "k3lab.train.metrics")


def test_train_imports_without_ray_mlflow_or_the_sweep_parser():
    code = (
        "import sys\n"
        "for name in ('ray', 'mlflow', 'cattrs'):\n"
        "    sys.modules[name] = None  # any import of them raises ImportError\n"
        f"import importlib\nfor module in {TRAIN_MODULES!r}:\n"
        "    importlib.import_module(module)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('k3lab.registry', 'k3lab.tune', 'k3lab.store')))\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
