"""constraints.txt, the one set of versions the laptop install, the GPU bundle and the compose images
share: it sits inside pyproject's ranges, this install came from it, and a store written with the
bundle's MLflow opens with this install's."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from k3lab.store import runs

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
STORE_FORMAT = ("mlflow", "mlflow-skinny", "mlflow-tracing", "sqlalchemy", "alembic")  # what a store's schema follows


def constraint_lines() -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in CONSTRAINTS.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def pinned() -> dict[str, Version]:
    return {canonicalize_name(r.name): Version(str(r.specifier).removeprefix("==")) for r in constraint_lines()}


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(line) for line in lines]


def test_every_pin_is_one_version_inside_the_projects_ranges():
    pins = pinned()
    assert all(len(r.specifier) == 1 and str(r.specifier).startswith("==") for r in constraint_lines())
    for requirement in project_requirements():
        name = requirement.name.lower().replace("_", "-")
        if name in pins:
            assert requirement.specifier.contains(pins[name], prereleases=True), f"{requirement} vs {pins[name]}"
    assert {"mlflow", "ray", "datasets", "pyarrow"} <= set(pins)


def test_the_mlflow_packages_are_pinned_to_one_release():
    pins = pinned()
    assert pins["mlflow"] == pins["mlflow-skinny"] == pins["mlflow-tracing"]


def test_the_readme_gpu_section_names_the_pinned_mlflow():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## GPU trials"):readme.index("## Sweep files")]
    assert f"MLflow {pinned()['mlflow']} there as\nhere" in section


def test_this_install_has_the_pinned_store_format():
    from importlib.metadata import PackageNotFoundError, version

    pins = pinned()
    for name in STORE_FORMAT:
        try:
            installed = Version(version(name))
        except PackageNotFoundError:
            continue
        assert installed == pins[name], f"{name} {installed} here, {pins[name]} in constraints.txt"


def test_the_gpu_bundle_and_the_compose_images_install_from_it():
    assert "--constraint constraints.txt" in (ROOT / "scripts/bundle/h200.sh").read_text()
    for dockerfile in ("docker/Dockerfile", "docker/Dockerfile.cpu"):
        assert "pip install -c constraints.txt " in (ROOT / dockerfile).read_text()


def bundled_mlflow(tmp_path: Path) -> Path:
    """The MLflow wheel the GPU bundle takes (scripts/bundle/bundle.py swaps mlflow for mlflow-skinny at
    constraints.txt's version), for this machine's Python: only that wheel, the rest is this install's."""
    wanted = f"mlflow-skinny=={pinned()['mlflow-skinny']}"
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                           "--disable-pip-version-check", "-d", str(tmp_path / "wheel"), wanted],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"no package index to fetch the bundle's MLflow from: {done.stderr.strip()[-300:]}")
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    return wheel


WRITE_STORE = """
import sys, mlflow
assert mlflow.__file__.startswith(sys.argv[2]), mlflow.__file__
from k3lab.store.tracking import MLflowTracker
tracker = MLflowTracker.start(sys.argv[1], "bundle", "written-on-the-gpu")
tracker.log_metrics({"val_loss": 3.25}, step=7)
tracker.finish("FINISHED")
print(mlflow.__version__)
"""


@pytest.mark.slow
def test_a_store_written_with_the_bundles_mlflow_opens_with_this_install(tmp_path):
    import mlflow

    wheel = bundled_mlflow(tmp_path)
    site = tmp_path / "bundle-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True)
    uri = f"sqlite:///{tmp_path / 'gpu.db'}"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", WRITE_STORE, uri, str(site)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == wheel.name.split("-")[1] == mlflow.__version__  # one MLflow on both machines
    client = runs.client(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("bundle").experiment_id])
    assert run.data.metrics["val_loss"] == 3.25 and run.info.status == "FINISHED"


def test_ci_runs_the_triton_kernels_at_both_ends_of_the_gpu_extras_range():
    import re

    triton = next(r for r in project_requirements() if r.name == "triton")
    ci = (ROOT / ".ci/run").read_text()
    ends = [Version(v) for v in re.search(r"for triton in ([\d. ]+); do", ci).group(1).split()]
    assert all(triton.specifier.contains(v) for v in ends)
    floor = Version(next(s.version for s in triton.specifier if s.operator == ">="))
    ceiling = Version(next(s.version for s in triton.specifier if s.operator == "<"))
    assert (ends[0].major, ends[0].minor) == (floor.major, floor.minor)  # the floor's release line
    assert (ends[-1].major, ends[-1].minor + 1) == (ceiling.major, ceiling.minor)  # the last line below the cap


def test_the_floors_are_the_lower_bounds_of_the_ranges(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("lock_versions", ROOT / "scripts/lock_versions.py")
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    floors = lock.floors(set())
    assert floors["mlflow"] == "3.18.0" and floors["ray"] == "2.51" and "torch" not in floors
    assert "numpy" not in floors  # no lower bound: nothing to pin


def test_every_store_in_docs_runs_has_the_schema_of_this_installs_mlflow(tmp_path):
    """A store k3lab ships opens with the versions it installs (and at the ranges' floors: CI's floors job)."""
    import lzma
    import sqlite3

    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    head = ScriptDirectory.from_config(_get_alembic_config("sqlite://")).get_current_head()
    stores = sorted((ROOT / "docs/runs").glob("*.db.xz"))
    assert stores
    for store in stores:
        copy = tmp_path / "store.db"
        copy.write_bytes(lzma.decompress(store.read_bytes()))
        with sqlite3.connect(copy) as db:
            schema = db.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        assert schema == head, f"{store.name}: schema {schema}, this MLflow's {head} (scripts/downgrade_store.py)"
