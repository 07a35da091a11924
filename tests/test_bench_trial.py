"""bench/bench_trial.py's command line: what it refuses before any GPU work."""

from __future__ import annotations

import pytest
from conftest import bench_script


@pytest.mark.parametrize("rows", ["small@64x1024:graph:compile", "small@16x512,small@64x1024:graphfb"])
def test_bench_trial_refuses_graph_rows_whose_capture_would_be_timed(monkeypatch, capsys, rows):
    bench_trial = bench_script("bench_trial")
    monkeypatch.setattr("sys.argv", ["bench_trial.py", "--rows", rows, "--warmup", "2"])
    with pytest.raises(SystemExit) as exit_:
        bench_trial.parse_args()
    assert exit_.value.code == 2
    assert "--warmup 2: a graph or graphfb row captures its step on the third step" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["bench_trial.py", "--rows", rows, "--warmup", "3"])
    assert bench_trial.parse_args().warmup == 3
    monkeypatch.setattr("sys.argv", ["bench_trial.py", "--rows", "small@16x512:compile", "--warmup", "1"])
    assert bench_trial.parse_args().warmup == 1  # no graph: nothing captured


def test_attn_res_variant_options_set_the_fields_the_sweep_axis_sets(monkeypatch):
    bench_trial = bench_script("bench_trial")
    row = bench_trial.parse_row("small@64x1024:graph:bs4:compile")
    assert bench_trial.attn_res_variant(row["options"]) == "bs4"
    assert bench_trial.attn_res_overrides(row["options"]) == {"use_attn_res": True, "attn_res_block_size": 4}
    assert bench_trial.attn_res_overrides(["full"]) == {"use_attn_res": True, "attn_res_block_size": 1}
    assert bench_trial.attn_res_overrides(["off"]) == {"use_attn_res": False}
    assert bench_trial.attn_res_overrides(["graph"]) == {}
    for bad in ("small@64x1024:bs0", "small@64x1024:off:full"):
        with pytest.raises(ValueError):
            bench_trial.parse_row(bad, error=bench_trial.raise_value_error)


def test_variant_rows_run_on_cpu_in_one_run_and_write_their_share_of_offs_tokens(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    doc, saved = tmp_path / "benchmarks.md", tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "bench/bench_trial.py", "--rows", "tiny@1x16:off,tiny@1x16:bs2", "--steps",
                           "1", "--warmup", "1", "--top", "3", "--json", str(saved), "--write-variants",
                           "--doc", str(doc)], cwd=root, capture_output=True, text=True, env=bench_env(root))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(saved.read_text())["rows"]
    assert [(row, code) for row, code, _ in rows] == [("tiny@1x16:off", "after"), ("tiny@1x16:bs2", "after")]
    assert all(r["tokens_per_s"] > 0 and r["top_kernels"] for _, _, r in rows)
    text = doc.read_text()
    share = rows[1][2]["tokens_per_s"] / rows[0][2]["tokens_per_s"]
    assert "| tiny@1x16 | after | off |" in text and "| 100.0% |" in text
    assert f"| {share:.1%} |" in text and "## AttnRes variants against off: CPU" in text
    assert "Trial step: presets on one GPU" not in text  # --write-variants: the variants' table alone


def bench_env(root) -> dict:
    import os

    return dict(os.environ, PYTHONPATH=str(root))
