import importlib.util
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

# Fault injection (K3LAB_FAIL_AT_STEP, K3LAB_OOM_AT_STEP) for this process and every one it starts,
# Ray's workers included: tests/seams/sitecustomize.py, which k3lab does not ship.
SEAMS = Path(__file__).resolve().parent / "seams"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SEAMS), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(SEAMS))
import sitecustomize  # noqa: E402,F401  (this process started before PYTHONPATH named the seams)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_configure(config):
    if torch.cuda.is_available():  # the GPU tests share the machine's kernel cache (and k3lab's shipped tunings)
        from k3lab.runner.runtime.kernel_cache import open_kernel_cache

        open_kernel_cache()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """One token cache for the whole session, so the built-in corpus is tokenized once."""
    return tmp_path_factory.mktemp("k3lab-data")


@pytest.fixture
def isolated_data(data_dir, monkeypatch):
    monkeypatch.setenv("K3LAB_DATA_DIR", str(data_dir))
    return data_dir


@pytest.fixture
def restores_determinism():
    """torch's deterministic-algorithms settings as they were before the test (`train.deterministic`
    sets them for the whole process)."""
    import torch.utils.deterministic

    saved = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.utils.deterministic.fill_uninitialized_memory = saved[1]


def fla_reference(relative_path: str):
    """One of FLA's plain-PyTorch reference files (e.g. "ops/kda/naive.py"), loaded by path.

    `import fla` needs Triton; these files need only torch and einops, so the test extra
    installs fla-core and the tests read its references directly, on any CPU.
    """
    spec = importlib.util.find_spec("fla")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (pip install -e '.[test]')")
    path = Path(list(spec.submodule_search_locations)[0]) / relative_path
    name = "fla_reference_" + relative_path.replace("/", "_").removesuffix(".py")
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def bench_script(name: str):
    """bench/<name>.py loaded as a module by its path (the scripts are run, not installed)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses look their module up there
    module_spec.loader.exec_module(module)
    return module


def mini_sweep(name: str, description: str, steps: int = 8, eval_interval: int = 4, log_interval: int = 2) -> str:
    """A sweep file of two variants (AttnRes off / block size 1) of a 2-layer tiny model, 8 steps."""
    return f"""\
name: {name}
description: {description}
base: {{preset: tiny, num_layers: 2, layer_types: [kda, mla], num_dense_layers: 1}}
axes:
  attn_res_block_size: [off, 1]
seeds: [0]
train: {{steps: {steps}, batch_size: 2, seq_len: 32, warmup_steps: 1, eval_interval: {eval_interval}, eval_batches: 1, log_interval: {log_interval}}}
resources: {{cpu: 1, gpu: 0}}
"""


@pytest.fixture
def sweep_file(tmp_path):
    """The mini sweep (name `mini`) written to a file."""
    path = tmp_path / "mini.yaml"
    path.write_text(mini_sweep("mini", "two variants of a very small model"))
    return path


def sweep_args(tmp_path, sweep_file, *extra, storage=None) -> list[str]:
    """`k3lab sweep` arguments with the storage (default tmp_path/runs) and MLflow store in tmp_path."""
    return ["sweep", str(sweep_file), "--storage", str(storage or tmp_path / "runs"), "--no-live",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", *extra]


def stopped_long_sweep(folder: Path, data_dir: Path, description: str = "too long to finish in 45 s"):
    """`k3lab sweep` of a mini sweep of 20000 steps in `folder`, stopped by --stop-after 45s mid-trial
    (in a process of its own, as a job runs it); its CompletedProcess (exit 3 expected)."""
    import subprocess

    path = folder / "long.yaml"
    path.write_text(mini_sweep("long", description, steps=20000, eval_interval=500, log_interval=50))
    env = {k: v for k, v in os.environ.items() if k != "K3LAB_FAIL_AT_STEP"} | {
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "K3LAB_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "k3lab.cli", *sweep_args(folder, path, "--stop-after", "45s")],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def mlflow_api(base: str, path: str, body: dict | None = None) -> dict:
    """One call of an MLflow server's REST API (GET, or POST with a JSON body): its JSON answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def sweep_that_gets_sigterm(run, live, say):
    """A stand-in for `k3lab.runner.tune.driver.run_sweep` that makes its folders, then gets SIGTERM as a
    job control or a scheduler would send it (the handler's SIGINT ends the sleep)."""
    run.tune_dir.mkdir(parents=True)
    run.state_file.write_text("{}")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    raise AssertionError("SIGTERM did not stop the sweep")


# -- comparing a fast path with its reference (tests/test_ops_*.py, test_gpu_fused.py) ----------

def err_ratio(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return ((out - ref).square().mean().sqrt() / ref.square().mean().sqrt().clamp(min=1e-30)).item()


def assert_as_accurate(name: str, out, ref16, ref32, floor: float) -> None:
    """out (fused, bf16) is within 2x the bf16 reference's own error against fp32, or within floor."""
    e_out, e_ref = err_ratio(out, ref32), err_ratio(ref16, ref32)
    print(f"{name:>28}: fused {e_out:.2e}  bf16 reference {e_ref:.2e}  (floor {floor:.0e})")
    assert e_out <= max(2 * e_ref, floor), f"{name}: fused error {e_out:.2e}, bf16 reference {e_ref:.2e}"


def randomize_scorers(model: torch.nn.Module, std: float = 0.05) -> None:
    """Non-zero AttnRes scorers, so every mixture is non-uniform."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("res_proj.weight"):
                p.normal_(std=std)


@pytest.fixture
def fp32_truth():
    """fp32 means fp32: no TF32 in cuDNN convolutions or cuBLAS matmuls for the truth runs."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def needs_fla():
    pytest.importorskip("fla")
