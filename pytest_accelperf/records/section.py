"""The base of a record the store validates with pydantic and keeps as the JSON it read.

:class:`JsonSection`: strict JSON types, finite numbers, unknown keys kept as JSON values,
and the JSON object a section was read from (:func:`pytest_accelperf.store.block.read`)
written back as it was. The baseline block's sections (:mod:`pytest_accelperf.store.block`)
and the environment (:mod:`.environment`) are such records. A check writes the sections it
records of a run as their model (:func:`made`), declared once there, and their JSON is
the fields it set.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ParamSpec, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from pytest_accelperf.records.jsonvalue import JSONValue

#: The constraints of a record's numbers, declared once: the TypedDicts of ``records/``
#: carry them in their fields' types, so that the section models of
#: :mod:`pytest_accelperf.store.block` made of those fields validate with them.
Int = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]
Number = float  # finite (allow_inf_nan=False); an integer is accepted
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]


class JsonSection(BaseModel):
    """Strict JSON types, finite numbers, unknown keys kept as JSON values."""

    #: ``defer_build``: a model's validator is built when first used, not on import, so that
    #: a command that reads a few fields (``accelperf baselines show``) does not build every
    #: section's.
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False,
                              validate_default=False, defer_build=True)
    #: ``init=False``: not a keyword of the model's ``__init__`` to the type checker.
    __pydantic_extra__: dict[str, JSONValue] = Field(init=False)
    #: The JSON object this was read from (:func:`read`); None where it was validated.
    _json: Mapping[str, Any] | None = PrivateAttr(default=None)

    def to_json(self) -> dict[str, Any]:
        """This section as JSON (a copy): the object it was read from, as it was
        (:func:`read`), the fields it was :func:`made` of and given since, as they are, or
        what validation kept of it."""
        if self._json is _MADE:
            return copy.deepcopy({name: _as_json(getattr(self, name))
                                  for name in type(self).model_fields
                                  if name in self.model_fields_set})
        if self._json is not None:
            return copy.deepcopy(dict(self._json))
        return self.model_dump(mode="json", exclude_unset=True)


#: The ``_json`` of a section :func:`made` made: its JSON is its fields set.
_MADE: Mapping[str, Any] = types.MappingProxyType({})

P = ParamSpec("P")
S = TypeVar("S", bound=JsonSection)


def made(model: Callable[P, S], /, *args: P.args, **fields: P.kwargs) -> S:
    """A section of ``model`` made of ``fields``, typed as ``model(**fields)`` types them,
    not validated (``model_construct``): how a check writes the section it records of a
    run (a failed run's is judged, never stored), with the model its one declaration. A
    field assigned afterwards (``section.wall_median = ...``) is written too; its JSON
    (:meth:`JsonSection.to_json`) is the fields set, in the model's order, each as it was
    given (a section in them as its JSON), no default added."""
    if args:
        raise TypeError(f"made({model!r}, ...) takes its fields as keywords")
    construct: Callable[..., S] = cast("type[S]", model).model_construct
    section = construct(**fields)
    section._json = _MADE
    return section


def _as_json(value: object) -> object:
    """``value`` of a field :func:`made` set, as JSON: a section as its JSON, a list or an
    object of them likewise (a tuple a list), anything else as it is."""
    if isinstance(value, JsonSection):
        return value.to_json()
    if isinstance(value, list | tuple):
        return [_as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    return value
