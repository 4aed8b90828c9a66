"""``import pytest_accelperf`` stays light (the CLI's commands start with it): the runner,
the checks, numpy and scipy are imported when a name needs them, and every public name
still resolves to what it names. The ``accelperf`` command imports a command's module only
when that command runs: ``--help`` imports none, ``history changes`` not the store's nor
the bisection's."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest_accelperf
import pytest_accelperf.checks as checks_pkg
from pytest_accelperf.cli import build_parser
from unit.report.test_changes import line, noisy, write

HEAVY = ("pytest_accelperf.gate.runner", "pytest_accelperf.checks.table", "numpy", "scipy",
         "jax", "torch")


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\n"
                          "print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_the_package_or_a_check_base_imports_nothing_heavy() -> None:
    for code in ("import pytest_accelperf", "from pytest_accelperf import Case, cases",
                 "import pytest_accelperf.checks.base"):
        loaded = _loaded_after(code)
        assert not [m for m in HEAVY if m in loaded], code


def test_the_history_analysis_does_not_import_pytest() -> None:
    """``accelperf history changes`` imports the change-point analysis; pytest is needed
    only when the ``cases`` decorator is called (0.1-0.15 s of its start-up here)."""
    assert "pytest" not in _loaded_after("import pytest_accelperf.report.changes")
    loaded = _loaded_after("from pytest_accelperf import cases\n"
                           "cases(backend='jax', batch=[8])")
    assert "pytest" in loaded


def test_every_public_name_resolves() -> None:
    for name in pytest_accelperf.__all__:
        assert getattr(pytest_accelperf, name) is not None, name
    for name in checks_pkg.__all__:
        assert getattr(checks_pkg, name) is not None, name
    assert callable(checks_pkg.run_checks)


def test_the_cases_decorator_is_not_shadowed_by_its_module() -> None:
    loaded = _loaded_after("import pytest_accelperf.collect.cases\n"
                           "from pytest_accelperf import cases\n"
                           "assert callable(cases) and cases.__module__ == "
                           "'pytest_accelperf.collect.cases', cases")
    assert "pytest_accelperf.collect.cases" in loaded


#: What no ``accelperf`` command's parser needs: each command's own imports.
COMMANDS_OWN = ("pytest_accelperf.store.baselines", "pytest_accelperf.bisection.driver",
                "pytest_accelperf.report.html", "pytest_accelperf.report.changes",
                "pytest_accelperf.report.data", "pytest_accelperf.cli.baselines",
                "pytest_accelperf.cli.history", "scipy", "ruptures", "numpy", "pytest")

#: The argv of every ``accelperf`` help there is (with --help).
HELPS: tuple[list[str], ...] = (
    [], ["baselines"], ["baselines", "show"], ["baselines", "check"], ["baselines", "diff"],
    ["baselines", "accept"],
    ["baselines", "prune"], ["report"], ["history"], ["history", "changes"], ["bisect"],
    ["schema"])


def _run_main(argv: list[str]) -> str:
    """Python that runs ``accelperf ARGV`` in-process, its output swallowed (the module
    names are printed after it), its exit status in ``status``."""
    return ("import contextlib, io\nfrom pytest_accelperf.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        status = main({argv!r})\n"
            "    except SystemExit as exc:\n        status = exc.code\n"
            "assert status == 0, status")


def test_the_accelperf_parser_and_its_help_import_no_command() -> None:
    loaded = _loaded_after("from pytest_accelperf.cli import build_parser\nbuild_parser()")
    assert not [m for m in COMMANDS_OWN if m in loaded]
    assert "pytest_accelperf.report.detection" in loaded  # --max-pvalue's default
    for argv in HELPS:
        loaded = _loaded_after(_run_main([*argv, "--help"]))
        assert not [m for m in COMMANDS_OWN if m in loaded], argv


def test_history_changes_imports_neither_the_store_nor_the_bisection(tmp_path: Path) -> None:
    values = noisy(30, seed=3, step_at=18, step=-0.10)
    hist = write(tmp_path / "h", [line(i, sps=v) for i, v in enumerate(values)])
    loaded = _loaded_after(_run_main(["history", "changes", str(hist)]))
    assert "ruptures" in loaded and "pytest_accelperf.cli.history" in loaded  # it ran
    for module in ("pytest_accelperf.store.baselines", "pytest_accelperf.bisection.driver",
                   "pytest_accelperf.cli.baselines", "pytest_accelperf.report.html",
                   "pytest"):
        assert module not in loaded, module


def test_baselines_show_reads_the_store_from_pyproject_without_pytest(tmp_path: Path) -> None:
    """The store's directory, from ``[tool.accelperf]``, is read through the options
    table without importing pytest (0.1-0.15 s of show's start-up)."""
    store = Path(__file__).resolve().parents[2] / "baselines"
    (tmp_path / "pyproject.toml").write_text(f"[tool.accelperf]\nbaselines = {str(store)!r}\n")
    done = subprocess.run([sys.executable, "-c", f"{_run_main(['baselines', 'show'])}\n"
                           "import sys\nprint('\\n'.join(sys.modules))"],
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    loaded = set(done.stdout.split())
    assert "pytest_accelperf.gate.options" in loaded and "pytest" not in loaded


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """``(prog, func)`` of every (sub)command of ``parser`` that runs something."""
    func = parser.get_default("func")
    if func is not None:
        yield parser.prog, func
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _commands(sub)


def test_every_command_names_a_function_of_its_module() -> None:
    """A command is "MODULE:FUNCTION" of pytest_accelperf.cli, imported when it runs: a
    name that does not resolve would fail only then."""
    found = dict(_commands(build_parser()))
    assert len(found) == 11, found
    for prog, func in found.items():
        module, name = func.split(":")
        assert callable(getattr(importlib.import_module(f"pytest_accelperf.cli.{module}"),
                                name)), prog


def test_python_m_runs_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest_accelperf.cli", "schema", "--help"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage: accelperf schema"), done
