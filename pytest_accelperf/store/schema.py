"""The schema of the files pytest-accelperf writes: the baseline block, the baseline file's
header, the JSON report and the history line. Described once, as pydantic models.

The baseline block is what :func:`pytest_accelperf.checks.summary.summarize` makes of a run and
what the checks (:mod:`pytest_accelperf.checks`) read. Every field a check reads is typed,
and a value that would make a check crash or silently switch it off is refused: a NaN or
negative step time, an empty list of step times, a NaN loss checkpoint, an outcome that is
not a recorded one. Unknown keys are kept (a newer version may add some), as JSON values
without NaN or infinity (a baseline file is strict JSON). Scalars are strict: ``"0.1"``
is not a number, ``1.0`` is not an integer (an integer is a number, though). Its models
are defined in :mod:`pytest_accelperf.store.block` (which the checks import) and named here too.

The store (:mod:`pytest_accelperf.store.baselines`) validates every block it reads and every
block it writes with :func:`validate_block`; ``accelperf baselines accept`` goes through
the same write. The report loader (:mod:`pytest_accelperf.report.loading`) validates a
report with :class:`ReportFile`; the history reader
(:mod:`pytest_accelperf.report.history`) each line of ``--accelperf-history`` with
:class:`HistoryLine`, or with :class:`HistoryNumbers` (the fields change points are found
in) or :class:`HistoryShown` (and those the site shows) where only those are read.
``accelperf schema baseline|report|history`` prints the JSON Schema of each
(:func:`json_schema`).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    Tag,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue, SkipJsonSchema

from pytest_accelperf.records.caserecord import CaseRecord
from pytest_accelperf.records.environment import Environment
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.program import CollectiveRecord, ProgramRecord
from pytest_accelperf.records.run import IN_EXTRA, INPUT_KEYS, InputSeries, Run
from pytest_accelperf.records.section import Int, NonNegative, Number, Positive, PositiveInt
from pytest_accelperf.records.section import JsonSection as _Strict
from pytest_accelperf.records.suite import StatisticalJson, SuiteJson, TallyJson, TestedJson
from pytest_accelperf.records.verdict import CheckResult, Verdict
from pytest_accelperf.store.block import (
    RECORDED_OUTCOMES,
    Block,
    Checkpoint,
    Collective,
    CompactNumerics,
    CompactSection,
    EnvironmentKey,
    Growth,
    InputTime,
    Leaf,
    Loss,
    MachineName,
    MachineTiming,
    MaxBatch,
    MaxBatchProbe,
    Memory,
    Numerics,
    Oom,
    Probe,
    Program,
    RecordedOutcome,
    RunOutcome,
    StepSession,
    StepTime,
)

__all__ = [
    "RECORDED_OUTCOMES",
    "BaselineHeader",
    "Block",
    "Checkpoint",
    "Collective",
    "CollectiveRecord",
    "CompactNumerics",
    "CompactSection",
    "Environment",
    "Growth",
    "HistoryLine",
    "HistoryNumbers",
    "HistoryShown",
    "InputTime",
    "Int",
    "Leaf",
    "Loss",
    "MaxBatch",
    "MaxBatchProbe",
    "Memory",
    "NonNegative",
    "Number",
    "Numerics",
    "Oom",
    "Positive",
    "PositiveInt",
    "Probe",
    "Program",
    "ProgramRecord",
    "RecordedOutcome",
    "ReportCase",
    "ReportCheck",
    "ReportFile",
    "ReportRun",
    "RunOutcome",
    "StepSession",
    "StepTime",
    "added_sections",
    "block_model",
    "declare_sections",
    "error_lines",
    "invalid_blocks",
    "json_schema",
    "validate_block",
    "withdraw_sections",
]

class BaselineHeader(_Strict):
    """A baseline file around its blocks (the blocks are validated apart, by
    :func:`invalid_blocks`, so that one invalid block names its case and an update can
    replace it).

    Schema 3 adds ``environments``: the environments of the entries of its blocks'
    ``machines``, each entry naming its own by its key here
    (:func:`pytest_accelperf.store.machines.pack`); validated here, once per file."""

    schema_version: Literal[1, 2, 3]
    platform: str = ""
    cases: Mapping[str, object]
    environments: dict[EnvironmentKey, Environment] | None = None


# -- the JSON report ---------------------------------------------------------------------------
class _Report(BaseModel):
    """Reports may hold NaN (a non-finite loss is reported as such)."""

    model_config = ConfigDict(extra="allow", strict=True)


#: The fields of a run whose JSON form differs from the run's own types: a non-finite
#: loss or metric is written as a string (:meth:`pytest_accelperf.records.run.Run.to_json`), and a
#: log may count memory in fractional bytes.
_RUN_JSON_TYPES: dict[str, object] = {
    "losses": list[float | str | None],
    "metrics": dict[str, list[float | str | None]],
    "memory_per_device": dict[str, float],
}
#: Records typed for the code that writes and reads them, read from reports as the JSON
#: objects they always were (a report written before a key was declared still loads): the
#: fingerprint, the environment, the notes (``extra``), and, where the run has one, the
#: OOM, the max batch, memory growth and the program (read as it was written: the store
#: validates a baseline's program, not a report's).
_RUN_JSON_OBJECTS = ("params_fingerprint", "environment", "extra")
_RUN_JSON_OBJECTS_OR_NONE = ("oom", "max_batch", "memory_growth", "program")
_RUN_JSON_TYPES.update({name: Mapping[str, object] for name in _RUN_JSON_OBJECTS})
_RUN_JSON_TYPES.update({name: Mapping[str, object] | None for name in _RUN_JSON_OBJECTS_OR_NONE})


def _report_run() -> type[_Report]:
    """:class:`ReportRun`, made from the fields of :class:`pytest_accelperf.records.run.Run` (the
    one definition of them): each field's type (its JSON form where
    :data:`_RUN_JSON_TYPES` says it differs) and its default; the fields whose JSON is
    under ``extra`` (:data:`pytest_accelperf.records.run.IN_EXTRA`, and the keys of ``details``)
    are in ``extra``."""
    hints = typing.get_type_hints(Run)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Run):
        if f.metadata.get(IN_EXTRA) or f.name == "details":  # their keys: under extra
            continue
        if f.name == "inputs":  # each series a key of the run's own
            series = typing.get_type_hints(InputSeries)
            fields.update({key: (series[name], []) for name, key in INPUT_KEYS.items()})
            continue
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
            if isinstance(default, _Strict):  # the environment: its JSON, {}
                default = default.to_json()
        else:
            default = ...
        fields[f.name] = (_RUN_JSON_TYPES.get(f.name, hints[f.name]), default)
    # What to_json derives from them (throughput, MFU, peak memory), read by the reports.
    fields["derived"] = (dict[str, float | None], {})
    model: type[_Report] = create_model(
        "ReportRun", __base__=_Report, __module__=__name__,
        __doc__="A run as :meth:`pytest_accelperf.records.run.Run.to_json` writes it.", **fields)
    return model


if TYPE_CHECKING:
    ReportRun = _Report
else:
    #: A run as :meth:`pytest_accelperf.records.run.Run.to_json` writes it (:func:`_report_run`).
    ReportRun = _report_run()


def _report_model(name: str, record: type, doc: str, *, types: Mapping[str, object] = {},
                  defaults: Mapping[str, object] = {},
                  base: type[_Report] = _Report) -> type[_Report]:
    """A report's model of ``record``, a TypedDict of what a ``to_json`` writes or the
    dataclass that ``to_json`` writes field by field (its one declaration): its keys, their
    types (``types`` where the report's JSON is of another type) and ``defaults`` (else a
    dataclass field's own default)."""
    hints = typing.get_type_hints(record)
    fields: dict[str, Any] = {k: (types.get(k, hint), defaults.get(k, _default(record, k)))
                              for k, hint in hints.items()}
    model: type[_Report] = create_model(name, __base__=base, __module__=__name__,
                                        __doc__=doc, **fields)
    return model


def _default(record: type, name: str) -> object:
    """The default of field ``name`` of ``record`` where it is a dataclass that gives one,
    else ``...`` (required)."""
    if dataclasses.is_dataclass(record):
        f = record.__dataclass_fields__[name]
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
    return ...


class _ReportClosed(_Report):
    """A report's record that a newer version does not add keys to."""

    model_config = ConfigDict(extra="forbid", strict=True)


if TYPE_CHECKING:
    ReportCheck: TypeAlias = _Report
    ReportTested: TypeAlias = _Report
    ReportStatistical: TypeAlias = _Report
    ReportTally: TypeAlias = _Report
    ReportSuite: TypeAlias = _Report
else:
    #: A check's result in a report (its fields :class:`~pytest_accelperf.records.verdict.
    #: CheckResult`'s): its verdict by value, its data the JSON object it was written as.
    ReportCheck = _report_model(
        "ReportCheck", CheckResult, "A :class:`pytest_accelperf.records.verdict.CheckResult` "
        "as ``to_json`` writes it.", base=_ReportClosed,
        types={"verdict": Annotated[Verdict, Strict(False)], "data": Mapping[str, object]})
    #: A timing regression of the suite verdict (:class:`pytest_accelperf.checks.family.Tested`).
    ReportTested = _report_model(
        "ReportTested", TestedJson, "A timing regression of the suite verdict "
        "(:class:`pytest_accelperf.checks.family.Tested`).", defaults={"df": None})
    #: The statistical checks of a session (``records.suite.StatisticalJson``).
    ReportStatistical = _report_model(
        "ReportStatistical", StatisticalJson, "The statistical checks of a session: how many, "
        "how many regressed, how many false\n    alarms chance would give, and which "
        "regressions hold at the false-discovery rate.",
        types={"held": list[ReportTested], "not_held": list[ReportTested]})
    #: Checks only counted (:class:`pytest_accelperf.checks.family.Tally`).
    ReportTally = _report_model("ReportTally", TallyJson, "Checks only counted "
                                "(:class:`pytest_accelperf.checks.family.Tally`).")
    #: The session as one verdict (:class:`pytest_accelperf.checks.family.SuiteVerdict`).
    ReportSuite = _report_model(
        "ReportSuite", SuiteJson, "The session as one verdict "
        "(:class:`pytest_accelperf.checks.family.SuiteVerdict`).",
        types={"statistical": ReportStatistical, "other_timing": ReportTally,
               "deterministic": ReportTally})


class _ReportCaseRules(_Report):
    """What a report's case holds beside its fields' types."""

    @model_validator(mode="after")
    def _a_loss_step_each(self) -> _ReportCaseRules:
        run: Any = getattr(self, "run")  # a field of the model made of CaseRecord
        steps, losses = run.loss_steps, run.losses
        if steps and len(steps) != len(losses):
            raise ValueError(f"run.loss_steps has {len(steps)} step numbers for "
                             f"{len(losses)} losses (one per loss, or none)")
        return self


if TYPE_CHECKING:
    ReportCase: TypeAlias = _Report
else:
    #: One case of a report: the fields of :class:`pytest_accelperf.records.caserecord.
    #: CaseRecord` (their one declaration), its run a :data:`ReportRun`, its checks
    #: :data:`ReportCheck`\ s, the block, the case and the baseline the JSON objects they
    #: were written as; ``checks`` required.
    ReportCase = _report_model(
        "ReportCase", CaseRecord,
        "One case of a report (:class:`pytest_accelperf.report.data.CaseRecord`).",
        base=_ReportCaseRules, defaults={"checks": ...},
        types={"run": ReportRun, "checks": list[ReportCheck],
               "block": Mapping[str, object] | None, "case": Mapping[str, object],
               "baseline": Mapping[str, object] | None})


class ReportFile(_Report):
    """A ``--accelperf-json`` report (:class:`pytest_accelperf.report.data.SessionReport`)."""

    schema_version: Literal[1]
    cases: list[ReportCase]
    accel: str = ""
    platform: str = ""
    #: The machine whose timing the session judged (absent from reports written before).
    machine: str = ""
    update: bool = False
    environment: Mapping[str, object] = {}
    baselines_written: list[str] = []
    errors: list[str] = []
    #: Absent from reports written before the suite verdict was.
    suite: ReportSuite | None = None


# -- the history -------------------------------------------------------------------------------
class HistoryNumbers(BaseModel):
    """What change-point analysis (:mod:`pytest_accelperf.report.changes`) reads of a
    ``--accelperf-history`` line: the case, the session, its commit and fingerprint, the
    headline numbers and the program record. The other keys are skipped unread (not built
    as Python objects: a history of 100,000 lines is read in under a second); a line is
    still checked whole by :class:`HistoryLine` where the whole line is read."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    nodeid: str
    session: str
    schema_version: Literal[1] = 1
    time: str = ""
    commit: str | None = None
    #: Tracked files had changes when the session ran.
    dirty: bool | None = None
    platform: str | None = None
    #: A hash of the environment (:func:`pytest_accelperf.report.history.fingerprint_hash`).
    fingerprint: str | None = None
    #: A hash of the machine (:func:`pytest_accelperf.provision.describe.machine`): the sessions
    #: of
    #: a case on one machine are one series of the history; absent from lines written
    #: before the machine and the stack were told apart (their ``fingerprint`` is used).
    machine: str | None = None
    #: A hash of the case's stack (:func:`pytest_accelperf.provision.describe.case_stack`): a
    #: change of it on the same machine is a ``stack`` change point, named from the line's
    #: ``environment``; absent as ``machine`` is.
    stack: str | None = None
    samples_per_second: NonNegative | None = None
    median_step_time: NonNegative | None = None
    peak_memory: NonNegative | None = None
    final_loss: Number | None = None
    #: The gated fields of the run's program record, as a dict (:class:`ProgramRecord`);
    #: absent from lines written before it was kept.
    program: ProgramRecord | None = None


class HistoryShown(HistoryNumbers):
    """What the history's pages show of a line besides :class:`HistoryNumbers`: its
    verdict, branch, machine name, compile time, step-time interval and memory per
    device (:class:`pytest_accelperf.report.site.SiteLine`); the environment, most of a
    line, is skipped unread."""

    # The four fields under SkipJsonSchema were written before this model declared them:
    # they are validated as typed where a line is read, and left out of the schema that
    # ``accelperf schema history`` prints, which stays as published (its
    # ``additionalProperties`` admit them). A field added from now on is published.

    verdict: str | None = None
    compile_time: NonNegative | None = None
    #: The git branch the session ran on (:func:`pytest_accelperf.report.history.
    #: git_branch`); absent from lines written before it was kept.
    branch: SkipJsonSchema[str | None] = None
    #: The machine's name (``--accelperf-machine``, else the name the store derives from
    #: the host: :func:`pytest_accelperf.store.machines.default_machine`); absent from
    #: lines written before machines were named.
    machine_name: SkipJsonSchema[str | None] = None
    #: The 95 % interval of the median step time (:func:`pytest_accelperf.stats.median.
    #: median_interval`), ``[low, high]`` seconds; absent as ``branch`` is.
    step_time_interval: SkipJsonSchema[
        Annotated[list[float], Field(min_length=2, max_length=2)] | None] = None
    #: Peak memory of each device or rank, bytes; absent as ``branch`` is.
    memory_per_device: SkipJsonSchema[dict[str, float] | None] = None


class HistoryLine(HistoryShown):
    """One line of ``--accelperf-history`` (:func:`pytest_accelperf.report.history.entry`):
    one case of one session. Only ``nodeid`` and ``session`` are required; unknown keys are
    kept (a newer version may add some)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JSONValue]

    case_id: str | None = None
    case: dict[str, JSONValue] | None = None
    outcome: RunOutcome | None = None
    #: ``{metric: verdict}`` of the case's checks.
    checks: dict[str, str] | None = None
    update: bool | None = None
    mfu: NonNegative | None = None
    #: The run's environment (flat, with the keys hooks add).
    environment: Environment | None = None
    #: The gated fields of the run's program record; absent from lines written before it
    #: was kept.
    program: Program | None = None  # type: ignore[assignment]


# -- helpers -----------------------------------------------------------------------------------
#: The sections that checks declare (:attr:`pytest_accelperf.checks.protocol.Check.
#: section_models`) and :class:`Block` does not, by name: the table of checks declares its
#: checks' here (:mod:`pytest_accelperf.checks.table`, as it registers them), so that the
#: store validates a section a check added without importing the checks.
_ADDED: dict[str, object] = {}


def declare_sections(models: Mapping[str, Any]) -> None:
    """Validate the sections ``models`` names (``{name: pydantic model or type}``) with
    their models, where :class:`Block` does not declare them itself."""
    for name, model in models.items():
        if name not in Block.model_fields:
            _ADDED[name] = model


def withdraw_sections(names: Iterable[str]) -> None:
    """Stop validating the sections ``names`` (the check that declared them is gone)."""
    for name in names:
        _ADDED.pop(name, None)


def added_sections() -> tuple[tuple[str, Any], ...]:
    """``((section, model), ...)`` of the sections declared (:func:`declare_sections`):
    a check added after this schema was written validates its own section."""
    return tuple(_ADDED.items())


@functools.cache
def _block_model(sections: tuple[tuple[str, Any], ...]) -> type[Block]:
    if not sections:
        return Block
    fields: dict[str, Any] = {name: (model | None, None) for name, model in sections}
    model: type[Block] = create_model("Block", __base__=Block, **fields)
    return model


def block_model() -> type[Block]:
    """:class:`Block`, with the sections of :func:`added_sections` where there are any."""
    return _block_model(added_sections())


def validate_block(data: object, *, filed: bool = False) -> Block:
    """``data`` as a :class:`Block` (:func:`block_model`); :class:`pydantic.ValidationError`
    if it is not one. With ``filed``, as a file of schema 3 holds it (:func:`invalid_blocks`;
    the environments of its ``machines`` may be keys)."""
    model = _filed_block_model(block_model()) if filed else block_model()
    return model.model_validate(data)


@functools.cache
def _blocks_adapter(model: type[Block]) -> TypeAdapter[dict[str, Block]]:
    return TypeAdapter(dict[str, model])  # type: ignore[valid-type]


def _environment_kind(value: object) -> str:
    return "key" if isinstance(value, str) else "inline"


#: An entry's environment in a file of schema 3: the key of one of the file's
#: ``environments`` (validated with the file's header, by their pattern; an entry's key is
#: checked by being found there, :func:`pytest_accelperf.store.machines.unpack`), or the
#: environment itself.
_FiledEnvironment = Annotated[Annotated[str, Tag("key")]
                              | Annotated[Environment, Tag("inline")],
                              Discriminator(_environment_kind)]


class _FiledMachineTiming(MachineTiming):
    """An entry of ``machines`` as a file of schema 3 holds it (:data:`_FiledEnvironment`)."""

    environment: _FiledEnvironment  # type: ignore[assignment]


@functools.cache
def _filed_block_model(model: type[Block]) -> type[Block]:
    """``model`` as a file of schema 3 holds it (:class:`_FiledMachineTiming`)."""
    filed: type[Block] = create_model(
        "Block", __base__=model,
        machines=(dict[MachineName, _FiledMachineTiming] | None, None))
    return filed


def invalid_blocks(cases: Mapping[str, Any], *, filed: bool = False
                   ) -> dict[str, ValidationError]:
    """``{case key: its error}`` of the blocks of ``cases`` that are not a :class:`Block`,
    in the order of ``cases``; empty when all are. With ``filed``, the blocks as a file of
    schema 3 holds them, the environments of their ``machines`` by key (each environment
    validated once, in the file's header, rather than in each entry that names it; the
    keys are resolved by :func:`pytest_accelperf.store.machines.unpack`).

    One pydantic call validates the whole mapping (the store reads a file's blocks this
    way); only when it fails are the blocks it names validated again one by one, so that
    each error is that block's own, as :func:`validate_block` raises it.
    """
    model = _filed_block_model(block_model()) if filed else block_model()
    try:
        _blocks_adapter(model).validate_python(cases)
    except ValidationError as exc:
        named = {err["loc"][0] for err in exc.errors(include_url=False) if err["loc"]}
    else:
        return {}
    out: dict[str, ValidationError] = {}
    for key, block in cases.items():
        if key not in named:
            continue
        try:
            validate_block(block, filed=filed)
        except ValidationError as exc:
            out[key] = exc
    return out


def error_lines(exc: ValidationError, *, limit: int = 5) -> list[tuple[tuple[str | int, ...],
                                                                        str]]:
    """``[(location, "what is wrong (found ...)")]`` of a validation error, the first
    ``limit`` of them (and a last one that counts the rest)."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    errors = exc.errors(include_url=False)
    for err in errors[:limit]:
        loc = _untagged(tuple(err["loc"]))
        if err["type"] == "finite_number" and loc and loc[-1] == "float":
            loc = loc[:-1]  # the branch of a JSON value, not a key
        if err["type"] == "missing":
            msg = "missing (a required field)"
        elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
            msg = f"should be a JSON object (found {_short(err.get('input'))})"
        else:
            msg = f"{err['msg']} (found {_short(err.get('input'))})"
        out.append((loc, msg))
    if len(errors) > limit:
        out.append(((), f"and {len(errors) - limit} more error(s)"))
    return out


def _untagged(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """``loc`` without the tag pydantic puts after ``numerics`` or an entry's environment
    (which form it was read as): the path of the field in the file."""
    out = list(loc)
    for i in range(len(out) - 1):
        if (out[i], out[i + 1]) in _TAGS:
            del out[i + 1]
            break
    return tuple(out)


#: ``(field, tag)`` of the tagged unions of a block: numerics (compact or per leaf), an
#: entry's environment in a file of schema 3 (by key or inline).
_TAGS = frozenset({("numerics", "compact"), ("numerics", "per_leaf"),
                   ("environment", "key"), ("environment", "inline")})


def _short(value: object, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 4] + " ..."


def json_schema(kind: Literal["baseline", "report", "history"]) -> JsonSchemaValue:
    """The JSON Schema of a baseline block (``baseline``), of a report (``report``) or of
    a history line (``history``)."""
    models: dict[str, type[BaseModel]] = {"baseline": block_model(), "report": ReportFile,
                                          "history": HistoryLine}
    return models[kind].model_json_schema()
