"""The per-machine kernel cache, the sweep's kernel warm-up plan, and sweep efficiency."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from k3lab.cli import main
from k3lab.errors import UserError
from k3lab.registry import load_sweep
from k3lab.report.efficiency import peak_flops_of, sweep_efficiency
from k3lab.runner.runtime import kernel_cache, tunings
from k3lab.runner.runtime.kernel_cache import cache_info, kernel_shapes, resolve_kernel_cache, use_kernel_cache, warm_kernels
from k3lab.runner.runtime.model_code import model_code_files

ROOT = Path(__file__).resolve().parent.parent


def test_seeds_share_kernel_shapes_and_variants_do_not():
    sweep = load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu")
    shapes = kernel_shapes(sweep)
    assert len(sweep.trials) > len(sweep.valid_variants) == len(shapes)  # seeds add no shapes
    assert {(s.batch_size, s.seq_len) for s in shapes} == {(sweep.train.batch_size, sweep.train.seq_len)}
    assert shapes[0].config == sweep.valid_variants[0].config


def test_kernel_cache_is_the_flag_then_the_file_then_the_environment_then_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("K3LAB_KERNEL_CACHE", str(tmp_path / "env"))
    assert resolve_kernel_cache("flag", "file") == Path("flag").resolve()
    assert resolve_kernel_cache(None, str(tmp_path / "file")) == tmp_path / "file"
    assert resolve_kernel_cache() == tmp_path / "env"
    monkeypatch.delenv("K3LAB_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_kernel_cache() == tmp_path / "xdg" / "k3lab" / "kernels"


def test_a_sweep_file_names_its_kernel_cache_relative_to_itself(tmp_path):
    text = (ROOT / "experiments" / "attnres_block.yaml").read_text()
    (tmp_path / "s.yaml").write_text(text + "kernel_cache: cache/kernels\n")
    sweep = load_sweep(tmp_path / "s.yaml", "gpu")
    assert resolve_kernel_cache(None, sweep.kernel_cache) == tmp_path / "cache" / "kernels"


def test_using_the_cache_points_triton_fla_and_inductor_at_it(monkeypatch, tmp_path):
    for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLA_CACHE_RESULTS"):
        monkeypatch.delenv(key, raising=False)
    use_kernel_cache(tmp_path / "kc")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "kc" / "triton")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "kc" / "inductor")
    assert os.environ["FLA_CACHE_RESULTS"] == "1" and (tmp_path / "kc" / "triton").is_dir()


def test_an_unwritable_kernel_cache_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="kernel cache .*file/kc: not writable"):
        use_kernel_cache(tmp_path / "file" / "kc")


def test_a_kernel_cache_that_is_a_file_is_one_clear_error_not_an_empty_cache(tmp_path, capsys):
    (tmp_path / "cache").write_text("")
    assert main(["kernels", "info", "--kernel-cache", str(tmp_path / "cache")]) == 2
    assert capsys.readouterr().err == f"error: kernel cache {tmp_path / 'cache'}: is a file, not a folder\n"


def test_cache_info_counts_tuned_shapes_per_kernel(tmp_path):
    for i, name in enumerate(["chunk_kda_bwd_kernel_intra", "chunk_kda_bwd_kernel_intra", "l2norm_fwd_kernel"]):
        (tmp_path / "triton" / f"H{i}").mkdir(parents=True)
        (tmp_path / "triton" / f"H{i}" / f"{name}.autotune.json").write_text("{}")
    info = cache_info(tmp_path)
    assert info["autotuned"] == {"chunk_kda_bwd_kernel_intra": 2, "l2norm_fwd_kernel": 1}
    assert info["files"] == 3


def test_kernels_info_command_shows_the_cache(tmp_path, capsys):
    (tmp_path / "triton" / "A").mkdir(parents=True)
    (tmp_path / "triton" / "A" / "attnres_fwd_kernel.autotune.json").write_text("{}")
    assert main(["kernels", "info", "--kernel-cache", str(tmp_path)]) == 0
    assert "attnres_fwd_kernel: 1 tuned shape" in capsys.readouterr().out


def test_kernels_warm_without_a_gpu_says_so_in_one_line(capsys, tmp_path):
    pytest.importorskip("torch").cuda.is_available() and pytest.skip("this machine has a GPU")
    code = main(["kernels", "warm", str(ROOT / "experiments" / "attnres_block.yaml"), "--kernel-cache", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == "error: k3lab kernels warm: no CUDA GPU here: there is nothing to tune"


def test_sweep_mfu_is_training_flops_over_wall_time_gpus_and_peak():
    trials = [{"tokens": 1_000_000, "flops_per_token": 2e8, "startup_s": 10.0},
              {"tokens": 3_000_000, "flops_per_token": 1e8, "startup_s": 14.0}]
    e = sweep_efficiency(trials, wall_s=100.0, gpus=1, device_name="NVIDIA H200", warmup_s=5.0)
    assert e["sweep_tokens"] == 4_000_000 and e["sweep_tokens_per_s"] == 40_000
    assert e["sweep_mfu"] == pytest.approx((2e14 + 3e14) / (100.0 * 989e12))
    assert e["trial_startup_s_max"] == 14.0 and e["kernel_warmup_s"] == 5.0
    two = sweep_efficiency(trials, wall_s=100.0, gpus=2, device_name="NVIDIA H200")
    assert two["sweep_mfu"] == pytest.approx(e["sweep_mfu"] / 2) and two["sweep_gpus"] == 2


def test_sweep_mfu_is_left_out_without_a_known_gpu():
    e = sweep_efficiency([{"tokens": 10, "flops_per_token": 1.0}], wall_s=1.0, gpus=0, device_name=None)
    assert "sweep_mfu" not in e and e["sweep_tokens"] == 10
    assert peak_flops_of("NVIDIA H100 PCIe") == 756e12 and peak_flops_of("Some GPU") is None


def test_the_efficiency_line_names_mfu_warm_up_and_start_up_only_where_they_exist():
    from k3lab.report.efficiency import efficiency_line

    gpu = efficiency_line({"sweep_tokens": 131072000, "sweep_wall_s": 478, "sweep_tokens_per_s": 274299,
                           "sweep_mfu": 0.056, "kernel_warmup_s": 62.8, "trial_startup_s_max": 47.1})
    assert gpu == ("sweep: 131,072,000 tokens in 478 s = 274,299 tokens/s, sweep MFU 5.6%; "
                   "kernel warm-up 62.8 s, trial start-up up to 47.1 s")
    cpu = efficiency_line({"sweep_tokens": 512000, "sweep_wall_s": 341, "sweep_tokens_per_s": 1500,
                           "kernel_warmup_s": 0.0})
    assert cpu == "sweep: 512,000 tokens in 341 s = 1,500 tokens/s, sweep MFU n/a (no known GPU)"


@pytest.fixture
def fake_gpu(monkeypatch):
    """warm_kernels without a GPU: the forward+backward it would run is recorded instead."""
    ran = []
    monkeypatch.setattr(kernel_cache, "require_cuda", lambda: None)
    monkeypatch.setattr(kernel_cache, "gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(kernel_cache, "run_forward_backward", lambda shape: ran.append(shape.name))
    return ran


def test_a_second_sweep_skips_the_shapes_an_earlier_warm_up_recorded(fake_gpu, tmp_path):
    shapes = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))
    first = warm_kernels(shapes, cache=tmp_path, skip_recorded=True)
    assert fake_gpu == [s.name for s in shapes] and first["warmed"] == first["shapes"] == len(shapes)
    fake_gpu.clear()
    second = warm_kernels(shapes, cache=tmp_path, skip_recorded=True)
    assert fake_gpu == [] and (second["shapes"], second["warmed"]) == (len(shapes), 0)
    assert cache_info(tmp_path)["warm_shapes"] == len(shapes)


def test_a_new_batch_gpu_or_library_version_warms_again(fake_gpu, tmp_path, monkeypatch):
    shape = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))[0]
    warm_kernels([shape], cache=tmp_path, skip_recorded=True)
    warm_kernels([kernel_cache.KernelShape(shape.name, shape.config, shape.batch_size * 2, shape.seq_len, shape.autocast)],
                 cache=tmp_path, skip_recorded=True)
    monkeypatch.setattr(kernel_cache, "gpu_name", lambda: "NVIDIA H100")
    warm_kernels([shape], cache=tmp_path, skip_recorded=True)
    monkeypatch.setattr(kernel_cache, "package_version", lambda name: "9.9")
    warm_kernels([shape], cache=tmp_path, skip_recorded=True)
    assert len(fake_gpu) == 4 and cache_info(tmp_path)["warm_shapes"] == 4


def test_a_compiled_sweeps_shapes_warm_compiled_and_an_eager_shape_keeps_its_fingerprint():
    import attrs

    from k3lab.registry.model_variants import short_hash

    shape = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))[0]
    assert shape.compile  # the gpu profile compiles its blocks: the warm-up compiles them too
    eager = attrs.evolve(shape, compile=False)
    before = short_hash([shape.config.to_dict(), shape.batch_size, shape.seq_len, shape.autocast, "G", "T"])
    assert kernel_cache.shape_fingerprint(eager, "G", "T") == before  # records of eager shapes stay valid
    assert kernel_cache.shape_fingerprint(shape, "G", "T") != before


def test_kernels_warm_command_always_warms_every_shape(fake_gpu, tmp_path, monkeypatch):
    for key in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLA_CACHE_RESULTS"):
        monkeypatch.setenv(key, "")  # the command points them at its cache; restored afterwards
    command = ["kernels", "warm", str(ROOT / "experiments" / "attnres_block.yaml"), "--profile", "gpu",
               "--kernel-cache", str(tmp_path)]
    assert main(command) == 0 and main(command) == 0
    shapes = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))
    assert len(fake_gpu) == 2 * len(shapes) and cache_info(tmp_path)["warm_shapes"] == len(shapes)


def test_clearing_tritons_cache_clears_the_warm_record(fake_gpu, tmp_path):
    shape = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))[0]
    warm_kernels([shape], cache=tmp_path, skip_recorded=True)
    shutil.rmtree(tmp_path / "triton")
    assert warm_kernels([shape], cache=tmp_path, skip_recorded=True)["warmed"] == 1


def test_a_warm_record_that_cannot_be_written_leaves_the_warm_up_standing(fake_gpu, tmp_path):
    (tmp_path / "triton").write_text("not a folder")
    shape = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))[0]
    assert warm_kernels([shape], cache=tmp_path, skip_recorded=True)["warmed"] == 1


def test_an_unreadable_warm_record_counts_as_none(fake_gpu, tmp_path):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "k3lab-warm.json").write_text("{half a fi")
    shape = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))[0]
    assert warm_kernels([shape], cache=tmp_path, skip_recorded=True)["warmed"] == 1
    assert cache_info(tmp_path)["warm_shapes"] == 1


# -- tuned kernels as data: export, import, the shipped tunings -----------------------------------

def tuned_cache(root: Path) -> Path:
    """A kernel cache as FLA leaves it: two autotune results, a compiled kernel, a warm record."""
    for digest, kernel in (("AB12", "chunk_kda_fwd_kernel"), ("CD34", "attnres_bwd_kernel_dv")):
        (root / "triton" / digest).mkdir(parents=True)
        (root / "triton" / digest / f"{kernel}.autotune.json").write_text(f'{{"kernel": "{kernel}"}}')
    (root / "triton" / "AB12" / "chunk_kda_fwd_kernel.cubin").write_bytes(b"\0" * 4096)
    (root / "triton" / "k3lab-warm.json").write_text('{"f1": {"shape": "attnres_off", "device": "NVIDIA H200"}}')
    return root


@pytest.mark.parametrize("suffix, magic", [(".tar.xz", b"\xfd7zXZ\x00"), (".tar.gz", b"\x1f\x8b")])
def test_exported_tunings_import_into_a_fresh_cache_with_their_warm_record(tmp_path, suffix, magic):
    manifest = tunings.export_tunings(tuned_cache(tmp_path / "a"), tmp_path / f"t{suffix}", "NVIDIA H200")
    assert manifest["autotune_results"] == 2 and manifest["gpu"] == "NVIDIA H200"
    assert (tmp_path / f"t{suffix}").read_bytes().startswith(magic)  # compressed as its name says
    result = tunings.import_tunings(tmp_path / f"t{suffix}", tmp_path / "b", "NVIDIA H200")
    assert (result["added"], result["kept"], result["warm_shapes"]) == (2, 0, 1)
    imported = sorted(p.relative_to(tmp_path / "b").as_posix() for p in (tmp_path / "b").rglob("*.autotune.json"))
    assert imported == ["triton/AB12/chunk_kda_fwd_kernel.autotune.json", "triton/CD34/attnres_bwd_kernel_dv.autotune.json"]
    assert not list((tmp_path / "b").rglob("*.cubin"))  # compiled kernels stay behind: the archive is small
    assert kernel_cache.read_warm_record(tmp_path / "b") == {"f1": {"shape": "attnres_off", "device": "NVIDIA H200"}}
    again = tunings.import_tunings(tmp_path / f"t{suffix}", tmp_path / "b", "NVIDIA H200")
    assert (again["added"], again["kept"]) == (0, 2)


def test_an_archive_named_neither_tar_xz_nor_tar_gz_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(UserError, match=r"t\.zip: a tunings archive is named \*\.tar\.xz or \*\.tar\.gz"):
        tunings.export_tunings(tuned_cache(tmp_path / "a"), tmp_path / "out" / "t.zip", "NVIDIA H200")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["under_a_file/t.tar.gz", "a_folder.tar.gz"])
def test_an_archive_path_under_a_file_or_on_a_folder_is_refused_in_one_line(tmp_path, capsys, where):
    (tmp_path / "under_a_file").write_text("")
    (tmp_path / "a_folder.tar.gz").mkdir()
    assert main(["kernels", "export", str(tmp_path / where), "--kernel-cache", str(tuned_cache(tmp_path / "a")),
                 "--gpu", "NVIDIA H200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(r"(under_a_file is a file|a_folder.tar.gz: is a folder), not a", err)


def test_an_export_that_fails_while_writing_leaves_no_partial_archive(tmp_path, monkeypatch):
    written = []

    def disk_full(tar, name, data):
        written.append(name)
        if len(written) > 1:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(tunings, "add_member", disk_full)
    with pytest.raises(OSError, match="No space"):
        tunings.export_tunings(tuned_cache(tmp_path / "a"), tmp_path / "out" / "t.tar.gz", "NVIDIA H200")
    assert list((tmp_path / "out").iterdir()) == []


def archive_with_manifest(path: Path, manifest: bytes) -> Path:
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        tunings.add_member(tar, tunings.MANIFEST, manifest)
        tunings.add_member(tar, "triton/AB12/k.autotune.json", b"{}")
    return path


@pytest.mark.parametrize("manifest, problem", [
    (b"[]", "expected a mapping, got list"),
    (b'{"gpu": "NVIDIA H200", "versions": "torch 2.11"}', "versions: expected a mapping, got str"),
    (b'{"gpu": "NVIDIA H200", "versions": {}, "compiled": [1]}', "compiled: expected a mapping, got list"),
    (b"{", "not JSON"),
])
def test_an_archive_whose_manifest_has_the_wrong_shape_is_refused_in_one_line(tmp_path, capsys, manifest, problem):
    archive = archive_with_manifest(tmp_path / "t.tar.gz", manifest)
    assert main(["kernels", "import", str(archive), "--kernel-cache", str(tmp_path / "b"), "--gpu", "NVIDIA H200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"t.tar.gz: not a k3lab kernel tunings archive (k3lab-tunings.json: {problem}" in err
    assert not (tmp_path / "b").exists()
    with pytest.raises(UserError, match=re.escape(problem)):  # the shipped archives are read by the same check
        tunings.read_archive(archive)


def test_tunings_from_another_gpu_or_library_version_import_nothing(tmp_path, monkeypatch):
    tunings.export_tunings(tuned_cache(tmp_path / "a"), tmp_path / "t.tar.gz", "NVIDIA H200")
    with pytest.raises(UserError, match=r"t.tar.gz: measured with GPU NVIDIA H200 \(here NVIDIA H100\): nothing"):
        tunings.import_tunings(tmp_path / "t.tar.gz", tmp_path / "b", "NVIDIA H100")
    versions = tunings.toolchain_versions()
    monkeypatch.setattr(tunings, "toolchain_versions", lambda: versions | {"triton": "9.9.9"})
    with pytest.raises(UserError, match=r"measured with triton .* \(here 9.9.9\): nothing imported"):
        tunings.import_tunings(tmp_path / "t.tar.gz", tmp_path / "b", "NVIDIA H200")
    assert not (tmp_path / "b").exists()


def test_an_archive_cannot_write_outside_the_cache(tmp_path):
    tunings.export_tunings(tuned_cache(tmp_path / "a"), tmp_path / "t.tar.gz", "NVIDIA H200")
    import tarfile

    with tarfile.open(tmp_path / "t.tar.gz", "r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    with tarfile.open(tmp_path / "evil.tar.gz", "w:gz") as tar:
        for name, data in {**members, "triton/../../escaped.autotune.json": b"{}", "notes.txt": b"x"}.items():
            tunings.add_member(tar, name, data)
    assert tunings.import_tunings(tmp_path / "evil.tar.gz", tmp_path / "b", "NVIDIA H200")["added"] == 2
    assert not (tmp_path / "escaped.autotune.json").exists() and not (tmp_path / "b" / "notes.txt").exists()


def compiled_cache(root: Path) -> Path:
    """tuned_cache plus what compiling leaves: a Triton kernel's group file naming its files by
    absolute path, torch.compile's FX-graph cache, and a lock."""
    tuned_cache(root)
    kernel = root / "triton" / "AB12"
    (kernel / "chunk_kda_fwd_kernel.json").write_text('{"name": "chunk_kda_fwd_kernel"}')
    group = {"child_paths": {name: str(kernel / name) for name in ("chunk_kda_fwd_kernel.cubin",
                                                                    "chunk_kda_fwd_kernel.json")}}
    (kernel / "__grp__chunk_kda_fwd_kernel.json").write_text(json.dumps(group))
    (root / "inductor" / "fxgraph" / "ab" / "fkey").mkdir(parents=True)
    (root / "inductor" / "fxgraph" / "ab" / "fkey" / "entry").write_bytes(b"graph")
    (root / "inductor" / "locks").mkdir()
    (root / "inductor" / "locks" / "x.lock").write_text("")
    return root


def test_compiled_kernels_travel_only_when_asked_and_their_files_are_found_in_the_new_cache(tmp_path):
    compiled_cache(tmp_path / "a")
    small = tunings.export_tunings(tmp_path / "a", tmp_path / "small.tar.gz", "NVIDIA H200")
    assert "compiled" not in small
    manifest = tunings.export_tunings(tmp_path / "a", tmp_path / "t.tar.gz", "NVIDIA H200", compiled=True)
    assert manifest["compiled"]["files"] == 4 and manifest["compiled"]["torch_build"] == tunings.torch_build()
    result = tunings.import_tunings(tmp_path / "t.tar.gz", tmp_path / "b", "NVIDIA H200")
    assert (result["added"], result["compiled"]) == (2, 4)
    moved = tmp_path / "b" / "triton" / "AB12"
    group = json.loads((moved / "__grp__chunk_kda_fwd_kernel.json").read_text())
    assert group["child_paths"] == {"chunk_kda_fwd_kernel.cubin": str(moved / "chunk_kda_fwd_kernel.cubin"),
                                    "chunk_kda_fwd_kernel.json": str(moved / "chunk_kda_fwd_kernel.json")}
    assert all(Path(path).is_file() for path in group["child_paths"].values())
    assert (tmp_path / "b" / "inductor" / "fxgraph" / "ab" / "fkey" / "entry").read_bytes() == b"graph"
    assert not (tmp_path / "b" / "inductor" / "locks").exists()


def test_compiled_kernels_of_another_torch_build_stay_behind_and_the_autotune_results_come(tmp_path, monkeypatch):
    tunings.export_tunings(compiled_cache(tmp_path / "a"), tmp_path / "t.tar.gz", "NVIDIA H200", compiled=True)
    monkeypatch.setattr(tunings, "torch_build", lambda: "2.11.0+cu126")
    result = tunings.import_tunings(tmp_path / "t.tar.gz", tmp_path / "b", "NVIDIA H200")
    assert (result["added"], result["compiled"]) == (2, 0)
    assert not list((tmp_path / "b").rglob("*.cubin")) and not (tmp_path / "b" / "inductor").exists()


def test_an_archive_without_its_manifest_first_is_refused_in_one_line(tmp_path):
    import tarfile

    with tarfile.open(tmp_path / "t.tar.gz", "w:gz") as tar:
        tunings.add_member(tar, "triton/AB12/k.autotune.json", b"{}")
    with pytest.raises(UserError, match=r"t.tar.gz: not a k3lab kernel tunings archive"):
        tunings.import_tunings(tmp_path / "t.tar.gz", tmp_path / "b", "NVIDIA H200")
    assert not (tmp_path / "b").exists()


def test_a_gpu_process_imports_every_shipped_archive_of_its_gpu_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tunings, "SHIPPED_DIR", tmp_path / "shipped")
    tunings.export_tunings(tuned_cache(tmp_path / "a"), tmp_path / "shipped" / "h200.tar.gz", "NVIDIA H200")
    tunings.export_tunings(compiled_cache(tmp_path / "c"), tmp_path / "shipped" / "h200-attnres.tar.xz",
                           "NVIDIA H200", compiled=True)
    first = tunings.start_from_shipped(tmp_path / "kc", "NVIDIA H200")
    assert first["archive"] == "h200-attnres.tar.xz, h200.tar.gz"
    assert (first["added"], first["kept"], first["compiled"], first["warm_shapes"]) == (2, 2, 4, 2)
    assert kernel_cache.shipped_line(first) == ("kernels: started from k3lab's tunings for NVIDIA H200 (h200-attnres.tar.xz, "
                                           "h200.tar.gz: 2 autotune results, 4 compiled kernel files, 2 warmed shapes)")
    assert tunings.start_from_shipped(tmp_path / "kc", "NVIDIA H200") is None


def test_a_gpu_without_tunings_of_its_own_starts_from_those_of_its_architecture(tmp_path, monkeypatch):
    monkeypatch.setattr(tunings, "SHIPPED_DIR", tmp_path / "shipped")
    tunings.export_tunings(tuned_cache(tmp_path / "a"), tmp_path / "shipped" / "h200.tar.gz", "NVIDIA H200")
    assert tunings.start_from_shipped(tmp_path / "ampere", "NVIDIA A100-SXM4-80GB") is None  # another architecture
    borrowed = tunings.start_from_shipped(tmp_path / "h100", "NVIDIA H100 80GB HBM3")
    assert borrowed["added"] == 2 and borrowed["gpu"] == "NVIDIA H200"
    tunings.export_tunings(tuned_cache(tmp_path / "b"), tmp_path / "shipped" / "h100.tar.gz", "NVIDIA H100 80GB HBM3")
    own = tunings.start_from_shipped(tmp_path / "h100-fresh", "NVIDIA H100 80GB HBM3")
    assert own["archive"] == "h100.tar.gz"  # its own, once it has them: not the other GPU's as well


def test_a_gpu_process_starts_from_the_shipped_tunings_of_its_gpu_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tunings, "SHIPPED_DIR", tmp_path / "shipped")
    tunings.export_tunings(tuned_cache(tmp_path / "a"), tmp_path / "shipped" / "h200.tar.gz", "NVIDIA H200")
    first = tunings.start_from_shipped(tmp_path / "kc", "NVIDIA H200")
    assert first["added"] == 2 and first["archive"] == "h200.tar.gz"
    assert tunings.start_from_shipped(tmp_path / "kc", "NVIDIA H200") is None  # once per cache


def test_the_shipped_flagship_tunings_record_every_gpu_shape_for_this_model_code(monkeypatch):
    """The warm record in each shipped flagship archive (k3lab/tunings/<gpu>-attnres_block.tar.xz) is
    keyed by the model code (`toolchain_fingerprint` hashes the code text of
    `model_code.MODEL_CODE_FILES`), so a change of its code (not of its comments or docstrings)
    leaves a fresh GPU of that model warming the flagship's five shapes again. Recomputed here with
    the versions each archive was measured with; when this fails, re-make the archive on that GPU
    (scripts/tune_shipped.sh compiled) or take it out, and the GPU starts from the tunings of
    another GPU of its architecture."""
    import tarfile

    archives = sorted(tunings.SHIPPED_DIR.glob("*-attnres_block.tar.xz"))
    assert archives, "k3lab ships the flagship's tunings for at least one GPU"
    shapes = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))
    for archive in archives:
        with tarfile.open(archive, "r:xz") as tar:
            manifest = json.loads(tar.extractfile("k3lab-tunings.json").read())
            record = json.loads(tar.extractfile("triton/k3lab-warm.json").read())
        measured = manifest["versions"] | {"fla-core": manifest["versions"]["fla"],
                                           "flash-linear-attention": manifest["versions"]["fla"]}
        monkeypatch.setattr(kernel_cache, "package_version", measured.get)
        toolchain = kernel_cache.toolchain_fingerprint()
        missing = [shape.name for shape in shapes
                   if kernel_cache.shape_fingerprint(shape, manifest["gpu"], toolchain) not in record]
        assert not missing, f"{archive.name} predates the model code for {missing}"


def ship_tunings_of(shapes, tmp_path: Path, monkeypatch) -> None:
    """Shipped tunings (in tmp_path/shipped) measured "on an H200" for every one of `shapes`:
    one autotune result and their warm record."""
    warm_kernels(shapes, cache=tmp_path / "measured", skip_recorded=True)
    (tmp_path / "measured" / "triton" / "X1").mkdir()
    (tmp_path / "measured" / "triton" / "X1" / "k.autotune.json").write_text("{}")
    monkeypatch.setattr(tunings, "SHIPPED_DIR", tmp_path / "shipped")
    tunings.export_tunings(tmp_path / "measured", tmp_path / "shipped" / "h200.tar.gz", "NVIDIA H200")


def test_a_sweeps_warm_up_starts_from_the_shipped_tunings_and_skips_the_shapes_they_recorded(fake_gpu, tmp_path,
                                                                                            monkeypatch):
    shapes = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))
    ship_tunings_of(shapes, tmp_path, monkeypatch)
    fake_gpu.clear()
    result = warm_kernels(shapes, cache=tmp_path / "fresh", skip_recorded=True)
    assert fake_gpu == [] and result["warmed"] == 0 and result["shipped"]["added"] == 1


def fake_nvidia_smi(folder: Path, monkeypatch, names: list[str], code: int = 0) -> None:
    """An nvidia-smi first on PATH that lists `names` (one GPU a line) and exits with `code`."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{name}'\n" for name in names) + f"exit {code}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("names, code, expected", [
    (["NVIDIA H200", "NVIDIA H200"], 0, "NVIDIA H200"),
    (["NVIDIA H200", "NVIDIA H100 80GB HBM3"], 0, None),  # which one a task gets is not known
    ([], 9, None),  # no driver loaded
])
def test_the_hosts_gpu_name_comes_from_nvidia_smi_when_its_gpus_are_of_one_kind(tmp_path, monkeypatch, names, code,
                                                                                 expected):
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, names, code)
    assert kernel_cache.host_gpu_name() == expected


def test_without_nvidia_smi_the_host_has_no_known_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert kernel_cache.host_gpu_name() is None


def test_a_sweep_whose_shapes_are_all_warm_needs_no_warm_up_task(fake_gpu, tmp_path, monkeypatch):
    """The driver reads the record itself (a GPU task's process start and imports cost 7-8 s)."""
    from types import SimpleNamespace

    from k3lab.runner.runtime.warmup import warm_on_this_host

    shapes = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, ["NVIDIA H200"])
    run, said = SimpleNamespace(on_cluster=False, kernel_cache=tmp_path / "kc"), []
    warm_kernels(shapes[:-1], cache=run.kernel_cache, skip_recorded=True)
    assert warm_on_this_host(run, shapes, said.append) == {} and said == []  # one shape to warm: the task runs
    warm_kernels(shapes, cache=run.kernel_cache, skip_recorded=True)
    result = warm_on_this_host(run, shapes, said.append)
    assert (result["device_name"], result["warmed"], result["shapes"]) == ("NVIDIA H200", 0, len(shapes))
    assert len(said) == 1 and re.fullmatch(rf"kernels: warm in \d+\.\d s \({len(shapes)} kernel shapes already warm "
                                           rf"for NVIDIA H200 in {re.escape(str(run.kernel_cache))}: no warm-up task\)",
                                           said[0])
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, ["NVIDIA H100 80GB HBM3"])  # another GPU: its own warm-up
    assert warm_on_this_host(run, shapes, said.append) == {}
    assert warm_on_this_host(SimpleNamespace(on_cluster=True, kernel_cache=run.kernel_cache), shapes, said.append) == {}


def test_on_a_fresh_cache_the_driver_imports_the_shipped_tunings_and_then_needs_no_warm_up_task(fake_gpu, tmp_path,
                                                                                                 monkeypatch):
    from types import SimpleNamespace

    from k3lab.runner.runtime.warmup import warm_on_this_host

    shapes = kernel_shapes(load_sweep(ROOT / "experiments" / "attnres_block.yaml", "gpu"))
    ship_tunings_of(shapes, tmp_path, monkeypatch)
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, ["NVIDIA H200"])
    said = []
    result = warm_on_this_host(SimpleNamespace(on_cluster=False, kernel_cache=tmp_path / "fresh"), shapes, said.append)
    assert result["shipped"]["added"] == 1 and said[0].startswith("kernels: started from k3lab's tunings for NVIDIA H200")
    assert (tmp_path / "fresh" / "triton" / "X1" / "k.autotune.json").is_file()


def test_kernels_export_and_import_commands_say_what_they_did_and_refuse_in_one_line(tmp_path, capsys):
    tuned_cache(tmp_path / "a")
    assert main(["kernels", "export", str(tmp_path / "t.tar.gz"), "--kernel-cache", str(tmp_path / "a"),
                 "--gpu", "NVIDIA H200"]) == 0
    assert "exported 2 autotune results of 2 kernels (tuned on NVIDIA H200;" in capsys.readouterr().out
    assert main(["kernels", "import", str(tmp_path / "t.tar.gz"), "--kernel-cache", str(tmp_path / "b"),
                 "--gpu", "NVIDIA H200"]) == 0
    assert "2 autotune results added, 0 already there, 1 warmed shapes recorded" in capsys.readouterr().out
    assert main(["kernels", "import", str(tmp_path / "t.tar.gz"), "--kernel-cache", str(tmp_path / "c"),
                 "--gpu", "NVIDIA A100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "GPU NVIDIA H200 (here NVIDIA A100): nothing imported" in err
    assert main(["kernels", "import", str(tmp_path / "missing.tar.gz"), "--gpu", "NVIDIA H200"]) == 2
    assert "missing.tar.gz: no such file" in capsys.readouterr().err


def test_the_shipped_tunings_were_measured_with_versions_the_gpu_extra_allows():
    tomllib = pytest.importorskip("tomllib")

    archives = tunings.shipped_archives()
    assert archives, "k3lab ships the tunings measured on an H200"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    from packaging.requirements import Requirement

    ranges = {req.name: req.specifier for req in map(Requirement, extra)}
    for archive in archives:
        manifest, members = tunings.read_archive(archive)
        assert manifest["gpu"].startswith("NVIDIA") and members
        assert manifest["versions"]["triton"] in ranges["triton"]
        assert manifest["versions"]["fla"] in ranges["flash-linear-attention"]


def model_code_copy(folder: Path, monkeypatch) -> None:
    """The model code's files copied under `folder`, which the warm record's key then reads."""
    for source in model_code_files():
        copy = folder / source.relative_to(ROOT / "k3lab")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(source.read_text())
    monkeypatch.setattr(kernel_cache, "MODEL_CODE", folder)


def test_an_edit_of_the_model_codes_prose_keeps_the_warm_records_key_and_an_edit_of_its_code_does_not(
        tmp_path, monkeypatch):
    model_code_copy(tmp_path, monkeypatch)
    before = kernel_cache.toolchain_fingerprint()
    model = tmp_path / "model" / "model.py"
    source = model.read_text()
    prose = source.replace('"""', '"""A new first line.\n\n', 1)  # the module docstring, lines shifted
    first_def = prose.index("\ndef ")
    prose = prose[:first_def] + "\n\n# a comment on its own line\n" + prose[first_def:]
    assert "\nimport torch\n" in prose
    model.write_text(prose.replace("\nimport torch\n", "\nimport torch  # and one after the code\n", 1))
    assert kernel_cache.toolchain_fingerprint() == before
    model.write_text(source.replace("def ", "def _", 1))  # a function renamed
    assert kernel_cache.toolchain_fingerprint() != before


@pytest.mark.parametrize("path", ["model/model.py", "ops/attn_res/kernel.py", "ops/kda/fused.py", "optim/muon.py",
                                  "compiling.py"])
def test_the_warm_records_key_covers_the_model_its_ops_and_the_optimizer(path, tmp_path, monkeypatch):
    model_code_copy(tmp_path, monkeypatch)
    before = kernel_cache.toolchain_fingerprint()
    (tmp_path / path).write_text((tmp_path / path).read_text() + "\nEXTRA = 1\n")
    assert kernel_cache.toolchain_fingerprint() != before


def test_the_code_text_keeps_code_and_drops_comments_docstrings_and_blank_lines():
    from k3lab.runner.runtime.model_code import code_text

    source = ('"""Module."""\n\nimport torch  # why\n\n\nclass A:\n    """Class,\n    two lines."""\n\n'
              '    def f(self):\n        """F."""\n        return "#not a comment"  # a comment\n')
    assert code_text(source) == ('import torch\nclass A:\n    def f(self):\n        return "#not a comment"')
