"""The package's layers (docs/design.md, "Layers"): a module imports only from its own layer
or the layers below it, so that data flows one way and a newcomer can read the house from
the bottom up. Beside ``test_import_cycles.py`` (no cycle between modules), this holds the
order between packages, which no cycle test sees: a package may import another package's
module while that package imports one of its own (``store`` and ``checks`` once did).

The same walker as the cycle test (``ast``, nothing imported: every import counts, at
module level, inside functions and under ``TYPE_CHECKING`` alike).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from unit.test_import_cycles import PACKAGE, import_graph

#: The layers, bottom first: each entry a package of ``pytest_accelperf`` (or a module of
#: one, where a package's declarations sit lower than the rest of it). docs/design.md says
#: why each sits where it does.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "git", "interrupt"),
    ("stats", "records", "envs"),
    ("collect", "store"),
    ("provision", "backends"),
    ("checks",),
    ("report", "ingest"),
    ("cluster", "ab"),
    ("gate",),
    ("bisection", "cli", "hookspecs", "plugin", "jax", "torch", "lightning", "hf", "keras",
     ""),
)


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int:
    """The layer of ``pytest_accelperf.<module>``: the most specific entry that holds it
    (``""``: the package's ``__init__``)."""
    name = module.removeprefix("pytest_accelperf").removeprefix(".")
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for i, entries in enumerate(layers):
        for entry in entries:
            held = name == entry or (entry and name.startswith(entry + "."))
            if held and (best is None or len(entry) > best[0]):
                best = (len(entry), i)
    if best is None:
        raise KeyError(f"pytest_accelperf.{name} is in no layer: add its package to LAYERS "
                       f"(tests/unit/test_layers.py) and to docs/design.md")
    return best[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` from a module into a higher layer than its own."""
    return sorted(f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
                  for a, targets in graph.items() for b in targets
                  if layer_of(b) > layer_of(a))


def test_every_module_has_a_layer() -> None:
    for module in import_graph(PACKAGE):
        layer_of(module)


def test_no_module_imports_from_a_higher_layer() -> None:
    found = upward(import_graph(PACKAGE))
    assert not found, ("imports against the layers (docs/design.md, 'Layers'): move what "
                       "the lower module needs down, or pass it in:\n  " + "\n  ".join(found))


def test_a_planted_upward_import_fails(tmp_path: Path) -> None:
    """The test can fail: a store module importing the gate is found."""
    root = tmp_path / "pytest_accelperf"
    for package in ("store", "gate"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "gate" / "judge.py").write_text("X = 1\n")
    (root / "store" / "baselines.py").write_text(textwrap.dedent("""
        def later():
            from pytest_accelperf.gate.judge import X
            return X
    """))
    found = upward(import_graph(root))
    assert found == ["pytest_accelperf.store.baselines (layer 2) imports "
                     "pytest_accelperf.gate.judge (layer 7)"]


@pytest.mark.parametrize(("module", "layer"), [
    ("pytest_accelperf.backends.spec", 3), ("pytest_accelperf.backends.jax.step", 3),
    ("pytest_accelperf", 8), ("pytest_accelperf.store.block", 2)])
def test_the_most_specific_entry_names_the_layer(module: str, layer: int) -> None:
    assert layer_of(module) == layer
