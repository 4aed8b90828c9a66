"""Timing per machine: which machine a block's timing belongs to, the block a machine's
checks read, and how a machine's timing is written beside the others'.

A platform's store (``cpu-x8``) is shared by every host that runs it: a developer's laptop,
two kinds of CI runner. What a case's run gives that does not depend on the host (the
outcome, the program, the numerics, the loss, the memory plan) is kept once per block, for
every machine. Its timing (:data:`~pytest_accelperf.store.block.TIMING_SECTIONS`: step and
probe times, throughput, MFU, compile time, input times, the noisy mark) is kept per
machine, as asv keys its results by ``--machine`` and Bencher by testbed:

* the block's own timing, at its top level, is that of the machine that recorded the block
  (``"machine"``; in a block written before machines were named, the machine its
  ``environment`` names: :func:`default_machine`);
* every other machine's is under ``"machines"``, by name, each with the environment it was
  recorded in and when (:class:`~pytest_accelperf.store.block.MachineTiming`).

So a block written before machines were named is already a block of one machine, read as
it is; adding a machine's timing adds its entry and changes nothing else.

In a file (schema 3) an entry of ``machines`` names its environment by a key of the
file's ``environments`` (:func:`pack`, :func:`unpack`): a machine's environment is the
same for most of a file's cases, and repeated in every entry it was 60 % of the bytes of a
file of 5 machines (a 10,000-case store: 78 MB, 53 MB with the table). The block's own
environment stays in the block, where a reader (and a hand edit) finds it. In memory a
block holds its entries' environments whole, as in a file of schema 2.

A machine is named by ``--accelperf-machine``; by default by :func:`default_machine`, a
stable name derived from the host's fingerprint (its CPU model and a hash of the model and
its kernel-relevant features), the very fields a baseline stores, so that the host that
recorded a baseline before machines were named finds its timing under the same name.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_accelperf.errors import UserError
from pytest_accelperf.records.jsonvalue import JSONValue
from pytest_accelperf.store.block import MACHINE_PATTERN, TIMING_SECTIONS

__all__ = [
    "ENVIRONMENTS_KEY",
    "HOST_KEYS",
    "MachineError",
    "MachineView",
    "default_machine",
    "machines_of",
    "merge",
    "other_host",
    "pack",
    "recorder",
    "timing_of",
    "unpack",
    "validate_machine",
    "view",
]

#: The key of a block naming the machine of its top-level timing, and of the others'.
MACHINE_KEY = "machine"
MACHINES_KEY = "machines"
#: The key of a baseline file (schema 3) holding the environments of the entries of
#: ``machines``, each by the key the entries name it by (:func:`pack`).
ENVIRONMENTS_KEY = "environments"
#: What a machine is, of an environment: its host (device kind and count are the
#: platform's). Two entries of one name must agree on these (:func:`other_host`).
HOST_KEYS = ("host_cpu", "cpu_isa", "device_kind", "device_count")

_NAME_RE = re.compile(MACHINE_PATTERN)


class MachineError(UserError):
    """A machine name that cannot be one, or one name for two hosts."""


def validate_machine(name: str) -> str:
    """``name`` if it can name a machine: one path component of letters, digits, ``.``,
    ``_``, ``+`` and ``-``, not starting with a dot, without ``..``, at most 100 characters
    (as a platform key); else :class:`MachineError`, one line naming the fix."""
    if not _NAME_RE.fullmatch(name) or ".." in name:
        raise MachineError(
            f"invalid machine name {name!r}: a machine is named by one path component of "
            f"letters, digits, '.', '_', '+' and '-' (e.g. ci-x86, laptop), not starting with "
            f"a dot, without '..', at most 100 characters; pass such a name to "
            f"--accelperf-machine")
    return name


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40].strip("-") or "host"


@functools.lru_cache(maxsize=256)
def _default_name(cpu: str, isa: str) -> str:
    digest = hashlib.sha256(f"{cpu}\n{isa}".encode()).hexdigest()[:8]
    return f"{_slug(cpu)}-{digest}"


def default_machine(env: Mapping[str, object]) -> str:
    """The name of the machine of an environment when none is given: its CPU model, made
    a path component, and 8 hex digits of a hash of the model and its kernel-relevant CPU
    features (``amd-epyc-1f0e9a3c``). Two hosts of one model that differ in a feature
    (``avx_vnni``) get two names; two hosts alike in both, one. The core count is not in
    it: a baseline does not store it, and the host that recorded a baseline before
    machines were named must find its timing under this name.

    >>> default_machine({"host_cpu": "AMD EPYC", "cpu_isa": "avx avx2 fma"})
    'amd-epyc-b6571efe'
    """
    # Cached: `accelperf baselines show` asks it of every block of the store, of a few hosts.
    return _default_name(str(env.get("host_cpu") or ""), str(env.get("cpu_isa") or ""))


def recorder(block: Mapping[str, Any]) -> str:
    """The machine whose timing ``block``'s top-level timing sections are: its
    ``machine``, or for a block written before machines were named, the machine of its
    ``environment``."""
    name = block.get(MACHINE_KEY)
    if isinstance(name, str) and name:
        return name
    env = block.get("environment")
    return default_machine(env if isinstance(env, Mapping) else {})


def timing_of(block: Mapping[str, Any]) -> dict[str, JSONValue]:
    """The top-level timing sections of ``block`` (those it has)."""
    return {k: block[k] for k in TIMING_SECTIONS if k in block}


def machines_of(block: Mapping[str, Any]) -> list[str]:
    """Every machine with timing in ``block``: its recorder (where it has top-level timing)
    and the others, sorted."""
    others = block.get(MACHINES_KEY)
    names = set(others) if type(others) is dict or isinstance(others, Mapping) else set()
    if timing_of(block):
        names.add(recorder(block))
    return sorted(names)


@dataclass(frozen=True)
class MachineView:
    """What one machine's checks read of a stored block (:func:`view`).

    ``block``: the shared sections, and this machine's timing at the top level (none when
    it has none), as a block of one machine reads (no ``machine``, no ``machines``).
    ``timing_env``: the environment its timing was recorded in, None when the block has no
    timing of this machine (its timing checks are then ``new for this machine``);
    ``timing_recorded_at``: when. ``machines``: every machine with timing in the block."""

    block: dict[str, JSONValue]
    machine: str
    timing_env: Mapping[str, Any] | None
    timing_recorded_at: str | None
    machines: tuple[str, ...]

    @property
    def new(self) -> bool:
        """Whether this machine has no timing of its own in the block."""
        return self.timing_env is None

    @property
    def shared_env(self) -> Mapping[str, Any]:
        """The environment the shared sections were recorded in."""
        env = self.block.get("environment")
        return env if isinstance(env, Mapping) else {}


def view(block: Mapping[str, Any], machine: str) -> MachineView:
    """``block`` as ``machine``'s checks read it (:class:`MachineView`)."""
    shared = {k: v for k, v in block.items()
              if k not in TIMING_SECTIONS and k not in (MACHINE_KEY, MACHINES_KEY)}
    others = block.get(MACHINES_KEY)
    others = others if isinstance(others, Mapping) else {}
    env: Mapping[str, Any] | None = None
    when: str | None = None
    timing: dict[str, JSONValue] = {}
    if recorder(block) == machine:
        timing = timing_of(block)
        found = block.get("environment")
        env = found if isinstance(found, Mapping) else {}
        when = block.get("recorded_at")
    elif isinstance(others.get(machine), Mapping):
        entry = others[machine]
        timing = timing_of(entry)
        found = entry.get("environment")
        env = found if isinstance(found, Mapping) else {}
        when = entry.get("recorded_at")
    return MachineView({**shared, **timing}, machine, env, when, tuple(machines_of(block)))


def _entry(block: Mapping[str, Any]) -> dict[str, JSONValue]:
    """``block``'s top-level timing as an entry of ``machines``: with its environment and
    when it was recorded."""
    entry: dict[str, JSONValue] = {"environment": block.get("environment"), **timing_of(block)}
    if block.get("recorded_at") is not None:
        entry["recorded_at"] = block["recorded_at"]
    return entry


def merge(current: Mapping[str, Any] | None, new: Mapping[str, Any], machine: str, *,
          timing_only: bool) -> dict[str, JSONValue] | None:
    """The block to store when ``machine`` writes ``new`` (a block of one machine, as a
    run makes it) over ``current`` (the stored one, None: none); None: nothing to write.

    ``timing_only`` (the case's shared sections were judged unchanged, or a session was
    added): where ``current`` is another machine's block, only ``machine``'s entry of
    ``machines`` is written, and nothing else of the block changes. Otherwise (nothing
    stored, a change of the shared sections recorded, or the block is ``machine``'s own)
    ``new`` becomes the block, ``machine``'s; every other machine's timing is kept, the
    previous recorder's moved from the top level to its entry. A block that would be the
    stored one but for when it was recorded is not written (None): a refresh of a case
    whose every section came out the same, as an ingested log's does, is no diff."""
    new = {k: v for k, v in new.items() if k not in (MACHINE_KEY, MACHINES_KEY)}
    if current is not None and timing_only and recorder(current) != machine:
        timing = timing_of(new)
        if not timing:
            return None
        out = dict(current)
        others = dict(current.get(MACHINES_KEY) or {})
        others[machine] = _entry(new)
        out[MACHINES_KEY] = dict(sorted(others.items()))
        return out
    env = new.get("environment")
    out = dict(new)
    if machine != default_machine(env if isinstance(env, Mapping) else {}):
        out[MACHINE_KEY] = machine  # the default needs no name: recorder() derives it
    others = dict(current.get(MACHINES_KEY) or {}) if current is not None else {}
    others.pop(machine, None)
    if current is not None and recorder(current) != machine and timing_of(current):
        others[recorder(current)] = _entry(current)
    if others:
        out[MACHINES_KEY] = dict(sorted(others.items()))
    if current is not None and _but_when(out) == _but_when(current):
        return None  # the same block again (an ingested log re-read): its date stays
    return out


def _but_when(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "recorded_at"}


def other_host(name: str, now: Mapping[str, Any], stored: Mapping[str, Any]) -> str:
    """Why the timing stored under ``name`` (recorded in ``stored``) is not this host's
    (``now``): two machines of one name with different fingerprints, in one line naming
    both and the fix; ``""`` when they agree (:data:`HOST_KEYS`)."""
    differ = [k for k in HOST_KEYS if now.get(k) != stored.get(k)]
    if not differ:
        return ""

    def host(env: Mapping[str, Any]) -> str:
        return ", ".join(f"{k} {env.get(k)!r}" for k in differ)

    return (f"machine {name!r} names two hosts with different fingerprints: this one "
            f"({host(now)}; its default name is {default_machine(now)}) and the one whose "
            f"timing is stored under that name ({host(stored)}; default name "
            f"{default_machine(stored)}). Give this host a name of its own "
            f"(--accelperf-machine), or re-record that name's timing here with "
            f"--accelperf-update")


# -- the environments of a file's entries (schema 3) --------------------------------------------
def _canonical(env: Mapping[str, Any]) -> str:
    return json.dumps(env, sort_keys=True, separators=(",", ":"))


def pack(cases: Mapping[str, Mapping[str, Any]]
         ) -> tuple[dict[str, Mapping[str, Any]], dict[str, Mapping[str, object]]]:
    """``(cases, environments)``: ``cases`` as a file of schema 3 holds them, each entry of
    ``machines`` naming its environment by its key in ``environments``, and that table.

    A machine's environment is keyed by the machine's name; where the machine has several
    in these cases (its stack upgraded for some of them), each by the name, ``~`` and 8
    hex digits of its hash (:data:`~pytest_accelperf.store.block.ENVIRONMENT_KEY_PATTERN`):
    the same cases and environments always give the same keys, so a re-recording shows in
    a diff as the entries it changed. An entry whose environment is not an object (only an
    invalid block has one) is left as it is."""
    found: dict[str, dict[str, Mapping[str, Any]]] = {}
    for block in cases.values():
        for name, entry in _entries(block):
            env = entry.get("environment")
            if isinstance(env, Mapping):
                found.setdefault(name, {}).setdefault(_canonical(env), env)
    keys: dict[tuple[str, str], str] = {}
    table: dict[str, Mapping[str, object]] = {}
    for name, envs in found.items():
        for text, environment in envs.items():
            key = name if len(envs) == 1 else \
                f"{name}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"
            keys[(name, text)] = key
            table[key] = environment
    if not table:
        return dict(cases), {}
    out: dict[str, Mapping[str, Any]] = {}
    for case, block in cases.items():
        entries = block.get(MACHINES_KEY)
        if not isinstance(entries, Mapping) or not entries:
            out[case] = block
            continue
        packed: dict[str, JSONValue] = {}
        for name, entry in entries.items():
            env = entry.get("environment") if isinstance(entry, Mapping) else None
            if isinstance(env, Mapping):
                entry = {**entry, "environment": keys[(name, _canonical(env))]}
            packed[name] = entry
        out[case] = {**block, MACHINES_KEY: packed}
    return out, dict(sorted(table.items()))


def unpack(cases: Mapping[str, Any], environments: Mapping[str, Any]
           ) -> dict[str, tuple[str, str]]:
    """The entries of ``cases``' ``machines`` given their environment from
    ``environments`` by the key they name (:func:`pack`), in place (the blocks of a file
    just parsed; an environment of the table is one object, shared by its entries).
    ``{case key: (machine, key)}`` of the blocks with a key the table lacks (such a block
    is left as it is: it is invalid, and written back as it was read)."""
    missing: dict[str, tuple[str, str]] = {}
    # Plain loops over dicts, each entry looked up once: `show` resolves every entry of
    # a large store this way.
    for case, block in cases.items():
        entries = block.get(MACHINES_KEY) if isinstance(block, dict) else None
        if not entries or not isinstance(entries, dict):
            continue
        found = []
        for name, entry in entries.items():
            key = entry.get("environment") if isinstance(entry, dict) else None
            if type(key) is str:
                env = environments.get(key)
                if type(env) is not dict:
                    missing[case] = (name, key)  # the block is invalid: left as it was read
                    break
                found.append((entry, env))
        else:
            for entry, env in found:
                entry["environment"] = env
    return missing


def _entries(block: object) -> list[tuple[str, dict[str, JSONValue]]]:
    """``[(machine, entry)]`` of a block's ``machines`` (the entries that are objects; of
    JSON, so dicts: an ABC's isinstance would be the most of reading a large store)."""
    entries = block.get(MACHINES_KEY) if isinstance(block, dict) else None
    if not entries or not isinstance(entries, dict):
        return []
    return [(name, entry) for name, entry in entries.items() if isinstance(entry, dict)]
