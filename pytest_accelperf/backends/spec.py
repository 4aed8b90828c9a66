"""A backend as one self-describing unit: :class:`BackendSpec`.

A spec says, without importing the framework, everything the plugin needs to know about a
backend: what it needs installed (and the command that installs it), which packages'
versions make its throughput comparable, and what it can do (train in the calling process,
train a ``world_size > 1`` case in ranks, run A/B blocks of steps, train on a Ray cluster).
The plugin decides from these declarations alone where a case trains
(:mod:`pytest_accelperf.gate.routing`); nothing outside a backend switches on its name.

Specs are registered through the ``pytest_accelperf_backends`` hook
(:mod:`pytest_accelperf.hookspecs`); the built-in ones too
(:mod:`pytest_accelperf.backends.builtin`).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pytest_accelperf.errors import UserError

if TYPE_CHECKING:
    from pytest_accelperf.backends.procs.ranks import RankTrainer
    from pytest_accelperf.backends.protocol import Backend

#: A backend name: what ``Case(backend=...)`` says and the case id starts with.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
#: ``package.module`` or ``package.module:attribute``.
_REF = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?\Z")


class BackendSpecError(UserError, ValueError):
    """A spec that cannot be registered or loaded as written (the message says the fix)."""


def _import_ref(ref: str, default: str, what: str) -> object:
    """The object ``ref`` names: ``module:attr``, or ``module``'s ``default`` attribute."""
    module_name, _, attr = ref.partition(":")
    attr = attr or default
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise BackendSpecError(
            f"{what}: module {module_name} ({getattr(module, '__file__', '?')}) has no "
            f"{attr}; define {attr} there or name the object as '{module_name}:NAME'"
        ) from None


@dataclass(frozen=True)
class BackendSpec:
    """One backend: its name, where its code is, what it needs, and what it can do.

    ``module`` is the importable module whose ``BACKEND`` implements
    :class:`~pytest_accelperf.backends.protocol.Backend` (or ``"module:NAME"`` for another
    attribute); it is imported only when a case of the backend trains. Instead of a
    module, ``backend`` may be the backend object itself (a conftest's own class): such a
    backend trains in pytest's processes (in-process, local ranks, under xdist) but not in
    processes outside pytest (Ray workers, A/B workers), which import backends by module.

    ``requires`` are import names checked with ``importlib.util.find_spec`` at collection
    (a missing one skips the backend's cases with ``install``, the command that fixes it);
    ``packages`` the distributions whose versions make a step time comparable with a
    baseline's (None: every package the fingerprint records).

    What it can do:

    * ``in_process``: ``train`` runs the steps in the calling process, where the plugin
      interrupts a step that blocks past the timeout; False when ``train`` launches
      processes of its own and stops them itself (DeepSpeed).
    * ``ranks``: the module (``RANKS``, or ``"module:NAME"``) of the
      :class:`~pytest_accelperf.backends.procs.ranks.RankTrainer` that trains a case with
      ``world_size > 1``, in ranks the plugin launches on this machine or as Ray actors;
      None: the backend has no multi-process training of its own.
    * ``ab_blocks``: the backend has ``stepper(case, task, accel)`` whose ``run(n)``
      trains ``n`` more steps and returns their times (A/B mode, ``--accelperf-compare``).
    * ``ray``: its cases may train on a Ray cluster (``--accelperf-cluster``).
    * ``compile_only``: its ``train`` compiles a case for a compile-only target
      (``--accelperf-target``: :attr:`Accelerator.compile_only
      <pytest_accelperf.provision.accel.Accelerator.compile_only>` set) and runs no step; the
      cases of a backend without it are skipped under a target.
    """

    name: str
    module: str | None = None
    requires: tuple[str, ...] = ()
    install: str = ""
    packages: tuple[str, ...] | None = None
    in_process: bool = True
    ranks: str | None = None
    ab_blocks: bool = False
    ray: bool = True
    backend: Backend | None = None
    compile_only: bool = False

    def __post_init__(self) -> None:
        where = f"BackendSpec(name={self.name!r})"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise BackendSpecError(
                f"{where}: a backend name is letters, digits and '-', '_', '.' (it starts "
                f"case ids), e.g. 'numpy-sgd'")
        if (self.module is None) == (self.backend is None):
            raise BackendSpecError(
                f"{where}: give exactly one of module= (an importable module path) and "
                f"backend= (the backend object)")
        for field_name in ("module", "ranks"):
            ref = getattr(self, field_name)
            if ref is not None and (not isinstance(ref, str) or not _REF.match(ref)):
                raise BackendSpecError(
                    f"{where}: {field_name}={ref!r} is not 'package.module' or "
                    f"'package.module:NAME'")
        for field_name in ("requires", "packages"):
            value = getattr(self, field_name)
            if value is None and field_name == "packages":
                continue
            if not isinstance(value, tuple | list) or not all(isinstance(v, str) for v in value):
                raise BackendSpecError(
                    f"{where}: {field_name} is a tuple of names, e.g. ('numpy',), not "
                    f"{value!r}")
            object.__setattr__(self, field_name, tuple(value))
        for flag in ("in_process", "ab_blocks", "ray", "compile_only"):
            if not isinstance(getattr(self, flag), bool):
                raise BackendSpecError(f"{where}: {flag} is True or False, not "
                                       f"{getattr(self, flag)!r}")

    @property
    def origin(self) -> str:
        """Where the backend's code is, in words (for messages)."""
        if self.module is not None:
            return f"module {self.module}"
        kind = type(self.backend)
        return f"an object of {kind.__module__}.{kind.__qualname__}"

    @property
    def importable(self) -> bool:
        """Whether a process outside pytest (a Ray or A/B worker) can load the backend:
        it is named by ``module``, not given as an object."""
        return self.module is not None

    def unavailable_reason(self) -> str | None:
        """None when the backend can run here, else a sentence naming what to install."""
        missing = [p for p in self.requires if importlib.util.find_spec(p) is None]
        if missing:
            fix = self.install or f"pip install {' '.join(missing)}"
            return (f"backend {self.name!r} needs {', '.join(missing)}, which is not "
                    f"installed: {fix}")
        return None

    def load(self) -> Backend:
        """The backend object (its module is imported now, not at registration)."""
        if self.backend is not None:
            return self.backend
        assert self.module is not None
        # What the spec names is taken for a backend as it is: a Protocol cannot be checked.
        return cast("Backend", _import_ref(self.module, "BACKEND", f"backend {self.name!r}"))

    def load_ranks(self) -> RankTrainer:
        """The trainer of ``world_size > 1`` cases (``ranks``); refuses a spec without."""
        if self.ranks is None:
            raise BackendSpecError(f"backend {self.name!r} declares no ranks: it cannot train "
                                   f"a case with world_size > 1")
        return cast("RankTrainer", _import_ref(self.ranks, "RANKS",
                                             f"the ranks of backend {self.name!r}"))

    def spans_ranks(self, world_size: int) -> bool:
        """Whether a case of ``world_size`` trains in this backend's ranks."""
        return world_size > 1 and self.ranks is not None

    def check_importable(self, where: str) -> None:
        """Refuse a spec that a process outside pytest (``where``: a Ray worker, an A/B
        worker), which imports the backend by module, cannot load."""
        if not self.importable:
            raise BackendSpecError(
                f"backend {self.name!r} was registered as an object (BackendSpec(backend=...)), "
                f"which {where} cannot import: register it with module='your_module' (the "
                f"module defining BACKEND, importable from sys.path there)")
