"""``import pytest_accelperf`` stays light (the CLI's commands start with it): the runner,
the checks, numpy and scipy are imported when a name needs them, and every public name
still resolves to what it names."""

from __future__ import annotations

import subprocess
import sys

import pytest_accelperf
import pytest_accelperf.checks as checks_pkg

HEAVY = ("pytest_accelperf.runner", "pytest_accelperf.checks.table", "numpy", "scipy",
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
    loaded = _loaded_after("import pytest_accelperf.cases\nfrom pytest_accelperf import cases\n"
                           "assert callable(cases) and cases.__module__ == "
                           "'pytest_accelperf.cases', cases")
    assert "pytest_accelperf.cases" in loaded
