"""A plain-JAX user (jax and optax, no flax: Equinox, Haiku, their own pytrees): the jax
backends require jax and optax only, and ``nnx_step``, the one thing that needs flax,
fails in one line naming the install. flax is hidden from a fresh interpreter
(``sys.modules["flax"] = None``), so no training runs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib.machinery import ModuleSpec

import pytest

from pytest_accelperf.backends.registry import BACKENDS

pytest.importorskip("jax")
pytest.importorskip("optax")


@pytest.mark.parametrize("name", ["jax", "jax-pipeline"])
def test_the_jax_backends_need_no_flax(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's input: ``backend 'jax' needs flax, which is not installed`` skipped a
    case whose task used jax and optax only."""
    find = importlib.util.find_spec

    def without_flax(module: str, package: str | None = None) -> ModuleSpec | None:
        return None if module.split(".")[0] == "flax" else find(module, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_flax)
    assert BACKENDS[name].unavailable_reason() is None
    assert "flax" not in BACKENDS[name].requires


HIDDEN = """
import json, sys
sys.modules["flax"] = None  # import flax fails, find_spec says it is not there
from pytest_accelperf.backends.jax.backend import BACKEND
from pytest_accelperf.backends.measure.common import TaskError
from pytest_accelperf.jax import JaxStep, JaxTask, nnx_step
try:
    nnx_step(lambda model, batch: 0.0, lambda: (), make_batch=lambda step: {})
    said = None
except TaskError as exc:
    said = str(exc)
print(json.dumps({"backend": BACKEND.unavailable_reason(), "nnx_step": said,
                  "flax": "flax.nnx" in sys.modules}))
"""


def test_without_flax_the_backend_runs_and_nnx_step_names_the_install() -> None:
    proc = subprocess.run([sys.executable, "-c", HIDDEN], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["backend"] is None
    assert got["nnx_step"] == ("nnx_step needs flax, which is not installed: pip install flax "
                               "(or pip install 'pytest-accelperf[jax]')")
    assert not got["flax"]
