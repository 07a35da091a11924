"""bench/cold_compile.py: each phase's kernel cache holds what the phase names, and the CPU harness
runs its phases and prints their table (the GPU figures need an H200: docs/benchmarks.md)."""

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cold_compile import prepare_cache  # noqa: E402


@pytest.fixture
def full(tmp_path):
    """A filled kernel cache, as the fresh phase leaves it in WORK/full."""
    for sub, name in (("triton", "abc/kernel.cubin"), ("inductor", "fxgraph/xy/entry")):
        path = tmp_path / "full" / sub / name
        path.parent.mkdir(parents=True)
        path.write_bytes(bytes(range(256)) * 64)
    return tmp_path


@pytest.mark.parametrize("phase, held", [("fresh", set()), ("triton", {"triton"}), ("inductor", {"inductor"}),
                                         ("both", {"triton", "inductor"}), ("mega", set())])
def test_each_phase_starts_from_a_new_cache_holding_only_its_folders(full, phase, held):
    (full / phase / "stale").mkdir(parents=True)  # what an earlier run left there goes
    nbytes = prepare_cache(full, phase)
    assert {p.name for p in (full / phase).iterdir()} == held
    for sub in held:  # a copy of WORK/full's folder, file for file
        copied = sorted(p.relative_to(full / phase) for p in (full / phase / sub).rglob("*") if p.is_file())
        assert copied == sorted(p.relative_to(full / "full") for p in (full / "full" / sub).rglob("*") if p.is_file())
    assert (nbytes > 0) == bool(held)


def test_the_mega_phase_counts_its_artifacts_gzipped(full):
    (full / "mega.bin").write_bytes(b"artifacts " * 1000)
    assert prepare_cache(full, "mega") == len(gzip.compress(b"artifacts " * 1000))


def test_the_harness_runs_its_cpu_phases_and_prints_their_table(tmp_path):
    done = subprocess.run([sys.executable, "bench/cold_compile.py", "--device", "cpu", "--row", "tiny@2x32",
                           "--phases", "fresh,both,mega", "--work", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| fresh | nothing | " in done.stdout
    assert "| both | Triton's kernels and torch.compile's caches | " in done.stdout
    assert "| mega | torch.compile's portable artifacts (loaded) | failed: the fresh phase saved no" in done.stdout


def test_phases_must_start_with_fresh():
    done = subprocess.run([sys.executable, "bench/cold_compile.py", "--phases", "both", "--work", "/nonexistent"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "fresh first" in done.stderr
