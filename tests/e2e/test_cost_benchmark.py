"""The cost benchmark (benchmarks/cost.py) end to end on its torch cases: every second of a
case's wall time is in exactly one column, and the user's parts (build, batches) are
measured, not assumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


# timing: the split is of measured times, and beside CI's background jobs and the other
# worker (a host lock waited for, a confirmation's re-measurement) one case's parts once
# added up to more than its wall time (CI of 8ff1d34: plugin share -8.5 %), where alone
# and in every earlier run they did not.
@pytest.mark.slow
@pytest.mark.timing
def test_a_cases_wall_time_is_split_without_remainder(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cost.py"),
                           "--kinds", "torch", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| torch | torch-nomesh-b8 | 2 | 20 |" in proc.stdout  # the phase table
    (result,) = tmp_path.glob("cost-*.json")
    rows = json.loads(result.read_text())["rows"]
    assert [r["case"] for r in rows] == ["torch-nomesh-b32", "torch-nomesh-b8"]
    for row in rows:
        assert row["outcome"] == "ok" and row["n_steps"] == 20
        user = (row["build"] + row["compile"] + row["trace"] + row["batches"] + row["steps"]
                + row["confirm"])
        assert user + row["plugin"] == pytest.approx(row["wall"] - row["lock"], abs=1e-9)
        parts = row["phases"]
        assert sum(parts.values()) == pytest.approx(row["plugin"], abs=1e-9)
        assert row["batches"] > 0 and row["steps"] > 0 and parts["memory"] > 0
        assert 0 < row["share"] < 1
