"""The backends a session knows, by name: :class:`BackendRegistry`.

In a pytest session the registry is what the ``pytest_accelperf_backends`` hook returns,
built-ins and conftest backends alike (:meth:`AccelperfSession.backends
<pytest_accelperf.gate.session.AccelperfSession.backends>`). Outside one (a Ray worker, an A/B
worker, a script), :func:`get_backend` finds the built-in backends; a worker that trains a
case is handed its spec by the controller rather than looking it up.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from pytest_accelperf.backends.builtin import SPECS
from pytest_accelperf.backends.spec import BackendSpec, BackendSpecError
from pytest_accelperf.errors import UserError


class UnknownBackend(UserError, KeyError):
    """No backend of that name is registered (the message lists the known ones)."""

    def __str__(self) -> str:
        return str(self.args[0])


class BackendRegistry(Mapping[str, BackendSpec]):
    """Backend specs by name; a name registered twice with different specs is refused."""

    def __init__(self, specs: Iterable[BackendSpec] = ()) -> None:
        self._specs: dict[str, BackendSpec] = {}
        for spec in specs:
            self.add(spec)

    @classmethod
    def from_hook(cls, results: Iterable[object]) -> BackendRegistry:
        """The registry of what ``pytest_accelperf_backends`` implementations returned
        (each a list of specs, or None)."""
        registry = cls()
        for result in results:
            if result is None:
                continue
            if isinstance(result, BackendSpec) or not isinstance(result, list | tuple):
                raise BackendSpecError(
                    f"pytest_accelperf_backends must return a list of BackendSpec, not "
                    f"{result!r}: return [BackendSpec(...)]")
            for spec in result:
                if not isinstance(spec, BackendSpec):
                    raise BackendSpecError(
                        f"pytest_accelperf_backends returned {spec!r} in its list, not a "
                        f"BackendSpec: from pytest_accelperf.backends import BackendSpec")
                registry.add(spec)
        return registry

    def add(self, spec: BackendSpec) -> None:
        known = self._specs.get(spec.name)
        if known is not None and known != spec:
            same = " (declaring different needs or capabilities)" \
                if known.origin == spec.origin else ""
            raise BackendSpecError(
                f"backend {spec.name!r} is registered twice, differently: as {known.origin} "
                f"and as {spec.origin}{same}; give one of them another name")
        self._specs[spec.name] = spec

    def __getitem__(self, name: str) -> BackendSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownBackend(
                f"unknown backend {name!r}; available: {', '.join(sorted(self._specs))}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def packages(self) -> tuple[str, ...]:
        """Every package some backend declares (the fingerprint records their versions)."""
        return tuple(sorted({p for spec in self._specs.values() for p in spec.packages or ()}))


#: The built-in backends: what a process outside a pytest session can find by name.
BACKENDS = BackendRegistry(SPECS)


def get_backend(name: str) -> BackendSpec:
    """The spec of built-in backend ``name`` (:class:`UnknownBackend`, a ``KeyError``
    listing the known names, otherwise). In a pytest session, where conftests add
    backends, ask the session's registry instead."""
    return BACKENDS[name]
