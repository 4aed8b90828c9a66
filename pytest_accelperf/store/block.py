"""The baseline block, typed: a pydantic model of each section, and :class:`Block` of them.

A block is what :func:`pytest_accelperf.checks.summary.summarize` makes of a run, what the store
(:mod:`pytest_accelperf.store.baselines`) keeps per case and what the checks
(:mod:`pytest_accelperf.checks`) read. The rules of the file format (strict JSON types,
finite numbers, unknown keys kept) are described in :mod:`pytest_accelperf.store.schema`, which
validates blocks with these models and prints their JSON Schema; this module imports
nothing of the checks, so that they can read the block as these types.
"""

from __future__ import annotations

import functools
import operator
import types
import typing
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, overload

import typing_extensions
from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    Tag,
    create_model,
    model_validator,
)

from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.fingerprint import LeafFingerprint
from pytest_accelperf.records.program import CollectiveRecord, ProgramRecord
from pytest_accelperf.records.run import MemoryGrowth, Outcome
from pytest_accelperf.records.section import Int, NonNegative, Number, Positive, PositiveInt
from pytest_accelperf.records.section import JsonSection as _Strict

#: Outcomes that a baseline records: the outcomes of a run
#: (:data:`pytest_accelperf.records.run.OUTCOMES`)
#: less the failures (``nan``, ``error``, ``timeout``), which are never a baseline.
RECORDED_OUTCOMES: tuple[str, ...] = ("ok", "oom")
RecordedOutcome = Literal["ok", "oom"]
RunOutcome = Outcome



# -- the baseline block ------------------------------------------------------------------------
class StepSession(_Strict):
    """One session's step-time level (``--accelperf-add-session``)."""

    median: Positive
    probe_median: Positive | None = None
    #: Why this session was recorded too noisy to be a level (it is kept, never used).
    noisy: str | None = None


class StepTime(_Strict):
    """Seconds per measured step: the median and every sample (at least one)."""

    median: Positive
    samples: Annotated[list[Positive], Field(min_length=1)]
    sessions: list[StepSession] | None = None


class Probe(_Strict):
    """Times of the reference workload run after each measured step (every k-th past 100
    measured steps; drift correction)."""

    kind: Annotated[str, Field(min_length=1)]
    samples: Annotated[list[Positive], Field(min_length=1)]


Checkpoint = Annotated[tuple[NonNegative, Number], Strict(False)]  # [step, mean loss]


class Loss(_Strict):
    """The loss curve: ``[step, mean loss]`` checkpoints, the final loss, the step count."""

    checkpoints: list[Checkpoint]
    final: Number | None
    steps: Int

    @model_validator(mode="after")
    def _curve_when_steps(self) -> Loss:
        if self.steps and not self.checkpoints:
            raise ValueError(f"loss.steps is {self.steps} but loss.checkpoints is empty: the "
                             f"loss check would have nothing to compare")
        return self


def _model_of(record: type, name: str, doc: str,
              nested: Mapping[type, type[BaseModel]]) -> type[_Strict]:
    """A section model of the fields of the TypedDict ``record`` (each its type and
    constraints; required where ``record`` requires it, else it or None, default None), a
    TypedDict in them replaced by its model of ``nested``: one declaration of a record read
    both as a dict and as a section of the block."""
    hints = typing_extensions.get_type_hints(record, include_extras=True)
    # Under ``from __future__ import annotations`` the class cannot see ``Required`` in its
    # (string) annotations: the resolved hints say which keys are required.
    total = bool(getattr(record, "__total__", True))
    fields: dict[str, Any] = {}  # pydantic's field definitions
    for key, hint in hints.items():
        origin: object = typing_extensions.get_origin(hint)
        required = origin is typing_extensions.Required or (
            total and origin is not typing_extensions.NotRequired)
        if origin in (typing_extensions.Required, typing_extensions.NotRequired):
            (hint,) = typing_extensions.get_args(hint)
        typed: Any = _swap(hint, nested)  # a type of the record's, a model in it swapped
        fields[key] = (typed, ...) if required else (typed | None, None)
    model: type[_Strict] = create_model(name, __base__=_Strict, __module__=__name__,
                                        __doc__=doc, **fields)
    return model


def _swap(hint: object, nested: Mapping[type, type[BaseModel]]) -> object:
    """``hint`` with each type of ``nested`` in it (as a dict's value, a union's branch)
    replaced by its model; ``hint`` itself where it has none."""
    if isinstance(hint, type) and hint in nested:
        return nested[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict:
        key, value = args
        swapped = _swap(value, nested)
        return hint if swapped is value else dict[key, swapped]  # type: ignore[valid-type]
    if origin in (typing.Union, types.UnionType):
        branches = [_swap(a, nested) for a in args]
        if all(b is a for a, b in zip(args, branches, strict=True)):
            return hint
        return functools.reduce(operator.or_, branches)
    return hint


if TYPE_CHECKING:
    Growth = _Strict
    Collective = _Strict
    Program = _Strict
    Leaf = _Strict
else:
    #: How live memory grew (:class:`~pytest_accelperf.records.run.MemoryGrowth`'s fields,
    #: unknown keys kept).
    Growth = _model_of(MemoryGrowth, "Growth",
                       "How live memory grew over the measured steps (the leak check).", {})
    #: One kind of collective in one step (:class:`~pytest_accelperf.records.program.
    #: CollectiveRecord`'s fields, unknown keys kept).
    Collective = _model_of(
        CollectiveRecord, "Collective",
        "One kind of collective in one step: how many, and one device's bytes.", {})
    #: What the step's compiled program does: the fields of
    #: :class:`pytest_accelperf.records.program.ProgramRecord`, unknown keys kept.
    Program = _model_of(
        ProgramRecord, "Program",
        "What the step's compiled program does (:mod:`pytest_accelperf.records.program`): the\n"
        "    ``program`` check's record. Every field but ``source`` is optional.",
        {CollectiveRecord: Collective})
    #: The fingerprint of one parameter leaf: :class:`~pytest_accelperf.records.fingerprint.
    #: LeafFingerprint`'s fields, unknown keys kept.
    Leaf = _model_of(
        LeafFingerprint, "Leaf",
        "The fingerprint of one parameter leaf\n"
        "(:func:`pytest_accelperf.backends.measure.common.fingerprint`): what a run computes, "
        "and what\nblocks recorded before the compact form (:class:`CompactNumerics`) stored "
        "per leaf.", {})


class Memory(_Strict):
    """Peak bytes per device label, their maximum, how they were counted, and live
    memory's growth per measured step."""

    per_device: Annotated[dict[str, NonNegative], Field(min_length=1)]
    peak: NonNegative | None = None
    source: str = ""
    growth: Growth | None = None


class CompactSection(_Strict):
    """One section of a compact fingerprint: one sketch value per leaf in path order, a
    hash of the leaves' paths, shapes and dtypes, and a tag of 2 hex digits per leaf (so
    that a changed structure names the run's leaves that changed)."""

    sketch: list[NonNegative]
    structure: Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]
    tags: Annotated[str, Field(pattern=r"^([0-9a-f]{2})*$")]

    @model_validator(mode="after")
    def _a_tag_per_leaf(self) -> CompactSection:
        if len(self.tags) != 2 * len(self.sketch):
            raise ValueError(f"numerics.tags has {len(self.tags) // 2} tag(s) of 2 hex digits "
                             f"for {len(self.sketch)} sketch value(s): one per leaf")
        return self


class CompactNumerics(CompactSection):
    """The fingerprint as the store keeps it
    (:func:`pytest_accelperf.records.fingerprint.compact`): the parameters' section, and the
    training state's beside them (running statistics, step counters, a loss scale) under
    ``state``; a block recorded before the state was fingerprinted has no ``state``."""

    state: CompactSection | None = None


def _numerics_kind(value: object) -> str:
    """Which form a block's ``numerics`` is: ``compact`` (it has a ``sketch`` list) or
    ``per_leaf`` (the form recorded before, still read: the migration of old blocks)."""
    if isinstance(value, Mapping) and isinstance(value.get("sketch"), list):
        return "compact"
    if isinstance(value, BaseModel):
        return "compact" if isinstance(value, CompactNumerics) else "per_leaf"
    return "per_leaf"


Numerics = Annotated[Annotated[CompactNumerics, Tag("compact")]
                     | Annotated[dict[str, Leaf], Tag("per_leaf")],
                     Discriminator(_numerics_kind)]


MaxBatchProbe = Annotated[tuple[StrictInt, StrictBool, NonNegative | None], Strict(False)]


class MaxBatch(_Strict):
    """A maximum-batch search (:mod:`pytest_accelperf.gate.maxbatch`)."""

    value: PositiveInt | None
    capacity_bytes: NonNegative | None = None
    multiple_of: PositiveInt = 1
    limit: PositiveInt | None = None
    probes: list[MaxBatchProbe] = []  # noqa: RUF012 (pydantic copies a default)


class Oom(_Strict):
    """What an out-of-memory outcome needed and had."""

    required_bytes: NonNegative | None = None
    capacity_bytes: NonNegative | None = None


class InputTime(_Strict):
    """CPU seconds of the thread that made each measured step's batch (the ``input``
    check): every sample, their median, and the median wall seconds of the same; and
    the seconds that thread was blocked making it, neither on a CPU nor waiting for one
    (the ``input_wait`` check): every sample and their median, where the kernel counted
    them; and the medians of what the input check weighs before it believes a change:
    the seconds the thread waited for a CPU, and its page faults, per batch, and the
    CPU seconds of the input yardstick (of ``yardstick_kind``) the thread ran after each."""

    median: NonNegative
    samples: Annotated[list[NonNegative], Field(min_length=1)]
    wall_median: NonNegative | None = None
    blocked_median: NonNegative | None = None
    blocked_samples: Annotated[list[NonNegative], Field(min_length=1)] | None = None
    queued_median: NonNegative | None = None
    fault_median: NonNegative | None = None
    yardstick_median: NonNegative | None = None
    yardstick_kind: str | None = None


class TrainerTime(_Strict):
    """The seconds of each measured step of a trainer that owns its loop outside the user's
    forward, backward and optimizer step (the ``trainer`` check,
    :mod:`pytest_accelperf.checks.trainer`): every sample and their median."""

    median: NonNegative
    samples: Annotated[list[NonNegative], Field(min_length=1)]


#: A machine's name (``--accelperf-machine``): one path component, as a platform key is.
MACHINE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$"
MachineName = Annotated[str, Field(pattern=MACHINE_PATTERN)]
#: The key of an environment in a baseline file's ``environments`` (schema 3,
#: :mod:`pytest_accelperf.store.machines`): the name of the machine it is the environment
#: of, followed by ``~`` and 8 hex digits of its hash where that machine has more than one
#: environment in the file (a stack upgraded for some of its cases).
ENVIRONMENT_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}(~[0-9a-f]{8})?$"
EnvironmentKey = Annotated[str, Field(pattern=ENVIRONMENT_KEY_PATTERN)]


class MachineTiming(_Strict):
    """The timing of one case on one machine other than the block's own
    (:attr:`Block.machines`): the environment it was recorded in (its host, and the stack
    then), when, and the timing sections (:data:`TIMING_SECTIONS`), typed as
    :class:`Block` types them."""

    environment: Environment
    recorded_at: str | None = None
    step_time: StepTime | None = None
    probe: Probe | None = None
    samples_per_second: Positive | None = None
    mfu: NonNegative | None = None
    compile_time: NonNegative | None = None
    input: InputTime | None = None
    trainer: TrainerTime | None = None
    noisy: str | None = None


#: The sections of a block that are timing, kept per machine (:class:`MachineTiming`):
#: the step times and the drift probe (the throughput check), what they give
#: (``samples_per_second``, ``mfu``), the compile time, the input times, a trainer's own
#: time per step, and the mark of a
#: recording too noisy to judge against. Everything else of a block (outcome, program,
#: numerics, loss, memory, ...) does not depend on the host and is shared by every machine
#: of the platform. They are :class:`MachineTiming`'s fields after its environment and
#: time, declared there once.
TIMING_SECTIONS: tuple[str, ...] = tuple(
    name for name in MachineTiming.model_fields if name not in ("environment", "recorded_at"))


class Block(_Strict):
    """The baseline block of one case (:func:`pytest_accelperf.checks.summary.summarize`).

    Its timing sections (:data:`TIMING_SECTIONS`) at the top level are those of the machine
    that recorded the block (``machine``; a block written before machines were named:
    the machine its ``environment`` names, :func:`pytest_accelperf.store.machines.
    default_machine`); every other machine's are under ``machines``
    (:mod:`pytest_accelperf.store.machines`)."""

    outcome: RecordedOutcome
    environment: Environment
    message: str = ""
    samples_per_step: Int = 0
    tokens_per_step: Int | None = None
    n_devices: PositiveInt = 1
    recorded_at: str | None = None
    oom: Oom | None = None
    step_time: StepTime | None = None
    probe: Probe | None = None
    samples_per_second: Positive | None = None
    compile_time: NonNegative | None = None
    loss: Loss | None = None
    #: The other metrics of the training step (accuracy, learning rate), each a curve as
    #: the loss's.
    metrics: dict[str, Loss] | None = None
    numerics: Numerics | None = None
    #: Per leaf, how far a replay of the same steps moved it (``||run - replay|| /
    #: ||run||``), where the platform does not repeat its arithmetic exactly (a GPU's
    #: atomic reductions); only the leaves that moved, absent where none did.
    numerics_spread: dict[str, NonNegative] | None = None
    flops_per_step: NonNegative | None = None
    mfu: NonNegative | None = None
    max_batch: MaxBatch | None = None
    memory: Memory | None = None
    program: Program | None = None
    #: What making the batches cost the thread that made them (the ``input`` check).
    input: InputTime | None = None
    #: The trainer's own time per step (the ``trainer`` check): a trainer's case only.
    trainer: TrainerTime | None = None
    #: Why the recording was too noisy to judge throughput against (re-measured, and it
    #: stayed so): the throughput check is inconclusive until the case is re-recorded.
    noisy: str | None = None
    #: The machine whose timing the top-level timing sections are (and that recorded the
    #: shared sections); absent from blocks written before machines were named.
    machine: MachineName | None = None
    #: The timing of every other machine of the platform, by machine name.
    machines: dict[MachineName, MachineTiming] | None = None


# -- reading a block as these types -----------------------------------------------------------
M = TypeVar("M", bound=BaseModel)

#: A block as the checks take it: read (:func:`read_block`), or as JSON.
BlockLike = Block | Mapping[str, Any]


def read(model: type[M], data: Mapping[str, Any]) -> M:
    """``data`` read as ``model``, not validated: each field its type (a section its model,
    a list or an object of sections such, read so in turn), an unknown key kept as it is, a
    missing field its default (None where it has none), a value of another type as it is.

    What the checks read a block as (:func:`read_block`): a run's own block may hold what
    the store refuses (the outcome of a failed run, a NaN loss or parameter), which the
    checks judge rather than reject; the store validates every block it reads and writes
    (:func:`pytest_accelperf.store.schema.validate_block`). A section keeps the JSON object it was
    read from (:meth:`_Strict.to_json`).

    How each field is read is worked out once per model and annotation (:func:`_plan`,
    :func:`_reader`): a run reads every case's stored block, and walking the annotations
    again for each (``typing.get_origin`` of every field of every section) was most of
    the time of reading a large store for a session."""
    values: dict[str, Any] = {}
    fields, known, construct = _plan(model)
    for name, reader, required in fields:
        if name in data:
            value = data[name]
            values[name] = value if reader is None else reader(value)
        elif required:
            values[name] = None
    extra = {k: v for k, v in data.items() if k not in known}
    return typing.cast(M, construct(values, extra, data))


_Construct = Callable[[dict[str, Any], dict[str, Any], Mapping[str, Any]], BaseModel]
#: ``{model: (((field, its reader or None, required), ...), field names, constructor)}``.
_PLANS: dict[type[BaseModel], tuple[tuple[tuple[str, Callable[[Any], Any] | None, bool], ...],
                                     frozenset[str], _Construct]] = {}


def _plan(model: type[BaseModel]) -> tuple[tuple[tuple[str, Callable[[Any], Any] | None,
                                                      bool], ...], frozenset[str], _Construct]:
    """How :func:`read` reads ``model``'s fields: each with its reader (None: taken as it
    is, a scalar) and whether it is required; the names of the fields; and how the model
    is made of them (:func:`_constructor`)."""
    found = _PLANS.get(model)
    if found is None:
        fields = tuple((name, _reader(info.annotation), info.is_required())
                       for name, info in model.model_fields.items())
        found = _PLANS[model] = (fields, frozenset(model.model_fields), _constructor(model))
    return found


_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)


def _constructor(model: type[BaseModel]) -> _Construct:
    """``(values, extra, data) -> model``: what ``model.model_construct(**values,
    **extra)`` makes, with ``data`` as its JSON (:meth:`_Strict.to_json`).

    For a section (:class:`_Strict`: unknown keys kept, the one private attribute
    ``_json``, no ``model_post_init`` of its own), the instance is made directly, as
    ``model_construct`` makes it: the fields in their order (a missing one its default),
    the fields set, the extra keys and the private attribute. ``model_construct`` spent
    two thirds of its time on generic work (defaults looked up and copied per call, the
    private attributes initialised then set again): a session reads every case's stored
    block, a dozen sections each. Any other model is made by ``model_construct``."""
    post_init = getattr(model.model_post_init, "__name__", "")
    if not issubclass(model, _Strict) or model.model_config.get("extra") != "allow" \
            or model.__pydantic_root_model__ or set(model.__private_attributes__) != {"_json"} \
            or post_init != "init_private_attributes":
        def construct_slowly(values: dict[str, Any], extra: dict[str, Any],
                             data: Mapping[str, Any]) -> BaseModel:
            out = model.model_construct(**values, **extra)
            if isinstance(out, _Strict):
                out._json = data
            return out

        return construct_slowly
    infos = model.model_fields
    # A default that is not a plain value is made again for each instance, as pydantic
    # makes it (a factory called, a mutable default copied).
    fixed = {name: info.default for name, info in infos.items()
             if not info.is_required() and info.default_factory is None
             and isinstance(info.default, _IMMUTABLE)}
    made = {name: info for name, info in infos.items()
            if not info.is_required() and name not in fixed}
    order = tuple(infos)
    new = model.__new__
    setattr_ = object.__setattr__

    def construct(values: dict[str, Any], extra: dict[str, Any],
                  data: Mapping[str, Any]) -> BaseModel:
        out = new(model)
        fields: dict[str, Any] = {}
        for name in order:
            if name in values:
                fields[name] = values[name]
            elif name in fixed:
                fields[name] = fixed[name]
            elif name in made:
                fields[name] = made[name].get_default(call_default_factory=True,
                                                      validated_data=fields)
        setattr_(out, "__dict__", fields)
        setattr_(out, "__pydantic_fields_set__", set(values))
        setattr_(out, "__pydantic_extra__", extra)
        setattr_(out, "__pydantic_private__", {"_json": data})
        return out

    return construct


@overload
def read_block(data: Mapping[str, Any] | Block, model: type[Block] = ...) -> Block: ...


@overload
def read_block(data: None, model: type[Block] = ...) -> None: ...


def read_block(data: Mapping[str, Any] | Block | None,
               model: type[Block] = Block) -> Block | None:
    """``data`` (a block as JSON) read as a :class:`Block` (:func:`read`): the form the
    checks read; a :class:`Block` as it is, None as None. ``model``: :class:`Block` with
    the sections that checks added (:func:`pytest_accelperf.store.schema.block_model`)."""
    if data is None or isinstance(data, Block):
        return data
    return read(model, data)


@overload
def json_of(value: BaseModel | Mapping[str, object]) -> Mapping[str, Any]: ...


@overload
def json_of(value: None) -> None: ...


@overload
def json_of(value: BaseModel | Mapping[str, object] | None) -> Mapping[str, Any] | None: ...


@overload
def json_of(value: object) -> object: ...


def json_of(value: object) -> object:
    """``value`` (a section :func:`read` made, or a list or an object of them) as JSON
    again: what it was read from (a section, an object: a JSON object, a fresh one)."""
    if isinstance(value, _Strict):
        return value.to_json()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, dict):
        return {k: json_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_of(v) for v in value]
    return value


def _branches(annotation: object) -> tuple[object, Callable[[Any], Hashable] | None]:
    """``annotation`` without ``Annotated``, and the discriminator of its union if it has
    one."""
    pick: Callable[[Any], Hashable] | None = None
    while typing.get_origin(annotation) is Annotated:
        annotation, *meta = typing.get_args(annotation)
        for m in meta:
            if isinstance(m, Discriminator) and callable(m.discriminator):
                pick = m.discriminator
    return annotation, pick


def _tag(annotation: object) -> str | None:
    if typing.get_origin(annotation) is Annotated:
        return next((m.tag for m in typing.get_args(annotation)[1:] if isinstance(m, Tag)),
                    None)
    return None


def _shape(annotation: object) -> type | None:
    """The JSON container ``annotation`` reads: ``dict`` (a model, an object), ``list`` (a
    list, a tuple), or None (a scalar)."""
    annotation, _ = _branches(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return dict
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):  # a union of unions (with a discriminator)
        shapes = {_shape(a) for a in typing.get_args(annotation)} - {None}
        return shapes.pop() if len(shapes) == 1 else None
    if origin in (dict, Mapping):
        return dict
    if origin in (list, tuple):
        return list
    return None


#: ``{id(annotation): (annotation, its reader or None)}`` (:func:`_reader`); the
#: annotation is kept so that its id is never another's.
_READERS: dict[int, tuple[object, Callable[[Any], Any] | None]] = {}


def _reader(annotation: object) -> Callable[[Any], Any] | None:
    """How a value of ``annotation`` is read (see :func:`read`), made once per annotation;
    None where it is taken as it is."""
    found = _READERS.get(id(annotation))
    if found is not None and found[0] is annotation:
        return found[1]
    made = _make_reader(annotation)
    _READERS[id(annotation)] = (annotation, made)
    return made


def _is_object(value: object) -> typing_extensions.TypeGuard[Mapping[str, Any]]:
    """Whether ``value`` is a JSON object: a dict (checked first: an ABC's isinstance is
    several times slower, and a session reads a dozen sections of every stored case), or
    another mapping."""
    return type(value) is dict or isinstance(value, Mapping)


def _make_reader(annotation: object) -> Callable[[Any], Any] | None:
    annotation, pick = _branches(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        shaped = [(a, _shape(a), _tag(a)) for a in options]
        if all(shape is None for _, shape, _ in shaped):
            return None

        def read_union(value: object) -> object:
            chosen = shaped
            if pick is not None:
                tag = pick(value)
                chosen = [o for o in shaped if o[2] == tag] or shaped
            shape = dict if _is_object(value) else list if isinstance(value, list) else None
            branch = next((a for a, s, _ in chosen if s is shape), None)
            if branch is None:
                return value
            reader = _reader(branch)
            return value if reader is None else reader(value)

        return read_union
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        model = annotation

        def read_model(value: object) -> object:
            return read(model, value) if _is_object(value) else value

        return read_model
    if origin is list:
        (item,) = typing.get_args(annotation)
        item_reader = _reader(item)
        if item_reader is None:
            return None
        each: Callable[[Any], Any] = item_reader

        def read_list(value: object) -> object:
            return [each(v) for v in value] if isinstance(value, list) else value

        return read_list
    if origin is dict:
        _, item = typing.get_args(annotation)
        item_reader = _reader(item)
        if item_reader is None:
            return None
        each_value: Callable[[Any], Any] = item_reader

        def read_dict(value: object) -> object:
            return {k: each_value(v) for k, v in value.items()} if _is_object(value) \
                else value

        return read_dict
    return None


def _read(annotation: object, value: object) -> object:
    """``value`` read as ``annotation`` (see :func:`read`)."""
    reader = _reader(annotation)
    return value if reader is None else reader(value)
