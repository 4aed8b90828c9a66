"""The backend protocol, and what training returns.

What a backend needs installed, and what it can do, is its spec's
(:mod:`pytest_accelperf.backends.spec`), checked without importing its framework, so
collection stays fast and a missing framework becomes a skip with a reason rather than an
ImportError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeGuard

from pytest_accelperf.collect.cases import Case
from pytest_accelperf.provision.accel import Accelerator
from pytest_accelperf.records.program import ProgramRecord
from pytest_accelperf.records.run import Run

if TYPE_CHECKING:
    import numpy as np

#: What a test hands to ``accelperf.train(task)``: whatever its case's backend trains.
#:
#: The plugin never looks inside a task. The runner, the routing, the hang guard, the
#: explanation, A/B mode and the Ray dispatch only pass it on (in this process, to ranks it
#: launches, pickled to a worker), and only the backend reads it: it narrows the task to
#: what it trains and refuses anything else with a
#: :class:`~pytest_accelperf.backends.measure.common.TaskError` naming what it takes. The
#: built-in backends train a ``JaxStep`` (or anything whose ``to_step()`` gives one: a
#: ``JaxTask``, ``nnx_step(...)``), a ``PipelineTask``, a ``TorchStep`` or ``TorchTask``, a
#: ``RankStep`` (DDP, DeepSpeed); a backend of a conftest trains what it likes (a dict, in
#: this project's own tests and in docs/backends.md). So the narrowest type every task
#: has is ``object``; named ``Task`` so that mypy refuses any use of a task's attributes
#: outside the backend that narrowed it (``isinstance``, ``as_step``, ``as_torch_step``,
#: ``as_rank_step``), where ``Any`` let every call through unchecked.
Task: TypeAlias = object


@dataclass
class TrainResult:
    """A run plus what is needed for in-memory checks (never stored): final parameters as a
    flat ``{path: numpy array}`` dict, and those of a single-device reference run when the
    case asked for one. The JAX backend's reference is a
    :class:`~pytest_accelperf.records.reference.ReferenceParams` (a dict of the same kind)
    that also carries the sharded run's parameters after the same ``Case.reference_steps``
    steps, which the ``reference`` check compares instead of the final ``params``."""

    run: Run
    params: dict[str, np.ndarray] = field(default_factory=dict)
    reference_params: dict[str, np.ndarray] | None = None
    #: What the test gets back as ``CaseResult.state``: the trained model or module, a
    #: ``JaxStep``'s final state (``final`` of it). It stays in the process that trained
    #: it: pickling (a result sent back from a launched process or a cluster worker) drops
    #: it.
    state: Any = None
    #: A trainer's (Lightning, transformers, Keras): the lines saying what the gate set in
    #: the user's place.
    notes: list[str] = field(default_factory=list)

    def __getstate__(self) -> dict[str, object]:
        data = dict(self.__dict__)
        data["state"] = None
        return data


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

    def train(self, case: Case, task: Task, accel: Accelerator, *,
              timeout: float | None = None) -> TrainResult:
        """Train ``task`` as ``case`` on ``accel`` and measure it.

        ``timeout`` (seconds, None for no limit) bounds the whole training; when it runs
        out the backend returns a run with outcome ``timeout`` and what it measured so far
        (it never raises for it). Backends that train in subprocesses kill them; in-process
        backends stop at the next step boundary.
        """

    def fits(self, case: Case, task: Task, accel: Accelerator, *,
             timeout: float | None = None) -> Fit:
        """Whether ``case`` (at ``case.batch``) fits in device memory: against the runtime's
        capacity, or ``case.memory_capacity`` where the runtime has no counter (CPU). Used
        by the maximum-batch search; as cheap as the backend can make it (a compile and a
        memory analysis, or a step or two)."""


class Stepper(Protocol):
    """A case's step trained on demand in blocks of steps: what A/B mode alternates
    between two revisions and an explanation traces. The in-process backends' steppers
    are each a :class:`~pytest_accelperf.backends.measure.stepper.BlockStepper`."""

    @property
    def program(self) -> ProgramRecord | None:
        """The step's program record, for A/B mode's diff; None where there is none (a
        conftest's backend may leave it out: A/B mode then diffs no program)."""

    def run(self, n: int) -> list[float]:
        """Train ``n`` more steps; their step times in seconds."""


class SteppingBackend(Backend, Protocol):
    """A backend whose spec declares ``ab_blocks``: it can give a case's step as a
    :class:`Stepper`."""

    def stepper(self, case: Case, task: Task, accel: Accelerator) -> Stepper:
        """The case's step, built, compiled where it compiles, ready to :meth:`~Stepper.run`."""


def steps_in_blocks(backend: Backend) -> TypeGuard[SteppingBackend]:
    """Whether ``backend`` has a :meth:`~SteppingBackend.stepper`."""
    return callable(getattr(backend, "stepper", None))
