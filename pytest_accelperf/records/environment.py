"""The environment a run was measured in: the machine, the stack on it, and what hooks add.

One record (:class:`Environment`) for what :func:`pytest_accelperf.provision.describe.
environment` takes of this host, what a run carries (``Run.environment``), what a session's
report shows (``SessionReport.environment``) and what a baseline stores (``Block.
environment``, validated by the store with this model). Its JSON is one flat object:

- *the machine* (:data:`pytest_accelperf.provision.describe.MACHINE_KEYS`): ``platform``,
  ``device_kind``, ``device_count``, ``host_cpu``, ``cpu_isa`` (and ``accel``, the
  accelerator's name): a timing taken on another is no evidence about this change;
- *the stack* (:data:`pytest_accelperf.provision.describe.STACK_KEYS`): ``python``,
  ``packages`` and ``libraries`` (``{name: version}``): what an upgrade changes;
- what the ``pytest_accelperf_environment`` hook and the log ingesters add, keys of their own
  (``driver``, ``source``): :attr:`Environment.added`, JSON values beside the others.

A key absent from the JSON is absent from the record (a baseline recorded before
``libraries`` were fingerprinted has none), and a key present as ``null`` stays so
(``cpu_isa`` on a host that does not say): the history's hashes of an environment
(:func:`pytest_accelperf.report.history.fingerprint_hash`) are the same before and after a
round trip.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import ConfigDict, Field

from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.records.section import JsonSection


class Environment(JsonSection):
    """The environment fingerprint (:mod:`pytest_accelperf.provision.describe`); the keys that
    decide whether throughput is comparable are typed, hooks may add others."""

    #: Frozen: what :meth:`to_json` writes is what was read.
    model_config = ConfigDict(frozen=True)

    # -- the machine
    platform: str | None = None
    accel: str | None = None
    device_kind: str | None = None
    device_count: Annotated[int, Field(ge=0)] | None = None
    host_cpu: str | None = None
    cpu_isa: str | None = None
    # -- the stack
    python: str | None = None
    packages: dict[str, JSONValue] | None = None
    #: The accelerator's libraries (libtpu, CUDA runtime, cuDNN, NCCL, the driver, ...):
    #: absent from baselines recorded before they were fingerprinted.
    libraries: dict[str, JSONValue] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Environment:
        """``data`` (an environment as JSON) as it is, not validated: a report's or a
        hook's values are kept whatever their type (the store validates what it writes),
        and written back as they were read (:meth:`to_json`)."""
        out = cls.model_construct(None, **data)
        out._json = dict(data)
        return out

    @property
    def added(self) -> dict[str, JSONValue]:
        """The keys of neither the machine nor the stack, which hooks and ingesters add
        (``{"driver": "550.54"}``); a copy."""
        return dict(self.__pydantic_extra__ or {})

    def with_added(self, entries: Mapping[str, JSONValue]) -> Environment:
        """This environment with a hook's ``entries``: its ``packages`` joined to these
        (the hook's version where both name one), every other key set as the hook gives it
        (a known key replaced, a key of its own added)."""
        data = self.to_json()
        for key, value in entries.items():
            if key == "packages" and isinstance(value, dict):
                data["packages"] = {**(data.get("packages") or {}), **value}
            else:
                data[key] = value
        return Environment.from_json(data)

    def __eq__(self, other: object) -> bool:
        """Environments are equal when their JSON is (read from a file or made here)."""
        if not isinstance(other, Environment):
            return NotImplemented
        return self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]
