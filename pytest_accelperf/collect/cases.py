"""Case grids: backend x model x batch x parallelism -> parametrized pytest items.

A *case* is one point of a grid. It becomes one pytest item whose id is readable and
stable (``test_mesh_sweep[jax-mesh4x2-b1024]``): the id is also the key of the case's
baseline, so it must not depend on the order of the grid or on its siblings.
"""

from __future__ import annotations

import functools
import itertools
import math
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from pydantic import TypeAdapter, ValidationError

from pytest_accelperf.errors import ConfigError
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.verdict import Tolerances, non_negative_number

if TYPE_CHECKING:
    import pytest

MARKER = "accelperf"
#: Where DeepSpeed's ZeRO may offload to the CPU: nothing, optimizer state, parameters, both.
OFFLOADS = ("none", "optimizer", "param", "all")

#: Tolerance names a case (or ``[tool.accelperf]``) may override: every field of
#: :class:`~pytest_accelperf.records.verdict.Tolerances`.
TOLERANCE_KEYS = tuple(f.name for f in fields(Tolerances))


@dataclass(frozen=True)
class Case:
    """One training case.

    ``mesh`` is a device-mesh shape such as ``(4, 2)``; ``None`` means a single device.
    ``memory_capacity`` declares the device capacity in bytes: on an accelerator whose
    runtime has no memory counter (CPU) it is the capacity, and where the device reports
    one the smaller of the two counts (a suite written for a 16 GiB fleet keeps judging
    against 16 GiB on a larger GPU). A compiled program larger than it is recorded as a
    predicted out-of-memory. ``reference=True`` also trains the case on one device and
    checks the parameters against that run (the check of seed 004): apart from the measured
    run, the sharded program and the single-device one each train ``reference_steps`` steps
    (default 1, as the seed compares after one step; more, up to 16, until the parameters
    have moved beyond the tolerance, since parameters that have not moved match whatever the
    sharding does) from the same initial state on the same batches, and their parameters
    and the state beside them must agree within ``reference_atol``. Few steps compare
    the layout, not the chaos of training: rounding differences between the two programs
    grow with every step (a correct data-parallel CNN: max |Δ| 5.2e-6 after 2 steps,
    1.27e-2 after 32), while a sharding bug shows from the first step. A larger
    ``reference_steps`` compares later, where rounding has grown (the JAX backend; the
    multi-process and pipeline backends compare the final parameters of as many steps as
    the case trains). ``params`` is free-form configuration for the test's model builder.

    Multi-process cases (``torch`` with DDP, ``deepspeed``): ``world_size`` is the number of
    processes the plugin launches, one per device (gloo on CPU, nccl on GPU);
    ``zero_stage`` (0-3) and ``offload`` (``none``, ``optimizer``, ``param`` or ``all``)
    configure DeepSpeed's ZeRO. ``grad_clip`` is the gradient-norm clipping every backend
    applies before the optimizer step (None: no clipping; DeepSpeed's own default of 1.0 is
    never used implicitly).

    ``grad_accum`` is the number of micro-batches each rank accumulates per optimizer step
    (DeepSpeed's ``gradient_accumulation_steps``; DDP and DeepSpeed ranks): ``batch`` stays
    the global batch of one optimizer step, ``batch = micro batch x grad_accum x
    world_size``. In a single-process case (torch, JAX) no engine accumulates: the plugin
    trains the step as written, and ``grad_accum`` is a parameter of the case that the
    user's step reads for its own micro-batch loop (``accelperf.case.grad_accum``, as
    ``suites/torch/test_schedule_accum_bf16.py`` does). ``zero_init=True`` builds a ZeRO-3
    model inside ``deepspeed.zero.Init``
    (partitioned as it is created, for a model that does not fit one device); off by
    default, as DeepSpeed recommends for a model that fits.
    """

    backend: str
    batch: int
    mesh: tuple[int, ...] | None = None
    model: str = ""
    axis_names: tuple[str, ...] = ("data", "model")
    steps: int = 30
    warmup: int = 2
    label: str = ""
    memory_capacity: int | None = None
    reference: bool = False
    reference_steps: int = 1
    accels: tuple[str, ...] = ("cpu", "gpu", "tpu", "neuron")
    tolerances: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    world_size: int = 1
    zero_stage: int | None = None
    offload: str = "none"
    grad_clip: float | None = None
    grad_accum: int = 1
    zero_init: bool = False

    def __post_init__(self) -> None:
        _check_types(self)
        if self.batch <= 0:
            raise ConfigError(f"batch must be positive, got {self.batch}")
        if self.steps <= 0 or self.warmup < 0:
            raise ConfigError(f"steps must be > 0 and warmup >= 0, got {self.steps}/{self.warmup}")
        if self.mesh is not None:
            if not self.mesh or any(int(n) <= 0 for n in self.mesh):
                raise ConfigError(f"mesh must be a tuple of positive sizes, got {self.mesh!r}")
            if len(self.mesh) > len(self.axis_names):
                raise ConfigError(
                    f"mesh {self.mesh} has more axes than axis_names {self.axis_names}"
                )
        if isinstance(self.reference_steps, bool) or not isinstance(self.reference_steps, int) \
                or self.reference_steps < 1:
            raise ConfigError(f"reference_steps must be a whole number >= 1 (the steps the "
                             f"reference check compares after), got {self.reference_steps!r}")
        if self.world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {self.world_size}")
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.offload not in OFFLOADS:
            raise ConfigError(f"offload must be one of {', '.join(OFFLOADS)}, got "
                             f"{self.offload!r}")
        if self.offload != "none" and self.zero_stage is None:
            raise ConfigError(f"offload={self.offload!r} needs a ZeRO stage: set zero_stage")
        if self.offload in ("param", "all") and self.zero_stage != 3:
            raise ConfigError(f"offload={self.offload!r} offloads parameters, which only ZeRO "
                             f"stage 3 partitions: set zero_stage=3 or offload='optimizer'")
        if self.grad_clip is not None and not (0 < self.grad_clip < math.inf):
            raise ConfigError(f"grad_clip must be a finite positive number or None (no "
                             f"clipping), got {self.grad_clip!r}")
        if isinstance(self.grad_accum, bool) or not isinstance(self.grad_accum, int) \
                or self.grad_accum < 1:
            raise ConfigError(f"grad_accum must be a whole number >= 1 (micro-batches per "
                             f"optimizer step), got {self.grad_accum!r}")
        if self.zero_init and self.zero_stage != 3:
            raise ConfigError("zero_init=True builds the model inside deepspeed.zero.Init, which "
                             "partitions parameters as ZeRO stage 3 does: set zero_stage=3")
        unknown = set(self.tolerances) - set(TOLERANCE_KEYS)
        if unknown:
            raise ConfigError(
                f"unknown tolerance(s) {sorted(unknown)}; valid: {', '.join(TOLERANCE_KEYS)}"
            )
        for key, value in self.tolerances.items():
            # The check of --accelperf-loss-rtol and its ini/pyproject mirrors.
            try:
                non_negative_number(value)
            except ValueError as exc:
                raise ConfigError(
                    f"tolerances[{key!r}]: {exc} (NaN or inf would pass any change, a "
                    f"negative tolerance fails every run)") from None

    @property
    def mesh_label(self) -> str:
        if self.mesh is None:
            return f"w{self.world_size}" if self.world_size > 1 else "nomesh"
        return "mesh" + "x".join(str(n) for n in self.mesh)

    @property
    def n_devices(self) -> int:
        """Devices the case trains on: the mesh's size, or one per process."""
        if self.mesh is None:
            return self.world_size
        n = 1
        for size in self.mesh:
            n *= size
        return n

    @property
    def id(self) -> str:
        parts = [self.backend]
        if self.model:
            parts.append(self.model)
        parts.append(self.mesh_label)
        if self.zero_stage is not None:
            parts.append(f"zero{self.zero_stage}")
        if self.offload != "none":
            parts.append(f"offload_{self.offload}")
        if self.zero_init:
            parts.append("zinit")
        if self.grad_accum > 1:
            parts.append(f"ga{self.grad_accum}")
        parts.append(f"b{self.batch}")
        if self.label:
            parts.append(self.label)
        return "-".join(parts)

    def to_json(self) -> CaseJSON:
        """The case as JSON, made from its fields (all but :data:`NOT_IN_JSON`): tuples
        as lists, mappings as objects."""
        return {f.name: _json_value(getattr(self, f.name)) for f in fields(self)
                if f.name not in NOT_IN_JSON}


#: The fields of :class:`Case` its JSON leaves out: where a case may run is the suite's,
#: not a record of what ran.
NOT_IN_JSON = ("accels",)

#: A case as JSON (:meth:`Case.to_json`; ``CaseRecord.case``, a history line's ``case``):
#: its keys are :class:`Case`'s fields, which declare them once.
CaseJSON: TypeAlias = dict[str, JSONValue]


def _json_value(value: object) -> JSONValue:
    """A field's value as JSON: a tuple as a list, a mapping as an object (a parameter
    that is not JSON by nature is kept as it is: a report writes it with ``default=str``)."""
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return cast(JSONValue, value)


#: Keywords of a case as a suite gave them, checked against :class:`Case`'s fields when
#: the case is made (:func:`_case`).
_Keywords: TypeAlias = dict[str, Any]


def _case(**values: object) -> Case:
    """``Case(**values)``, an unknown keyword refused in one line that names the fields
    (a wrong type is refused by the case itself, naming the field and its type)."""
    unknown = sorted(set(values) - {f.name for f in fields(Case)})
    if unknown:
        raise ConfigError(f"unknown case keyword(s) {', '.join(unknown)}; a case takes: "
                          f"{', '.join(f.name for f in fields(Case))}")
    return Case(**cast(_Keywords, values))


def grid(
    *,
    backend: str,
    batch: Iterable[int],
    mesh: Iterable[tuple[int, ...] | None] = (None,),
    model: Iterable[str] | str = "",
    **common: object,
) -> list[Case]:
    """The cartesian product backend x model x mesh x batch as a list of cases; ``common``
    are the other fields of :class:`Case`, the same for every case (its fields are their
    one declaration: a keyword that is not one, or a value not of its type, is refused in
    one line).

    >>> [c.id for c in grid(backend="jax", mesh=[None, (4, 2)], batch=[128])]
    ['jax-nomesh-b128', 'jax-mesh4x2-b128']
    """
    if isinstance(batch, int | str) or not isinstance(batch, Iterable):
        raise ConfigError(f"batch={batch!r}: the grid takes a list of batch sizes, one case "
                          f"each: batch=[{batch!r}]")
    if isinstance(mesh, tuple) and mesh and all(isinstance(n, int) for n in mesh):
        raise ConfigError(f"mesh={mesh!r} is one mesh: the grid takes a list of meshes, one "
                          f"case each: mesh=[{mesh!r}]")
    if not isinstance(mesh, Iterable):
        raise ConfigError(f"mesh={mesh!r}: the grid takes a list of meshes (a shape such as "
                          f"(4, 2), or None for no mesh): mesh=[{mesh!r}]")
    models = [model] if isinstance(model, str) else list(model)
    return [
        _case(backend=backend, model=m, mesh=tuple(me) if me is not None else None, batch=b,
              **common)
        for m, me, b in itertools.product(models, list(mesh), list(batch))
    ]


def cases(*explicit: Case | Sequence[Case], **grid_kwargs: object) -> pytest.MarkDecorator:
    """Declare the training cases of a test; each becomes one parametrized item.

    Either keyword arguments of :func:`grid`, explicit :class:`Case` objects (or lists of
    them), or both::

        from pytest_accelperf import cases

        @cases(backend="jax", mesh=[None, (4, 2), (8, 1)], batch=[32, 128])
        def test_mesh_sweep(accelperf):
            accelperf.train(make_task(accelperf.case))
    """
    collected: list[Case] = []
    for item in explicit:
        if isinstance(item, Case):
            collected.append(item)
        else:
            collected.extend(item)
    if grid_kwargs:
        missing = [k for k in ("backend", "batch") if k not in grid_kwargs]
        if missing:
            raise ConfigError(f"cases() with grid keywords needs {' and '.join(missing)} "
                              f"(e.g. backend='jax', batch=[32])")
        collected.extend(grid(**cast(_Keywords, grid_kwargs)))
    if not collected:
        raise ConfigError("cases() needs at least one case: pass grid keywords or Case objects")
    ids = [c.id for c in collected]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"duplicate case ids {dupes}: give the cases distinct labels")
    import pytest  # here, not at the top: ``accelperf``'s commands import this module

    mark: pytest.MarkDecorator = getattr(pytest.mark, MARKER)(cases=tuple(collected))
    return mark


@functools.cache
def _field_types() -> dict[str, tuple[Any, TypeAdapter[Any]]]:
    """Each field of :class:`Case`: its type, and the schema that checks a value of it."""
    hints = typing.get_type_hints(Case)
    return {f.name: (hints[f.name], TypeAdapter(hints[f.name])) for f in fields(Case)}


def _type_name(hint: object) -> str:
    """``int``, ``tuple[int, ...] | None``: a type as the annotation reads."""
    text = hint.__name__ if isinstance(hint, type) else str(hint)
    return text.replace("typing.", "").replace("collections.abc.", "")


def _check_types(case: Case) -> None:
    """Every field has its declared type, strictly (``batch="8"``, ``batch=True`` or a
    numpy integer are refused, not converted: a case is stored as JSON, and a value that
    compares or prints differently would make another baseline key). Checked with the
    fields' own annotations, by pydantic."""
    for name, (hint, adapter) in _field_types().items():
        value = getattr(case, name)
        if name == "tolerances" and isinstance(value, Mapping):
            continue  # its values get the flags' own check, which says more
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError:
            raise ConfigError(f"Case.{name} must be {_type_name(hint)}, got {value!r} "
                              f"({type(value).__name__})") from None
