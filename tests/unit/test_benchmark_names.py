"""benchmarks/ is put on ``sys.path`` (its scripts import each other, some tests import
them), and child processes inherit that path: a script named after a standard-library
module shadows it in every one of them (``benchmarks/bisect.py`` once made every rank child
and Ray worker of the test run die importing ``random``)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_benchmark_script_shadows_a_standard_library_module() -> None:
    names = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    names |= {p.name for p in (ROOT / "benchmarks").iterdir() if (p / "__init__.py").exists()}
    assert names, "no benchmark scripts found"
    assert not names & set(sys.stdlib_module_names), sorted(names & set(sys.stdlib_module_names))
