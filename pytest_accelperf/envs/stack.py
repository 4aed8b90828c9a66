"""The *stack* of a Python environment: Python and the framework packages, each with its
version (:func:`stack_versions`, run by an A/B worker in its own environment), and the
check of an interpreter given with ``--accelperf-compare-python`` (:func:`check_python`).
Two stacks are told apart in the fingerprint's words
(:func:`pytest_accelperf.provision.describe.stack_changes`, as
:meth:`pytest_accelperf.ab.rounds.Comparison.stack_changes` calls it).

This module imports nothing of the plugin's but :mod:`pytest_accelperf.envs` and no
framework: an A/B worker calls it before it imports one.
"""

from __future__ import annotations

import json
import platform
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata

from pytest_accelperf.envs import EnvError

#: The packages a stack names, in this order, where they are installed.
STACK_PACKAGES = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda13-plugin",
                  "flax", "optax", "torch", "triton", "deepspeed", "ray", "numpy",
                  "nvidia-cudnn-cu12", "nvidia-nccl-cu12", "nvidia-cuda-runtime-cu12",
                  "neuronx-cc", "torch-neuronx")
#: The plugin's own imports, which every worker needs (module name: distribution).
PLUGIN_MODULES: Mapping[str, str] = {
    "pytest": "pytest", "numpy": "numpy", "scipy": "scipy", "filelock": "filelock",
    "tabulate": "tabulate", "pydantic": "pydantic", "orjson": "orjson",
    "typing_extensions": "typing_extensions"}


def stack_versions(packages: Iterable[str] = STACK_PACKAGES) -> dict[str, str]:
    """``{"python": "3.11.7", "jax": "0.10.2", ...}``: this environment's Python and the
    installed ones of ``packages``."""
    out = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


_PROBE = """
import importlib.metadata as m, importlib.util as u, json, platform, sys
mods = {mods!r}
dists = {dists!r}
missing = []
for mod in mods:
    try:
        if u.find_spec(mod) is None:
            missing.append(mod)
    except (ImportError, ValueError):
        missing.append(mod)
versions = {{}}
for d in dists:
    try:
        versions[d] = m.version(d)
    except m.PackageNotFoundError:
        pass
print(json.dumps({{"python": platform.python_version(), "missing": missing,
                  "versions": versions, "prefix": sys.prefix}}))
"""


def probe_python(python: str, modules: Sequence[str] = (),
                 option: str = "--accelperf-compare-python") -> dict[str, object]:
    """What the interpreter ``python`` has: its version, which of the plugin's imports and
    of ``modules`` it lacks (``missing``), and the versions of the stack's packages; an
    :class:`EnvError` naming ``option`` when it does not run."""
    code = _PROBE.format(mods=[*PLUGIN_MODULES, *modules], dists=list(STACK_PACKAGES))
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True,
                              timeout=120, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvError(f"{option}={python}: cannot run it: {exc}") from None
    if proc.returncode:
        tail = " ".join(proc.stderr.strip().splitlines()[-1:]) or f"exit {proc.returncode}"
        raise EnvError(f"{option}={python}: it does not run Python: {tail}")
    try:
        data: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EnvError(f"{option}={python}: it does not run Python (printed "
                       f"{proc.stdout.strip()[:80]!r})") from None
    return data


def check_python(python: str, plugin_dir: str, modules: Sequence[str] = (),
                 needed_by: str = "", option: str = "--accelperf-compare-python"
                 ) -> dict[str, str]:
    """The stack of the interpreter ``python`` when it can run an A/B worker: it has the
    plugin's dependencies, and ``modules`` (what the cases of ``needed_by``, a backend,
    import). Otherwise an :class:`EnvError` of one line naming the path, what is missing
    and how to install it."""
    data = probe_python(python, modules, option)
    versions = data.get("versions")
    missing = data.get("missing")
    assert isinstance(versions, dict) and isinstance(missing, list)
    plugin = [PLUGIN_MODULES[m] for m in missing if m in PLUGIN_MODULES]
    if plugin:
        raise EnvError(f"{option}={python}: lacks the plugin's dependencies "
                       f"({', '.join(plugin)}): install the plugin into it, e.g. {python} -m "
                       f"pip install -e {plugin_dir}")
    if missing:
        raise EnvError(f"{option}={python}: lacks {', '.join(missing)}, which the "
                       f"{needed_by or 'cases'} cases import: install it into that "
                       f"environment, e.g. {python} -m pip install {' '.join(missing)}")
    return {"python": str(data.get("python", "")),
            **{k: str(v) for k, v in versions.items()}}
