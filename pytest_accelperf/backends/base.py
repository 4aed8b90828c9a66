"""The backend protocol and registry.

A backend says whether it can run here (and, if not, exactly what to install) without
importing its framework, so collection stays fast and a missing framework becomes a skip
with a reason rather than an ImportError.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_accelperf.accel import Accelerator
from pytest_accelperf.cases import Case
from pytest_accelperf.run import Run


@dataclass
class TrainResult:
    """A run plus what is needed for in-memory checks (never stored): final parameters as a
    flat ``{path: numpy array}`` dict, and those of a single-device reference run when the
    case asked for one."""

    run: Run
    params: dict[str, Any] = field(default_factory=dict)
    reference_params: dict[str, Any] | None = None


@dataclass
class Fit:
    """Whether one batch size fits on the device: the answer of :meth:`Backend.fits`.

    ``required_bytes`` is the peak per device (the largest over devices/ranks) that the case
    needs, when it could be measured or predicted; ``capacity_bytes`` what it was compared
    with; ``message`` what was seen (an out-of-memory error's first line, say).
    """

    fits: bool
    required_bytes: int | None = None
    capacity_bytes: int | None = None
    message: str = ""


class Backend(Protocol):
    """What the plugin needs of a framework."""

    name: str

    def unavailable_reason(self) -> str | None:
        """None when usable here, else a sentence naming what to install."""

    def train(self, case: Case, task: Any, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        """Train ``task`` as ``case`` on ``accel`` and measure it.

        ``timeout`` (seconds, None for no limit) bounds the whole training; when it runs
        out the backend returns a run with outcome ``timeout`` and what it measured so far
        (it never raises for it). Backends that train in subprocesses kill them; in-process
        backends stop at the next step boundary.
        """

    def fits(self, case: Case, task: Any, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Whether ``case`` (at ``case.batch``) fits in device memory: against the runtime's
        capacity, or ``case.memory_capacity`` where the runtime has no counter (CPU). Used
        by the maximum-batch search; as cheap as the backend can make it (a compile and a
        memory analysis, or a step or two)."""


@dataclass(frozen=True)
class _LazyBackend:
    """Registry entry: the module path and the packages it needs, checked by find_spec."""

    name: str
    module: str
    requires: tuple[str, ...]
    install: str
    #: Whether every case trains in processes the backend launches (DeepSpeed), not only
    #: those with ``world_size > 1``.
    launches_ranks: bool = False

    def trains_in_process(self, case: Case) -> bool:
        """Whether ``case`` trains in the calling process, where a blocked step blocks
        the caller; launched ranks are killed at the timeout by the launcher itself."""
        return case.world_size == 1 and not self.launches_ranks

    def unavailable_reason(self) -> str | None:
        missing = [p for p in self.requires if importlib.util.find_spec(p) is None]
        if missing:
            return (
                f"backend {self.name!r} needs {', '.join(missing)}, which is not installed: "
                f"{self.install}"
            )
        return None

    def load(self) -> Backend:
        module = importlib.import_module(self.module)
        backend: Backend = module.BACKEND
        return backend


BACKENDS: dict[str, _LazyBackend] = {
    "jax": _LazyBackend(
        "jax", "pytest_accelperf.backends.jax", ("jax", "flax", "optax"),
        "pip install 'pytest-accelperf[jax]'",
    ),
    "torch": _LazyBackend(
        "torch", "pytest_accelperf.backends.torch", ("torch",),
        "pip install 'pytest-accelperf[torch]' (install torch first: pip install torch==2.13.0 "
        "for CPU)",
    ),
    "deepspeed": _LazyBackend(
        "deepspeed", "pytest_accelperf.backends.deepspeed", ("torch", "deepspeed", "cloudpickle"),
        "pip install 'pytest-accelperf[deepspeed]' (install torch first: pip install "
        "torch==2.13.0 for CPU)", launches_ranks=True,
    ),
    # Trainium / Inferentia through torch-xla; torch-neuronx is on AWS's own index only
    # (the PyPI name is a placeholder).
    "neuron": _LazyBackend(
        "neuron", "pytest_accelperf.backends.neuron", ("torch", "torch_xla", "torch_neuronx"),
        "pip install torch-neuronx --extra-index-url https://pip.repos.neuron.amazonaws.com "
        "(on a Trainium/Inferentia instance with the Neuron driver)",
    ),
    "alpa": _LazyBackend(
        "alpa", "pytest_accelperf.backends.alpa", ("alpa", "jax", "flax", "optax", "ray"),
        "Alpa needs Python <= 3.9 and jax 0.3.x (this is Python "
        f"{sys.version_info.major}.{sys.version_info.minor}): in a Python 3.9 environment, "
        "pip install alpa and its jaxlib build (https://alpa.ai/install.html)",
    ),
    "jax-pipeline": _LazyBackend(
        "jax-pipeline", "pytest_accelperf.backends.pipeline", ("jax", "flax", "optax"),
        "pip install 'pytest-accelperf[jax]'",
    ),
    # Measurements taken outside the plugin (accelperf.ingest): nothing to import.
    "external": _LazyBackend("external", "pytest_accelperf.backends.external", (), ""),
}


def get_backend(name: str) -> _LazyBackend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(
            f"unknown backend {name!r}; available: {', '.join(sorted(BACKENDS))}"
        ) from None
