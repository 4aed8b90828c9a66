"""A JSON value, for what is JSON by nature and has no keys of its own to type.

Where a record's keys are known it has a type of its own (a dataclass or a TypedDict);
:data:`JSONValue` is for the rest: keys of a run no module declares (``Run.extra``), a
third party's configuration, a value as a report holds it.

It is pydantic's ``JsonValue`` under the package's one name: the models that validate
JSON at the edge (the store's schema, the environment, a section's extra keys) and the
plain code inside read the same alias, and pydantic knows how to validate it.
"""

from __future__ import annotations

from pydantic import JsonValue

#: Any JSON value: what :func:`json.loads` returns.
JSONValue = JsonValue

__all__ = ["JSONValue"]
