"""The base of a record the store validates with pydantic and keeps as the JSON it read.

:class:`JsonSection`: strict JSON types, finite numbers, unknown keys kept as JSON values,
and the JSON object a section was read from (:func:`pytest_accelperf.store.block.read`)
written back as it was. The baseline block's sections (:mod:`pytest_accelperf.store.block`)
and the environment (:mod:`.environment`) are such records.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Annotated, Any

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
    __pydantic_extra__: dict[str, JSONValue]
    #: The JSON object this was read from (:func:`read`); None where it was validated.
    _json: Mapping[str, Any] | None = PrivateAttr(default=None)

    def to_json(self) -> dict[str, Any]:
        """This section as JSON (a copy): the object it was read from, as it was
        (:func:`read`), or what validation kept of it."""
        if self._json is not None:
            return copy.deepcopy(dict(self._json))
        return self.model_dump(mode="json", exclude_unset=True)
