"""bench/profile_step.py: the step's profile by AttnRes variant, run on CPU (the tiny preset, one step)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_profile_runs_each_variant_and_adds_a_dated_journal_entry_with_its_command(tmp_path):
    journal = tmp_path / "journal.md"
    journal.write_text("# Notes\n\nAn earlier entry.\n")
    command = [sys.executable, "bench/profile_step.py", "--row", "tiny@1x16", "--variants", "off,bs2", "--steps", "1",
               "--warmup", "1", "--top", "3", "--journal", str(journal)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    text = journal.read_text()
    assert text.startswith("# Notes\n\nAn earlier entry.\n")  # added, nothing replaced
    assert "## Step profile by AttnRes variant, CPU (" in text
    assert "Command: `python bench/profile_step.py --row tiny@1x16 --variants off,bs2" in text
    off, bs2 = text.split("### off")[1].split("### bs2")
    assert "failed" not in text
    assert "tokens/s" in off and "of off's tokens/s" not in off  # off is the baseline
    assert "of off's tokens/s" in bs2 and "ms a step against off" in bs2
    off_ms, bs2_ms = (float(re.search(r"([\d.]+) ms a step", part).group(1)) for part in (off, bs2))
    delta = float(re.search(r"([-+][\d.]+) ms a step against off", bs2).group(1))
    assert abs(delta - (bs2_ms - off_ms)) <= 0.16  # each figure is rounded to 0.1 ms; bs2 is set against off's row, not its own
    assert bs2.count("\n| `") == 3  # --top 3: the ops with the most CPU time on a CPU (aten ops, Muon's step)
