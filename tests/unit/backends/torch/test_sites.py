"""Host syncs and graph breaks are keyed by the code, not its line
(:mod:`pytest_accelperf.records.sites`): a real training step, written to a file, counted, edited
and counted again. A comment inserted above a ``.item()`` (or the function moved down the
file) records the same program; a new ``.item()`` is a regression naming its function and
source text, and nothing that only moved. Before, a site was ``path:line in function``:
the moved ``.item()`` was a site gone and a site new (issue 37, item 4).
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_accelperf.backends.torch.flops import count_step  # noqa: E402
from pytest_accelperf.backends.torch.step_record import break_reason, eager_program  # noqa: E402
from pytest_accelperf.checks.program import check_program  # noqa: E402
from pytest_accelperf.records.program import changes, describe_changes  # noqa: E402
from pytest_accelperf.records.sites import is_line_keyed  # noqa: E402
from pytest_accelperf.records.verdict import Tolerances, Verdict  # noqa: E402
from pytest_accelperf.torch import TorchStep  # noqa: E402

TOL = Tolerances()

#: A training loop's file: ``{above}`` goes above the whole function (code that moves
#: it), ``{comment}`` above the logged ``.item()``, ``{extra}`` after it.
TRAIN = '''
import torch

{above}
def build():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(batch):
        opt.zero_grad(set_to_none=True)
        loss = ((model(batch["x"]) - batch["y"]) ** 2).mean()
        loss.backward()
        opt.step()
{comment}        logged = loss.item()  # a host sync a step
{extra}        return {{"loss": loss, "logged": logged}}

    return model, train_step


def make_batch(i):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(i))
    return {{"x": x, "y": x.sum(1, keepdim=True)}}
'''


def indented(lines: str, by: int) -> str:
    """Each of ``lines`` as a line of its own, indented ``by`` spaces (nothing for none)."""
    return "".join(" " * by + line + "\n" for line in lines.splitlines())


def load(path: Path, **parts: str) -> ModuleType:
    """Write the training file with ``parts`` and import it afresh (a module of its own
    each time, at the same path: what a commit of a user's train.py is)."""
    fill = {"above": parts.get("above", ""), "comment": indented(parts.get("comment", ""), 8),
            "extra": indented(parts.get("extra", ""), 8)}
    path.write_text(TRAIN.format(**fill))
    os.utime(path, ns=(0, len(path.read_text())))  # the edit is seen even within a tick
    linecache.checkcache(str(path))
    spec = importlib.util.spec_from_file_location(f"train_{abs(hash(str(fill)))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def program(path: Path, **parts: str) -> dict[str, Any]:
    """The program record of the training file's step, counted as a run counts it."""
    module = load(path, **parts)
    model, train_step = module.build()
    step = TorchStep(step=train_step, make_batch=module.make_batch, model=model, stateful=())
    counted = count_step(step, module.make_batch(0), torch.device("cpu"))
    return eager_program(counted.flops, counted.ops)


def judge(now: dict[str, Any], base: dict[str, Any]) -> tuple[Verdict, str]:
    result = check_program({"program": now}, {"program": base, "environment": {}}, TOL,
                           comparable=True)
    assert result is not None
    return result.verdict, result.detail


@pytest.fixture
def train(tmp_path: Path) -> Path:
    return tmp_path / "train.py"


def site(train: Path, text: str, function: str = "build.train_step") -> str:
    return f"_local_scalar_dense at {train} in {function}: {text}"


def test_a_site_is_its_function_and_source_text(train: Path) -> None:
    base = program(train)
    assert base["host_sync_sites"] == {site(train, "logged = loss.item()"): 1}, base
    assert not any(is_line_keyed(k) for k in base["host_sync_sites"])


@pytest.mark.parametrize("edit", [
    {"comment": "# log the loss: one sync a step, on purpose"},
    {"above": "SCALE = 1.0\n\n\ndef unrelated():\n    return SCALE\n\n"},
], ids=["comment-above-the-item", "the-function-moved-down"])
def test_a_line_that_only_moved_is_no_change(train: Path, edit: dict[str, str]) -> None:
    base = program(train)
    moved = program(train, **edit)
    assert moved == base  # the whole record: the history's change points compare it so
    assert changes(base, moved, 0.0) == [] and describe_changes(base, moved, 0.0) == []
    assert judge(moved, base)[0] is Verdict.PASS


def test_a_new_item_is_a_regression_naming_it_and_not_the_one_that_moved(
        train: Path) -> None:
    base = program(train)
    now = program(train, comment="# the loss, logged",
                  extra='assert torch.isfinite(loss).item(), "loss diverged"')
    verdict, detail = judge(now, base)
    assert verdict is Verdict.REGRESSION, detail
    new = site(train, 'assert torch.isfinite(loss).item(), "loss diverged"')
    assert f"; host syncs: 1 → 2 per step ({new}: 0 → 1); " in detail, detail
    assert "logged = loss.item()" not in detail, detail


def test_the_same_text_twice_in_a_function_is_two_sites(train: Path) -> None:
    twice = {"extra": "logged = loss.item()"}
    base = program(train, **twice)
    first, second = site(train, "logged = loss.item()"), site(
        train, "logged = loss.item() (occurrence 2)")
    assert base["host_sync_sites"] == {first: 1, second: 1}, base
    assert program(train, comment="# logged twice", **twice) == base
    thrice = program(train, extra="logged = loss.item()\nlogged = loss.item()")
    _, detail = judge(thrice, base)
    assert f"({site(train, 'logged = loss.item() (occurrence 3)')}: 0 → 1)" in detail, detail


def test_a_baseline_keyed_by_line_is_compared_by_file_and_op(train: Path) -> None:
    """A baseline recorded before sites were keyed by the code (``path:line in
    function``, as the committed DeepSpeed baselines are): its sites and the new ones are
    compared per file and op, so the moved ``.item()`` is no change there either."""
    now = program(train, comment="# moved", extra="logged = loss.item()")
    old = {**now, "host_syncs": 1,
           "host_sync_sites": {f"_local_scalar_dense at {train}:16 in train_step": 1}}
    assert is_line_keyed(next(iter(old["host_sync_sites"])))
    verdict, detail = judge(now, old)
    assert verdict is Verdict.REGRESSION
    assert detail.startswith(
        f"host syncs: 1 → 2 per step (_local_scalar_dense at {train}: 1 → 2); "), detail
    same = {**now, "host_syncs": 2,
            "host_sync_sites": {f"_local_scalar_dense at {train}:16 in train_step": 2}}
    assert judge(now, same)[0] is Verdict.PASS


BROKEN = '''
import torch


{above}
def forward(x):
    y = x * 2
{comment}    torch._dynamo.graph_break()
    return y + 1
'''


def broken_reasons(path: Path, **parts: str) -> list[str]:
    """The graph-break reasons dynamo gives for the file's function (compiled with the
    ``eager`` backend: dynamo's tracing, no inductor)."""
    path.write_text(BROKEN.format(above=parts.get("above", ""),
                                  comment=indented(parts.get("comment", ""), 4)))
    os.utime(path, ns=(0, len(path.read_text())))
    linecache.checkcache(str(path))
    spec = importlib.util.spec_from_file_location(f"broken_{abs(hash(str(parts)))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from torch._dynamo.utils import graph_break_reasons

    torch._dynamo.reset()
    before = len(graph_break_reasons)
    torch.compile(module.forward, backend="eager")(torch.ones(4))
    return [break_reason(r) for r in graph_break_reasons[before:]]


def test_a_graph_break_reason_is_keyed_by_the_code(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    base = broken_reasons(path)
    assert base and all(r.endswith(f"({path} in forward: torch._dynamo.graph_break())")
                        for r in base), base
    assert broken_reasons(path, comment="# break here, on purpose") == base
    assert broken_reasons(path, above="def helper():\n    return 1\n\n") == base


def test_source_text_drops_a_trailing_comment_not_a_hash_in_a_string() -> None:
    from pytest_accelperf.records.sites import code_text

    assert code_text("    x = loss.item()  # log it\n") == "x = loss.item()"
    assert code_text('    print("#", loss.item())\n') == 'print("#", loss.item())'
    assert code_text("    f(a,  # first\n") == "f(a,"


def test_a_frame_without_source_keeps_its_line(tmp_path: Path) -> None:
    """Code compiled from a string has no source to key by: its line is kept, and such a
    site is compared per file and op, as an old baseline's."""
    code = compile(textwrap.dedent('''
        def step(t):
            return t.sum().item()
    '''), str(tmp_path / "gone.py"), "exec")
    scope: dict[str, Any] = {}
    exec(code, scope)
    from pytest_accelperf.backends.torch.ops import OpCounter

    with OpCounter(torch.device("cpu")) as counter:
        scope["step"](torch.ones(3))
    assert dict(counter.sync_sites) == {
        f"_local_scalar_dense at {tmp_path / 'gone.py'}:3 in step": 1}


def test_a_baselines_line_keyed_break_reasons_are_compared_by_text_and_file() -> None:
    """A graph break recorded before (``text (path:line in function)``) is the same break
    as the code-keyed one in the same file; one in another file is new."""
    from pytest_accelperf.records.sites import new_reasons

    text = "Call to `torch._dynamo.graph_break()`"
    old = [f"{text} (model.py:8 in forward)"]
    moved = f"{text} (model.py in forward: torch._dynamo.graph_break())"
    elsewhere = f"{text} (layers.py in Block.forward: torch._dynamo.graph_break())"
    assert new_reasons(old, [moved]) == []
    assert new_reasons(old, [moved, elsewhere]) == [elsewhere]
    assert new_reasons([moved], [moved, elsewhere]) == [elsewhere]


def test_a_site_without_a_python_frame_is_compared_as_it_is() -> None:
    """``?`` (an op on autograd's thread, no Python frame) has no line to drop: a record
    with it keeps comparing by site."""
    from pytest_accelperf.records.sites import compare_counts

    code = "nonzero at train.py in step: i = m.nonzero()"
    assert not is_line_keyed("nonzero at ?")
    assert compare_counts({"nonzero at ?": 1, code: 1}, {"nonzero at ?": 1, code: 2}) == [
        (code, 1, 2)]


def test_the_committed_deepspeed_baseline_passes_against_the_code_keyed_site() -> None:
    """The repository's ZeRO-3 baseline was recorded with a line-keyed site; the same
    program recorded now (its site as a run of this suite records it) is no change, and
    another sync is named per file and op."""
    import json

    stored = Path(__file__).parents[4] / "baselines/cpu-x8/suites/torch/test_deepspeed.json"
    base = json.loads(stored.read_text())["cases"]["test_zero[deepspeed-gpt-w2-zero3-b4]"][
        "program"]
    (old,) = base["host_sync_sites"]
    assert is_line_keyed(old), old
    zero = ("_local_scalar_dense at deepspeed/runtime/zero/utils.py in "
            "assert_lst_len_same_as_other_ranks: rank0_list_length = "
            "rank0_len_tensor.cpu().item()")
    now = {**base, "host_sync_sites": {zero: 1}}
    assert describe_changes(base, now, 0.01) == [] and judge(now, base)[0] is Verdict.PASS
    more = {**now, "host_syncs": 2, "host_sync_sites": {
        zero: 1, "_local_scalar_dense at train.py in step: logged = loss.item()": 1}}
    verdict, detail = judge(more, base)
    assert verdict is Verdict.REGRESSION
    assert detail.startswith(
        "host syncs: 1 → 2 per step (_local_scalar_dense at train.py: 0 → 1)"), detail
