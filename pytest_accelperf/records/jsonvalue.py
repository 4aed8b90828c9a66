"""A JSON value, for what is JSON by nature and has no keys of its own to type.

Where a record's keys are known it has a type of its own (a dataclass or a TypedDict);
:data:`JSONValue` is for the rest: what a backend or a log notes about its own run
(``Run.extra``), a third party's configuration, a value as a report holds it.
"""

from __future__ import annotations

from typing import TypeAlias

#: Any JSON value: what :func:`json.loads` returns.
JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
