"""``accelperf baselines show`` over a large store reads half of its files in a forked
process (cli/baselines.py's _show_parts): the same output as one walk. Store files only:
no training."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_accelperf import cli
from pytest_accelperf.store.baselines import BaselineFile, read

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "baselines" / "cpu-x8" / "suites" / "torch" / "test_deepspeed.json"

# In a fresh process (one thread: show forks only then), with the threshold at 0 bytes;
# prints FORKED to stderr when the fork context was asked for.
_FORKED = """
import multiprocessing, sys
import pytest_accelperf.cli.baselines as command
real = multiprocessing.get_context
def counted(method=None):
    print("FORKED", method, file=sys.stderr)
    return real(method)
multiprocessing.get_context = counted
command.PARALLEL_BYTES = 0
from pytest_accelperf.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_store_read_in_two_processes_shows_what_one_walk_shows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = read(COMMITTED, "cpu-x8").cases
    for platform in ("cpu-x8", "cpu-x2"):
        for i in range(5):  # a machine first seen in the second half's files too
            path = tmp_path / platform / "suites" / f"test_m{i}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            cases = {f"{k}-{i}": copy.deepcopy(b) for k, b in blocks.items()}
            if i >= 3:
                for block in cases.values():
                    block["machine"] = f"late-{platform}"
            path.write_text(BaselineFile(path, platform, cases).to_text())
    assert cli.main(["baselines", "show", "--baselines", str(tmp_path)]) == 0
    serial = capsys.readouterr().out
    assert "late-cpu-x2: " in serial and f"{10 * len(blocks)} case(s) in" in serial
    done = subprocess.run([sys.executable, "-c", _FORKED, "baselines", "show", "--baselines",
                           str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "FORKED fork" in done.stderr
    assert done.stdout == serial


# The forked reader fails: by an exception (sent back and raised here), or by exiting.
_CHILD_FAILS = """
import os, sys
import pytest_accelperf.cli.baselines as command
command.PARALLEL_BYTES = 0
parent, real = os.getpid(), command._show_part
def part(*args):
    if os.getpid() != parent:
        if sys.argv[1] == "exit":
            os._exit(3)
        raise ValueError("the second half failed")
    return real(*args)
command._show_part = part
try:
    command.cmd_show(command.argparse.Namespace(
        baselines=command.Path(sys.argv[2]), patterns=[], machine=None, platform=None),
        sys.stdout)
except (ValueError, RuntimeError) as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize(("how", "said"), [
    ("raise", "ValueError the second half failed"),
    ("exit", "RuntimeError the process that read half of the store exited with status 3")])
def test_a_failure_of_the_forked_reader_is_raised_here(how: str, said: str) -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD_FAILS, how, str(REPO / "baselines")],
                          capture_output=True, text=True, check=False, timeout=120)
    assert said in done.stdout, done.stdout + done.stderr
