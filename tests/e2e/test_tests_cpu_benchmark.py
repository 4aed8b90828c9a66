"""benchmarks/tests_cpu.py end to end: loaded into a pytest session it writes a line per
test with the machine's busy time around it, and its summary tells a test that keeps a
core busy from one that waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "tests_cpu.py"

SUITE = '''
import time

def test_spins():
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        pass

def test_sleeps():
    time.sleep(3.5)
'''


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads /proc/stat (Linux)")
def test_a_spinning_test_costs_cpu_and_a_sleeping_one_waits(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_two=SUITE)
    out = pytester.path / "tests-cpu.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]), "TESTS_CPU_OUT": str(out)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests_cpu", "-p", "no:xdist",
                          "-p", "no:cacheprovider", "-q", "test_two.py"], cwd=pytester.path,
                         env=env, capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"test_two.py::test_spins", "test_two.py::test_sleeps"}
    spins, sleeps = rows["test_two.py::test_spins"], rows["test_two.py::test_sleeps"]
    assert spins["wall"] >= 1.0 and spins["cpu"] >= 0.9  # its own core, at least
    assert sleeps["wall"] >= 3.5

    summary = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    assert summary.startswith("2 tests: ")
    assert "test_two.py::test_spins" in summary.split("tests by CPU:")[1]
    if sleeps["cpu"] < 0.6 * sleeps["wall"]:  # the machine quiet enough to see the wait
        assert "tests that mostly wait (over 3 s, under 0.6 cores): 1," in summary


def test_a_missing_file_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.jsonl")],
                         capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].endswith(
        "none.jsonl: no such file (run the tests with -p tests_cpu first)")
