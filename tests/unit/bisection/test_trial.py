"""One session at one commit (``bisection/trial.py``): the pytest options it refuses, and a
failed session summed up by its error line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pytest_accelperf.bisection.trial import own_option, summary


def test_own_options_are_refused_and_others_pass() -> None:
    assert own_option(["t.py", "--accel=cpu", "-k", "x", "--accelperf-compare-block=3"]) \
        is None
    refused = own_option(["t.py", "--accelperf-compare-budget=5"])
    assert refused is not None and "pass accelperf bisect --budget" in refused


def test_a_failed_session_is_summed_up_by_its_error_line(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text("collecting ...\n_____ ERROR collecting t.py _____\nImportError while "
                   "importing test module\nE   ModuleNotFoundError: No module named 'x'\n"
                   "=== short test summary info ===\nERROR t.py\n!!! Interrupted: 1 error "
                   "during collection !!!\n")
    assert summary(log) == "ModuleNotFoundError: No module named 'x'"
    usage = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                            "--nosuchoption"], cwd=tmp_path, capture_output=True, text=True,
                           check=False)
    log.write_text(usage.stdout + usage.stderr)
    assert summary(log) == "python -m pytest: error: unrecognized arguments: --nosuchoption"
    log.write_text("something\nthe end\n")
    assert summary(log) == "the end"
    assert summary(tmp_path / "none.log") == "(no output)"
