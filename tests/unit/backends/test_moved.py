"""The flat ``backends/`` paths of 0.1 still import, for one release, and warn with the new
path (``pytest_accelperf/backends/_moved.py``): every old module, and every name of the old
``backends/jax.py`` and ``backends/torch.py``, which are packages now."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from pytest_accelperf.backends._moved import ELSEWHERE, MODULES

pytest.importorskip("jax")
pytest.importorskip("torch")


def _fresh(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Forget module ``name``, so that importing it runs it again (and warns again)."""
    monkeypatch.delitem(sys.modules, name, raising=False)
    parent, _, child = name.rpartition(".")
    if hasattr(sys.modules[parent], child):
        monkeypatch.delattr(sys.modules[parent], child)


@pytest.mark.parametrize("old", sorted(MODULES))
def test_an_old_module_warns_with_its_new_path_and_gives_its_names(
        monkeypatch: pytest.MonkeyPatch, old: str) -> None:
    new = importlib.import_module(MODULES[old])
    _fresh(monkeypatch, old)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated: import from "
                                                rf"{MODULES[old]}\b") as caught:
        module = importlib.import_module(old)
    assert len(caught) == 1
    # Every public name of the new module comes through, the same object.
    names = [n for n in vars(new) if not n.startswith("__")]
    assert names
    for name in names:
        assert getattr(module, name) is getattr(new, name), name
    with pytest.raises(AttributeError, match=f"module '{old}' has no attribute 'nothing'"):
        module.nothing  # noqa: B018


def test_the_warning_points_at_the_users_import(monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(monkeypatch, "pytest_accelperf.backends.torch_step")
    with pytest.warns(DeprecationWarning,
                      match=r"\(TorchStep: pytest_accelperf\.torch\)") as caught:
        from pytest_accelperf.backends.torch_step import TorchStep
    assert caught[0].filename == __file__
    from pytest_accelperf.torch import TorchStep as new

    assert TorchStep is new


def test_ddp_still_gives_the_rank_loop_it_re_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_accelperf.backends.torch import ranks

    _fresh(monkeypatch, "pytest_accelperf.backends.ddp")
    with pytest.warns(DeprecationWarning, match=r"\(train_ddp: pytest_accelperf\.torch\)"):
        from pytest_accelperf.backends.ddp import rank_main, slice_batch
    assert (rank_main, slice_batch) == (ranks.rank_main, ranks.slice_batch)


@pytest.mark.parametrize("package", ["pytest_accelperf.backends.jax",
                                     "pytest_accelperf.backends.torch"])
def test_every_name_of_the_old_module_warns_with_where_it_is_now(package: str) -> None:
    module = importlib.import_module(package)
    assert len(ELSEWHERE[package]) > 40  # the old module's names, not a handful
    for name, where in ELSEWHERE[package].items():
        home, _, attr = where.partition(":")
        new = f"{home}.{attr or name}"
        with pytest.warns(DeprecationWarning,
                          match=rf"{package}\.{name} is deprecated: use {new};") as caught:
            value = getattr(module, name)
        assert caught[0].filename == __file__
        assert value is getattr(importlib.import_module(home), attr or name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        module.nothing  # noqa: B018


def test_the_user_facing_names_read_from_the_old_packages() -> None:
    import pytest_accelperf.jax as jax_api
    import pytest_accelperf.torch as torch_api

    with pytest.warns(DeprecationWarning, match=r"use pytest_accelperf\.jax\.JaxTask;"):
        from pytest_accelperf.backends.jax import JaxTask
    with pytest.warns(DeprecationWarning, match=r"use pytest_accelperf\.torch\.TorchTask;"):
        from pytest_accelperf.backends.torch import TorchTask
    assert (JaxTask, TorchTask) == (jax_api.JaxTask, torch_api.TorchTask)


def test_the_new_packages_and_their_modules_import_without_a_warning() -> None:
    """In a fresh interpreter, warnings as errors: the packages that replaced the old
    modules warn only when an old name is read from them, never on import (every internal
    import goes through them), and no module of the new tree imports an old path;
    ``import pytest_accelperf`` and the plugin import no framework; and
    ``pytest_accelperf.torch``, the user module, leaves ``import torch`` in the package
    to the real torch."""
    code = """
import importlib, pkgutil, sys
import pytest_accelperf, pytest_accelperf.plugin
import pytest_accelperf.backends.jax, pytest_accelperf.backends.torch
assert not {"jax", "torch"} & set(sys.modules), sorted(sys.modules)
from pytest_accelperf.backends import _moved
new = [m.name for m in pkgutil.walk_packages(pytest_accelperf.backends.__path__,
                                             "pytest_accelperf.backends.")
       if m.name not in _moved.MODULES]
for name in new:
    importlib.import_module(name)
import pytest_accelperf.torch, torch
from pytest_accelperf.backends.torch import backend
assert backend.torch is torch and torch.__file__ != pytest_accelperf.torch.__file__
print(len(new))
"""
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 30  # every module of the tree (34 on 2026-11-27)
