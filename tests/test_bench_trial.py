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
