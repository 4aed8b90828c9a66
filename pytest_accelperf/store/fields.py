"""The fields of a baseline block that a command reads, validated as the schema validates
them, and nothing else.

``accelperf baselines show`` and ``diff`` read a handful of numbers of each block (the
outcome, the throughput, the step time, the final loss, ...). Validating the whole block
for them (its environment, program, fingerprint, every sample) was most of the time of
``show`` over a 10,000-case store. A :class:`Fields` names the fields a command reads,
``("outcome", "step_time.median", ...)``, and validates exactly those, with the types and
constraints :class:`~pytest_accelperf.store.block.Block` declares for them (one
declaration: the types are taken from the block's models, not written again), as plain
dicts (:class:`typing.TypedDict`): a missing optional field is absent, an unknown key is
left out.

Reading a file for them (:meth:`Fields.read`) is one pydantic call over the file's bytes:
the JSON is parsed and the named fields validated in Rust, and only they become Python
objects. It accepts a file only when that is the answer the store's own read would give
for these fields (:func:`pytest_accelperf.store.baselines.parse`); in any doubt (a JSON or
schema error, a case key repeated, the header's keys written twice) it returns None and
the caller reads the file the exact way, which names the error as it always did.

Whole-block validation stays where the data is used: the store's read for the gate
(:meth:`~pytest_accelperf.store.baselines.BaselineStore.get`), every writer, and
``accelperf baselines check``.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import typing_extensions
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    with_config,
)

from pytest_accelperf.records.environment import Environment
from pytest_accelperf.store.block import Block, EnvironmentKey, MachineTiming
from pytest_accelperf.store.machines import ENVIRONMENTS_KEY, MACHINES_KEY, unpack

__all__ = ["Fields"]

#: The block's own rules (:class:`pytest_accelperf.records.section.JsonSection`): strict
#: JSON types, finite numbers; other keys are not read, so not kept.
_CONFIG = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


def _tree(paths: tuple[str, ...]) -> dict[str, Any]:
    """``("a", "b.c", "b.d")`` -> ``{"a": None, "b": {"c": None, "d": None}}``."""
    out: dict[str, Any] = {}
    rests: dict[str, list[str]] = {}
    for path in paths:
        head, _, rest = path.partition(".")
        if rest:
            if head in out and out[head] is None:
                raise ValueError(f"{path!r}: {head!r} is named whole and in part")
            out[head] = {}
            rests.setdefault(head, []).append(rest)
        elif out.setdefault(head, None) is not None:
            raise ValueError(f"{path!r}: {head!r} is named whole and in part")
    for head, parts in rests.items():  # each head's paths together: a.b.c and a.b.d
        out[head] = _tree(tuple(parts))
    return out


def _section(annotation: object, name: str) -> type[BaseModel]:
    """The section model in ``annotation`` (``StepTime | None`` -> ``StepTime``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation)
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return models[0]
    raise ValueError(f"{name}: not a section of one model ({annotation!r}), so its fields "
                     f"cannot be named apart")


def _dict_of(annotation: object) -> tuple[object, type[BaseModel]] | None:
    """``(key type, model)`` where ``annotation`` is an object of one section model by
    key (``dict[MachineName, MachineTiming] | None``), else None."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else (annotation,)
    for option in options:
        if typing.get_origin(option) is dict:
            key, value = typing.get_args(option)
            if isinstance(value, type) and issubclass(value, BaseModel):
                return key, value
    return None


def _typed(model: type[BaseModel], tree: Mapping[str, Any], name: str) -> type:
    """A TypedDict of the fields of ``model`` that ``tree`` names, each as ``model``
    declares it (its type and constraints; required where ``model`` requires it)."""
    hints: dict[str, Any] = {}
    for key, sub in tree.items():
        info = model.model_fields.get(key)
        if info is None:
            raise ValueError(f"{name}.{key}: {model.__name__} has no field {key!r}")
        nullable = type(None) in typing.get_args(info.annotation)
        keyed = _dict_of(info.annotation)
        if sub is None:
            hint: Any = info.rebuild_annotation()
        elif keyed is not None:  # an object of sections by name: the fields of each
            key_type, model_of = keyed
            inner = _typed(model_of, sub, f"{name}.{key}")
            hint = dict[key_type, inner]  # type: ignore[valid-type]
            hint = hint | None if nullable else hint
        else:
            inner = _typed(_section(info.annotation, f"{name}.{key}"), sub, f"{name}.{key}")
            hint = inner | None if nullable else inner
        if model is MachineTiming and key == "environment":
            # By its key in the file's environments (schema 3): a key is checked by being
            # found there (unpack), the table's keys by their pattern.
            hint = str | hint
        wrap = typing_extensions.Required if info.is_required() else typing_extensions.NotRequired
        hints[key] = wrap[hint]
    typed: type = typing_extensions.TypedDict(name.replace(".", "_"), hints)  # type: ignore[misc]
    return with_config(_CONFIG)(typed)


def _table_environment(tree: Mapping[str, Any]) -> object:
    """The type of an environment of a file's ``environments`` (schema 3): the fields of
    the entries' environments that ``tree`` names, each as :class:`Environment` declares
    it; none when it names none (the table is a few objects a file: only its keys are then
    read); :class:`Environment` where the entries' environments are named whole."""
    entries = tree.get(MACHINES_KEY)
    if entries is None and MACHINES_KEY in tree:
        return Environment
    named = entries.get("environment", {}) if isinstance(entries, Mapping) else {}
    if named is None:
        return Environment
    return _typed(Environment, named, "Block.environments")


def _case_key(key: str, info: ValidationInfo) -> str:
    """Counts the case keys of a file as they are read, repeated ones included (the
    parsed file keeps one of them)."""
    if isinstance(info.context, list):
        info.context.append(key)
    return key


@dataclass(frozen=True)
class Fields:
    """The fields of a block a command reads: dotted paths into the block
    (``"step_time.median"``), validated as :class:`Block` declares them."""

    paths: tuple[str, ...]
    #: ``{case key: {field: value}}`` of a file's blocks (:attr:`block`), and a file of
    #: them: their validators are built when first used (:attr:`_cases`, :attr:`_file`),
    #: as `accelperf baselines show` uses one of the module's three.
    _cases_type: Any = field(init=False, repr=False, compare=False)
    _file_type: Any = field(init=False, repr=False, compare=False)
    #: The TypedDict of one block's named fields.
    block: type = field(init=False, repr=False, compare=False)
    #: The fields named, as a tree (``{"step_time": {"median": None}, ...}``).
    paths_tree: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tree = _tree(self.paths)
        block = _typed(Block, tree, "Block")
        keyed = Annotated[str, AfterValidator(_case_key)]
        environment = _table_environment(tree)
        header = typing_extensions.TypedDict("BaselineFileFields", {  # type: ignore[name-match]  # noqa: UP013
            # 1 to 3 (READABLE_VERSIONS), an int: not true, not 1.0 (which a Literal takes)
            "schema_version": typing_extensions.Required[Annotated[StrictInt, Field(ge=1, le=3)]],
            "platform": typing_extensions.NotRequired[str],
            "cases": typing_extensions.Required[dict[keyed, block]],  # type: ignore[valid-type]
            "environments": typing_extensions.NotRequired[  # ENVIRONMENTS_KEY (schema 3)
                dict[EnvironmentKey, environment]],  # type: ignore[valid-type]
        })
        object.__setattr__(self, "block", block)
        object.__setattr__(self, "paths_tree", tree)
        object.__setattr__(self, "_cases_type", dict[str, block])  # type: ignore[valid-type]
        # Only the header's own keys at the top: a key this version does not know (kept by
        # the exact read, which also finds it written twice) sends the file there.
        object.__setattr__(self, "_file_type", with_config(
            ConfigDict(strict=True, allow_inf_nan=False, extra="forbid"))(header))

    @property
    def _cases(self) -> TypeAdapter[dict[str, Any]]:
        adapter: TypeAdapter[dict[str, Any]] = _one(self._cases_type)
        return adapter

    @property
    def _file(self) -> TypeAdapter[dict[str, Any]]:
        adapter: TypeAdapter[dict[str, Any]] = _one(self._file_type)
        return adapter

    def build(self) -> None:
        """Build the validator of a file's bytes (:meth:`read`) now, not when first used:
        before a fork, so that the processes share it."""
        self._file  # noqa: B018

    def invalid(self, cases: Mapping[str, Any]) -> dict[str, ValidationError]:
        """``{case key: its error}`` of the blocks of ``cases`` whose named fields do not
        validate, in the order of ``cases`` (as
        :func:`pytest_accelperf.store.schema.invalid_blocks` for whole blocks): one call over
        the mapping, then the blocks it names one by one, for each block's own error."""
        try:
            self._cases.validate_python(cases)
        except ValidationError as exc:
            named = {err["loc"][0] for err in exc.errors(include_url=False) if err["loc"]}
        else:
            return {}
        one = _one(self.block)
        out: dict[str, ValidationError] = {}
        for key, block in cases.items():
            if key not in named:
                continue
            try:
                one.validate_python(block)
            except ValidationError as exc:
                out[key] = exc
        return out

    def read(self, data: bytes) -> dict[str, dict[str, Any]] | None:
        """``{case key: {field: value}}`` of a baseline file's bytes, when the file parses,
        its header is a baseline file's, no case key or header key is written twice and
        every block's named fields validate; else None (read it the exact way: it names
        what is wrong). The entries of ``machines`` have their environment (the fields of
        it named) from the file's ``environments`` (schema 3,
        :func:`pytest_accelperf.store.machines.unpack`); a key the table lacks sends the
        file to the exact read, as does a top-level key other than ``schema_version``,
        ``platform``, ``cases`` and ``environments``. A key repeated inside a block, or a
        ``platform`` written twice at the top, is not looked for (neither is read here):
        only the exact read, which builds every value, finds it."""
        if data.count(b'"cases"') != 1 or data.count(b'"schema_version"') != 1:
            return None  # a header key may be written twice: the exact read tells
        if _holds(data, b"NaN") or _holds(data, b"Infinity"):
            return None  # a non-finite number where it is not read: the exact read tells
        keys: list[str] = []
        try:
            parsed = self._file.validate_json(data, context=keys)
        except (ValidationError, ValueError):
            return None
        cases: dict[str, dict[str, Any]] = parsed["cases"]
        if len(keys) != len(cases) or (  # the table written twice (it is read when once)
                ENVIRONMENTS_KEY in parsed and data.count(f'"{ENVIRONMENTS_KEY}"'.encode()) > 1):
            return None
        if MACHINES_KEY not in self.paths_tree:
            return cases
        if parsed["schema_version"] < 3:  # an entry's environment is written whole
            named = ENVIRONMENTS_KEY in parsed or any(
                isinstance(entry.get("environment"), str)
                for block in cases.values() for entry in (block.get(MACHINES_KEY) or {}).values())
            return None if named else cases
        missing = unpack(cases, parsed.get(ENVIRONMENTS_KEY) or {})
        return None if missing else cases


def _holds(data: bytes, word: bytes) -> bool:
    """Whether ``data`` holds ``word``, searched from the first occurrence of its first
    byte: most files of a store hold no capital N or I at all, and a search for one byte
    (memchr) passes over them several times faster than one for a word."""
    first = data.find(word[:1])
    return first >= 0 and data.find(word, first) >= 0


@functools.cache
def _one(block: type) -> TypeAdapter[Any]:
    return TypeAdapter(block)
