"""benchmarks/device.py (issue 38) runs unchanged on the CPU: every phase writes its
figures to the results file as it ends, and a GPU that is asked for and absent is one line
naming what was looked for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device.py"


def test_a_gpu_that_is_not_there_is_one_line() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--accel=gpu"], capture_output=True,
                          text=True, timeout=300, check=False)
    if "no GPU is visible" not in done.stderr:
        pytest.skip("a GPU is visible here")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("device.py: --accel=gpu: no GPU is visible to this process; "
                               "looked for: jax")


#: Seconds per phase. Beside other work (the other xdist worker, its host lock) the phases
#: ran to their --quick bounds of 90, 45, 120 and 60 s (the test took 305 s under -n 2, and
#: 354 s alone at load 6-7 with a lock of its own); what is asserted is that each phase,
#: finished or cut short at its bound, writes its figures. At 40 s a phase was cut short
#: on a loaded machine all the same (2026-11-30, load 6-9: the suites' recording session,
#: the A/B session waiting for the host lock and both determinism takes interrupted; the
#: test 137 s in CI), so 15 s shows as much, and that each phase keeps to its bound.
PHASE_BUDGET = 15
#: A phase's pytest session gets SIGINT at its bound and 20 s more before it is killed;
#: the rest is the phase's own work around it (the A/B phase's git repository) at CI's load.
PHASE_GRACE = 30

@pytest.mark.slow
def test_every_phase_writes_its_figures_on_the_cpu(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--accel=cpu", "--quick",
                           f"--phase-budget={PHASE_BUDGET}", f"--out={tmp_path}"],
                          capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("device-cpu-*.json")
    data = json.loads(path.read_text())
    assert data["device"] == "cpu" and data["quick"] is True
    assert data["budgets_s"] == dict.fromkeys(("suites", "noise", "ab", "determinism"),
                                              float(PHASE_BUDGET))
    phases = data["phases"]
    assert sorted(phases) == ["ab", "determinism", "noise", "suites"]
    for name, figures in phases.items():
        assert "error" not in figures, (name, figures)
        assert 0 <= figures["wall_s"] <= PHASE_BUDGET + PHASE_GRACE, (name, figures)
        assert "load_before" in figures
    assert set(phases["suites"]["sessions"]) <= {"record", "check"}
    assert "record" in phases["suites"]["sessions"]
    for framework in ("jax", "torch"):
        noise = phases["noise"][framework]
        assert noise["device_clock"] in ("no device clock on the CPU", None)
        assert isinstance(noise["per_process"], list)
    assert phases["ab"]["slowdowns"] == [0.0, 0.05]
    assert isinstance(phases["ab"]["summary"], list)
    assert isinstance(phases["determinism"]["cases"], dict)
