"""--accelperf-compare=GIT_REF: A/B mode, the base revision and the working tree measured in
alternation by two worker processes (real git repositories, real JAX steps)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import NUMPY_SGD, NUMPY_SGD_CONFTEST, Suite, rounds_of_pairs, verdicts

from pytest_accelperf.ab import CompareError, rounds, tree
from pytest_accelperf.ab.rounds import ABMeasurement, Comparison, round_orders
from pytest_accelperf.ab.tree import environment_dirs, extract, moved_path, resolve, snapshot
from pytest_accelperf.ab.verdict import ab_check
from pytest_accelperf.collect.cases import Case
from pytest_accelperf.errors import UserError
from pytest_accelperf.records.verdict import Verdict
from pytest_accelperf.stats.bootstrap import (
    ab_verdict,
    paired_ratio,
    process_ratio,
    throughput_verdict,
)
from pytest_accelperf.stats.contention import Contention, Load

pytest.importorskip("jax")

MODEL = '''
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from pytest_accelperf.jax import JaxTask

HIDDEN = 256


def make_task(case):
    dim = 256
    true_w = np.random.default_rng(0).normal(size=(dim, 8)).astype(np.float32)

    def init_params(key):
        import jax
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (dim, HIDDEN)) * 0.05,
                "w2": jax.random.normal(k2, (HIDDEN, 8)) * 0.05}

    def loss_fn(params, batch):
        import jax.numpy as jnp
        h = jnp.tanh(batch["x"] @ params["w1"])
        return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)

    def make_batch(step):
        x = np.random.default_rng(step).normal(size=(case.batch, dim)).astype(np.float32)
        return {"x": x, "y": x @ true_w}

    return JaxTask(init_params=init_params, loss_fn=loss_fn, make_batch=make_batch,
                   optimizer=optax.sgd(0.01), param_specs=lambda p: {"w1": P(), "w2": P()})
'''

SUITE = '''
from model import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[512], steps=10, warmup=2)
def test_step(accelperf):
    accelperf.train(make_task(accelperf.case))
'''

FAST = ("--accel=cpu", "--accelperf-cpu-devices=1", "--accelperf-compare-rounds=6",
        "--accelperf-compare-processes=2", "--accelperf-json=report.json")
#: For a test that asserts a throughput verdict: an interval over FAST's two process pairs
#: is Student's t 12.71 standard errors wide each way (4.30 over three), and beside
#: another test two pairs measured 4x the work as 4.1x and 5.7x, which it cannot judge.
JUDGED = "--accelperf-compare-processes=3"
#: The budget of FAST's rounds, where a test does not set its own: seconds of rounds per
#: case, which hold the host lock. 2, not 4 (issue 47, CI within 30 minutes): at the default
#: tolerance of 1 %, which no interval resolves, a case's rounds go on to the budget once
#: the fewest are done. At 2 s and load 7 the timed session's ``test_speeds`` took 30
#: rounds (its first pair needs 4), ``test_slower`` and ``test_numpy_sgd`` their fewest, 6.
BUDGET = "--accelperf-compare-budget=2"
#: The contamination bound off: these tests run beside other tests (``-n 2``), and what
#: they check is the verdict of the ratio; contamination has tests of its own below.
UNBOUNDED = "--accelperf-max-foreign-load=64"
#: The plugin's default, which the suite's pyproject raises for the other tests.
DEFAULT_BOUND = "--accelperf-max-foreign-load=0.25"


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args],
                   cwd=path, check=True, capture_output=True)


def committed(suite: Suite, model: str, source: str) -> Suite:
    """``suite`` as a git repository whose first commit has ``source`` and its ``model``."""
    path = suite.pytester.path
    (path / "model.py").write_text(textwrap.dedent(model))
    suite.write(source)
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "base")
    return suite


@pytest.fixture
def repo(suite: Suite) -> Suite:
    """A git repository whose first commit has the suite and its model."""
    return committed(suite, MODEL, SUITE)


def _throughput(suite: Suite) -> dict[str, object]:
    case = suite.report()["cases"][0]
    check: dict[str, object] = next(c for c in case["checks"] if c["metric"] == "throughput")
    return check


def _check(suite: Suite, metric: str) -> dict[str, Any]:
    case = suite.report()["cases"][0]
    check: dict[str, Any] = next(c for c in case["checks"] if c["metric"] == metric)
    return check


# -- scenarios that share a session --------------------------------------------------------
# Each scenario is a test function of one inner suite, its working tree's change in a model
# module of its own, and the sessions that take the same options are one: the session, its
# workers' start and their imports of JAX and torch are paid once, not once a scenario
# (issue 47: CI within 30 minutes on 2 cores). A session's scenarios are all `timing` or all
# not, so that CI's deferred timing phase (tests/conftest.py) runs none of them twice.


def _function(nodeid: str) -> str:
    """The test function of an inner node id: ``test_slower`` of
    ``test_suite.py::test_slower[jax-nomesh-b512]``."""
    return nodeid.split("::")[-1].split("[")[0]


@dataclass(frozen=True)
class Shared:
    """One A/B session of several scenarios, a test function each, run by the first of the
    module's tests that asks for it, in its pytester folder (which outlives the test)."""

    path: Path
    result: pytest.RunResult

    def report(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.path / "report.json").read_text())
        return data

    def case(self, test: str) -> dict[str, Any]:
        """The report's one case of the inner test function ``test``."""
        found = [c for c in self.report()["cases"] if _function(c["nodeid"]) == test]
        assert len(found) == 1, [c["nodeid"] for c in self.report()["cases"]]
        case: dict[str, Any] = found[0]
        return case

    def check(self, test: str, metric: str) -> dict[str, Any]:
        check: dict[str, Any] = next(c for c in self.case(test)["checks"]
                                     if c["metric"] == metric)
        return check

    def outcome(self, test: str) -> str:
        """``PASSED`` or ``FAILED``: the inner test's line of the short summary (``-rA``)."""
        found = [line.split()[0] for line in self.result.outlines
                 if line.split()[:1] in (["PASSED"], ["FAILED"], ["ERROR"], ["SKIPPED"])
                 and _function(line.split()[1]) == test]
        assert len(found) == 1, self.result.outlines[-30:]
        return found[0]

    def lines(self, test: str) -> pytest.LineMatcher:
        """The inner test's own failure report (the lines under its ``___ test ___``
        header), where its checks' lines are."""
        out, inside = [], False
        for line in self.result.outlines:
            header = re.fullmatch(r"_{3,} (\S+) _{3,}", line)
            if header or line.startswith("==="):
                inside = bool(header) and _function(header[1]) == test if header else False
                continue
            if inside:
                out.append(line)
        assert out, f"no failure report of {test}"
        return pytest.LineMatcher(out)


@pytest.fixture(scope="module")
def shared_sessions() -> dict[str, Shared]:
    """The module's shared sessions by name, each run once (:func:`_shared`)."""
    return {}


def _shared(sessions: dict[str, Shared], name: str, suite: Suite,
            run: Callable[[Suite], pytest.RunResult]) -> Shared:
    if name not in sessions:
        sessions[name] = Shared(suite.pytester.path, run(suite))
    return sessions[name]


def _commit(path: Path) -> None:
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "base")


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


#: The timed session's inner test module: a working tree 8x as wide (``test_slower``).
#: Batch 128, not 512 (issue 47, CI within 30 minutes): at 512 its fewest 6 rounds took
#: 4.5 s at load 7 and 9.7 s at load 11-18, holding the host lock, and judged 9.5x (5.4-16.9)
#: and 23x (13.6-40.4) slower: a quarter of the batch is far past any tolerance still.
TIMED_SUITE = '''
from slower import make_task
from pytest_accelperf import cases

@cases(backend="jax", batch=[128], steps=10, warmup=2)
def test_slower(accelperf):
    accelperf.train(make_task(accelperf.case))
'''


#: A backend of the suite's own, registered by module (tests/conftest.py's NUMPY_SGD), which
#: the workers import by that module; a few ms a step on one BLAS thread. Batch 128, not
#: 512 (issue 47, CI within 30 minutes): at 512 its 6 rounds (the fewest) took 27.7 s of
#: the timed session at load 7, holding the host lock (each step's batch, made outside its
#: timer, is in the round's time too); the working tree's 4x the work is 4x at any batch.
NUMPY_AB_SUITE = '''
from pytest_accelperf import Case, cases

TASK = {"dim": 1024, "out": 256, "lr": 0.05}

@cases(Case(backend="numpy-sgd", batch=128, steps=10, warmup=2))
def test_numpy_sgd(accelperf):
    accelperf.train(dict(TASK))
'''


def _timed_session(suite: Suite) -> pytest.RunResult:
    """The scenarios whose verdicts depend on measured times and need JUDGED's three
    process pairs (no contamination bound): a working tree 8x as wide (``test_slower``), a
    conftest's backend whose working tree does 4x the work (``test_numpy_sgd``), and where
    torch is installed workers that run at speeds of their own (``test_speeds``,
    :data:`PROCESS_MODEL`). Every case is built in every worker: a scenario that one pair
    judges (``test_a_batch_function_that_waits...``) costs three times as much here as in a
    session of its own. One BLAS thread (and one OpenMP thread) in the session and its
    workers: beside another test (``-n 2``) a 2-thread BLAS call waits for a second core
    each step, and the numpy backend's 1.3 ms steps became 12-16 ms in both arms (it once
    judged 4x the work faster); JAX's steps do not use them, torch's are tiny."""
    path = suite.pytester.path
    (path / "slower.py").write_text(textwrap.dedent(MODEL))
    suite.write(TIMED_SUITE)
    suite.pytester.makepyfile(numpy_sgd=NUMPY_SGD)
    suite.pytester.makeconftest(NUMPY_SGD_CONFTEST)
    suite.write(NUMPY_AB_SUITE, name="test_numpy")
    if importlib.util.find_spec("torch") is not None:
        (path / "process_model.py").write_text(PROCESS_MODEL)
        suite.write(PROCESS_SUITE.replace("def test_step", "def test_speeds"),
                    name="test_speeds")
    _commit(path)
    _edit(path / "slower.py", "HIDDEN = 256", "HIDDEN = 2048")
    _edit(path / "test_numpy.py", '"dim": 1024', '"dim": 4096')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENBLAS_NUM_THREADS", "1")
        mp.setenv("OMP_NUM_THREADS", "1")
        return suite.run(*FAST, JUDGED, BUDGET, "--accelperf-compare=HEAD", UNBOUNDED,
                         "--accelperf-markdown=summary.md", "-rA", subprocess=True)


@pytest.fixture
def timed(suite: Suite, shared_sessions: dict[str, Shared]) -> Shared:
    """The timed scenarios' session (:func:`_timed_session`)."""
    return _shared(shared_sessions, "timed", suite, _timed_session)


#: One pair of processes and few rounds (at least 3, what the interval needs): what these
#: tests check is the base arm's record, not the timing.
ONE_PAIR = ("--accel=cpu", "--accelperf-cpu-devices=1", "--accelperf-compare-rounds=4",
            "--accelperf-compare-processes=1", "--accelperf-compare-budget=1",
            "--accelperf-json=report.json", "--accelperf-explain=off", UNBOUNDED)

#: The inner test functions of the untimed session; ``test_more.py`` (a module the base
#: revision lacks) is added to the working tree.
UNTIMED_SUITE = '''
from wider import make_task as wider
from retrained import make_task as retrained
from pytest_accelperf import cases

@cases(backend="jax", batch=[512], steps=10, warmup=2)
def test_wider(accelperf):
    accelperf.train(wider(accelperf.case))

@cases(backend="jax", batch=[512], steps=10, warmup=2)
def test_retrained(accelperf):
    accelperf.train(retrained(accelperf.case))
'''


def _untimed_session(suite: Suite) -> pytest.RunResult:
    """The scenarios judged on the base arm's record, not on a time (a tolerance of 10 for
    the step time, which none of them is about): a layer 13 % wider (``test_wider``), a
    learning rate five times larger (``test_retrained``), and a test module the base
    revision lacks (``test_more.py::test_added``)."""
    path = suite.pytester.path
    for name in ("wider", "retrained"):
        (path / f"{name}.py").write_text(textwrap.dedent(MODEL))
    suite.write(UNTIMED_SUITE)
    _commit(path)
    _edit(path / "wider.py", "HIDDEN = 256", "HIDDEN = 290")
    _edit(path / "retrained.py", "optax.sgd(0.01)", "optax.sgd(0.05)")
    suite.write(SUITE.replace("from model import", "from wider import")
                .replace("def test_step", "def test_added"), name="test_more")
    return suite.run(*ONE_PAIR, "--accelperf-compare=HEAD", "--accelperf-loss-either-way",
                     "--accelperf-compare-tolerance=10", "-rA", subprocess=True)


@pytest.fixture
def untimed(suite: Suite, shared_sessions: dict[str, Shared]) -> Shared:
    """The untimed scenarios' session (:func:`_untimed_session`)."""
    return _shared(shared_sessions, "untimed", suite, _untimed_session)


@pytest.mark.slow
@pytest.mark.timing
def test_a_slower_working_tree_is_a_regression_against_the_base(timed: Shared) -> None:
    assert timed.outcome("test_slower") == "FAILED"
    timed.lines("test_slower").fnmatch_lines([
        "*throughput: A/B slower than HEAD (*): step time *% longer (95% CI of the paired "
        "step-time ratio *alternating rounds of 5 steps*",
        "*A/B verdicts are not stored*",
    ])
    check = timed.check("test_slower", "throughput")
    assert check["verdict"] == "regression"
    data = check["data"]
    assert isinstance(data, dict) and data["mode"] == "ab" and data["ratio"] > 1.5
    assert len(data["blocks"]["base"]) == len(data["blocks"]["head"]) >= 6
    # the order of the arms is drawn for every pair of rounds: one of each order per pair
    first = data["first"]
    assert len(first) == len(data["blocks"]["base"])
    assert all(sorted(first[i:i + 2]) == ["base", "head"] for i in range(0, len(first) - 1, 2))
    # memory is judged against the base arm's own run of the case (issue 37), not a
    # stored baseline (none here: before, `new`): eight times the hidden layer's
    # activations and weights is more memory than HEAD's
    memory = timed.check("test_slower", "memory")
    assert memory["verdict"] == "regression", memory
    assert memory["data"]["mode"] == "ab" and memory["change"] > 1, memory
    assert str(memory["detail"]).startswith("more memory than HEAD ("), memory
    assert verdicts(timed.report())["test_slower[jax-nomesh-b128]"]["numerics"] == "regression"
    timed.lines("test_slower").fnmatch_lines([
        "*memory: more memory than HEAD (*): peak memory on * is *, HEAD (*) * (+*%, "
        "tolerance 10%)*"])
    # the slowdown comes with its cause: the two revisions' programs, diffed (issue 14)
    diff = data["program_diff"]
    assert diff and diff[0].startswith("FLOPs +"), diff
    assert "; program: FLOPs +" in str(check["detail"])
    # and a profiler trace of the working tree's step, beside the report (issue 27, part 3)
    explained = timed.case("test_slower")["run"]["extra"]["explain"]
    assert explained["path"] and explained["steps"] == 3, explained
    assert any(f.name.endswith(".xplane.pb") for f in Path(explained["path"]).rglob("*"))
    md = (timed.path / "summary.md").read_text()
    assert f"| `test_slower[jax-nomesh-b128]` | A/B | `{diff[0]}` | base | head |" in md, md


@pytest.mark.slow
@pytest.mark.timing
def test_a_backend_named_by_module_is_compared_in_ab_mode(timed: Shared) -> None:
    """The A/B workers (outside pytest) import the backend by its spec's module and step
    it in blocks (``ab_blocks=True``): a working tree whose steps are 4x the work is slower
    than the base revision. One BLAS thread (:func:`_timed_session`). Three process
    pairs: over two, Student's t is 12.71, and in CI the pairs measured the 4x as 4.1x and
    5.7x, an interval of 0.59-39.8 that judged nothing. (From
    tests/e2e/test_backend_plugins.py, to share the timed session.)"""
    assert timed.outcome("test_numpy_sgd") == "FAILED"
    timed.lines("test_numpy_sgd").fnmatch_lines(["*throughput: A/B slower than HEAD (*)*"])
    check = timed.check("test_numpy_sgd", "throughput")
    assert check["verdict"] == "regression"
    assert check["data"]["mode"] == "ab" and check["data"]["ratio"] > 1.5


@pytest.mark.slow
def test_more_work_than_the_base_fails_on_the_program_where_timing_cannot_tell(
        untimed: Shared) -> None:
    """Issue 37: a widened layer (+13 % FLOPs) compared in A/B mode. The program check
    compares with the base arm's own program, not the stored baseline (before: `new`, the
    diff only named inside the throughput detail), so the case fails even where the timing
    tolerance is far too wide to resolve the change."""
    assert untimed.outcome("test_wider") == "FAILED"
    assert untimed.check("test_wider", "throughput")["verdict"] != "regression"
    program = untimed.check("test_wider", "program")
    assert program["verdict"] == "regression", program
    assert program["data"]["mode"] == "ab" and str(program["data"]["against"]).startswith("HEAD (")
    assert str(program["detail"]).startswith("more work than HEAD (")
    assert ": FLOPs +" in str(program["detail"])
    untimed.lines("test_wider").fnmatch_lines(["*program: more work than HEAD (*): FLOPs +*"])


@pytest.mark.slow
def test_a_changed_training_fails_on_numerics_and_loss_against_the_base(
        untimed: Shared) -> None:
    """Issue 37: in A/B mode the numerics and loss checks compare the working tree's run
    with the base arm's own run of the case (trained once there as a normal run trains
    it), not with a stored baseline: with none stored, a learning rate five times larger
    fails the case on both (before: `new`, and the session passed): its loss ends 31 %
    below the base's, outside the band either way (``--accelperf-loss-either-way``, what a
    CI gate uses). The program and the memory are the same as the base's, and say so."""
    assert untimed.outcome("test_retrained") == "FAILED"
    label = "HEAD ("
    for metric in ("numerics", "loss"):
        check = untimed.check("test_retrained", metric)
        assert check["verdict"] == "regression", check
        assert check["data"]["mode"] == "ab", check
        assert str(check["data"]["against"]).startswith(label)
        assert "baseline" not in str(check["detail"]), check["detail"]
    numerics = untimed.check("test_retrained", "numerics")
    loss = untimed.check("test_retrained", "loss")
    assert str(numerics["detail"]).startswith("other numerics than HEAD ("), numerics
    assert "differs from HEAD (" in str(numerics["detail"])
    assert str(loss["detail"]).startswith("other training than HEAD ("), loss
    assert "below HEAD (" in str(loss["detail"]) and "the training changed" in loss["detail"]
    memory = untimed.check("test_retrained", "memory")
    assert memory["verdict"] == "pass" and memory["data"]["mode"] == "ab", memory
    assert str(memory["detail"]).startswith("as much memory as HEAD ("), memory
    assert untimed.check("test_retrained", "program")["verdict"] == "pass"
    untimed.lines("test_retrained").fnmatch_lines([
        "*numerics: other numerics than HEAD (*): * differs from HEAD (*)'s fingerprint: "
        "max |Δ| = *",
        "*A/B verdicts are not stored*"])


@pytest.mark.timing
def test_a_batch_function_that_waits_fails_against_the_base(repo: Suite) -> None:
    """nanoGPT's blind spot in A/B mode: the working tree's ``make_batch`` sleeps 20 ms a
    batch (a slow read). No A/B step time includes it (the batch is made beside the step)
    and no baseline is stored, so the session passed (``input_wait: new``). Now the head's
    run is judged against the base arm's own run of the case: more blocked time a batch,
    a regression, and the session fails. A session of its own: it is judged on one
    process pair, and the timed session's three would build its case in six workers."""
    model = repo.pytester.path / "model.py"
    line = "        return {\"x\": x, \"y\": x @ true_w}"
    model.write_text(model.read_text().replace(
        line, "        import time\n        time.sleep(0.02)\n" + line))
    result = repo.run(*ONE_PAIR, "--accelperf-compare=HEAD",
                      "--accelperf-compare-tolerance=10", "--accelperf-input-tolerance=0.5",
                      subprocess=True)
    result.assert_outcomes(failed=1)
    waits = _check(repo, "input_wait")
    assert waits["verdict"] == "regression", waits
    assert waits["data"]["mode"] == "ab" and str(waits["data"]["against"]).startswith("HEAD (")
    assert str(waits["detail"]).startswith("longer waits a batch than HEAD ("), waits
    assert "baseline" not in str(waits["detail"])
    assert 0.015 < waits["now"] < 0.05 and waits["baseline"] < 0.005, waits
    assert _check(repo, "input")["data"]["mode"] == "ab"  # judged against the base too
    result.stdout.fnmatch_lines(["*input_wait: longer waits a batch than HEAD (*"])


@pytest.mark.slow
@pytest.mark.timing
def test_an_unchanged_tree_is_not_a_regression(repo: Suite) -> None:
    """A/A at the default contamination bound: beside other tests (``-n 2``) the rounds
    are contaminated and ``inconclusive``; on a quiet machine, within the tolerance."""
    result = repo.run(*FAST, BUDGET, "--accelperf-compare=HEAD",
                      "--accelperf-compare-tolerance=0.1",
                      DEFAULT_BOUND, subprocess=True)
    result.assert_outcomes(passed=1)
    check = _throughput(repo)
    assert check["verdict"] in ("pass", "inconclusive"), check["detail"]
    data = check["data"]
    assert isinstance(data, dict)
    assert data["load"] is not None  # Linux: /proc was read
    assert data["contaminated"] == (data["load"]["foreign_cores"] > 0.25)
    if not data["contaminated"]:  # beside the other xdist worker A/A measured 0.63
        assert 0.7 < data["ratio"] < 1.4
    assert data["program_diff"] == []
    assert "same program in both revisions" in str(check["detail"])
    program = _check(repo, "program")  # the base arm's own program, not a stored baseline
    assert program["verdict"] == "pass" and program["data"]["mode"] == "ab"
    assert str(program["detail"]).startswith("same program as HEAD (")
    # and the base arm's own run of the case, for memory, numerics and loss (issue 37)
    for metric, words in (("memory", "as much memory as HEAD ("),
                          ("numerics", "same numerics as HEAD ("),
                          ("loss", "same loss curve as HEAD (")):
        check = _check(repo, metric)
        assert check["verdict"] == "pass", check
        assert check["data"]["mode"] == "ab", check
        assert str(check["detail"]).startswith(words), check["detail"]


@pytest.mark.slow
def test_a_competing_process_makes_an_unchanged_tree_inconclusive(repo: Suite,
                                                                   competitor: int) -> None:
    """One spinning competitor moved the A/A ratio between 0.85 and 1.18 with intervals that
    excluded 1: the rounds are contaminated, and the verdict says so instead of judging.
    A budget of 1 s, not 4: at a tolerance of 1 % the rounds never resolve and run to the
    budget (holding the host lock); a second of them, 8 rounds or more, is what the load is
    read over, with the competitor spinning on a core throughout. One process pair: the
    contamination is what is judged, not the ratio, and each pair builds the case again."""
    result = repo.run(*FAST, "--accelperf-compare-processes=1", "--accelperf-compare=HEAD",
                      "--accelperf-compare-tolerance=0.01", "--accelperf-compare-budget=1",
                      DEFAULT_BOUND, subprocess=True)
    result.assert_outcomes(passed=1)
    check = _throughput(repo)
    assert check["verdict"] == "inconclusive", check["detail"]
    data = check["data"]
    assert isinstance(data, dict) and data["contaminated"] is True
    assert data["load"]["foreign_cores"] > 0.25
    assert "the measurement is contaminated: other processes used" in str(check["detail"])
    assert "--accelperf-max-foreign-load=0.25" in str(check["detail"])


def test_contention_counts_other_processes_and_not_the_measured_ones(competitor: int) -> None:
    everyone = Contention([os.getpid()]).start()
    measured = Contention([os.getpid(), competitor]).start()
    time.sleep(1.0)
    seen, without = everyone.reading(), measured.reading()
    assert seen is not None and without is not None
    # The competitor spins on one core; beside CI's other jobs (two xdist workers, lint,
    # installs: load 5 on 2 cores) it gets 0.4 of one or less, so the bound is loose.
    assert seen.foreign_cores >= 0.15  # the competitor, whatever else runs
    assert seen.foreign_cores - without.foreign_cores >= 0.15  # its CPU time, subtracted
    assert seen.cores == os.cpu_count()


def test_a_contaminated_measurement_is_never_judged() -> None:
    slower = ABMeasurement(base=[[1.0, 1.0, 1.01]] * 8, head=[[2.0, 2.0, 2.02]] * 8,
                           seconds=4.0, first=["base", "head"] * 4)
    assert ab_check("HEAD", slower, 32, 0.01, 3).verdict is Verdict.REGRESSION
    slower.load = Load(foreign_cores=0.9, steal_cores=0.0, cores=2, seconds=4.0)
    check = ab_check("HEAD", slower, 32, 0.01, 3, max_foreign_load=0.25)
    assert check.verdict is Verdict.INCONCLUSIVE
    assert "other processes used 0.90 of 2 cores" in check.detail
    assert "step time +100.0%" in check.detail  # measured, shown, not judged
    assert ab_check("HEAD", slower, 32, 0.01, 3, max_foreign_load=1.0).verdict \
        is Verdict.REGRESSION


def test_round_orders_pair_the_arms_in_a_random_order() -> None:
    rng = random.Random(1)
    pairs = [round_orders(rng) for _ in range(200)]
    assert all(a != b for a, b in pairs)  # one of each order in every pair of rounds
    assert 60 < sum(a for a, _ in pairs) < 140  # which comes first is drawn


@pytest.mark.slow
def test_a_test_the_base_lacks_is_new_and_a_bad_ref_is_a_usage_error(untimed: Shared,
                                                                      suite: Suite) -> None:
    assert untimed.outcome("test_added") == "PASSED"
    check = untimed.check("test_added", "throughput")
    assert check["verdict"] == "new"
    assert "test_more.py does not exist" in str(check["detail"])
    # no run of the base arm to compare with: the stored-baseline checks stand, and say why
    memory = untimed.check("test_added", "memory")
    assert memory["verdict"] == "new" and "mode" not in memory["data"], memory
    assert str(memory["detail"]).endswith(": test_more.py does not exist]"), memory

    committed(suite, MODEL, SUITE)  # a repository of its own; no session trains in it
    bad = suite.run("--accelperf-compare=no-such-branch", subprocess=True)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--accelperf-compare=no-such-branch: git cannot resolve "
                              "'no-such-branch' to a commit*"])


def test_paired_ratio_and_its_verdict() -> None:
    base = [[1.0, 1.01, 0.99]] * 8
    slower = [[1.05, 1.06, 1.04]] * 8
    est = paired_ratio(slower, base)
    assert est.ratio == pytest.approx(1.05, rel=1e-3)
    assert throughput_verdict(est, 0.01).value == "regression"
    # a shared slowdown of some rounds (drift) hits both arms and cancels
    drift = [[t * (1 + 0.3 * (i % 2)) for t in b] for i, b in enumerate(base)]
    drifted = [[t * (1 + 0.3 * (i % 2)) for t in b] for i, b in enumerate(base)]
    assert paired_ratio(drifted, drift).ratio == pytest.approx(1.0)
    with pytest.raises(ValueError, match="rounds must be paired"):
        paired_ratio(base[:3], base[:4])


def test_moved_path_keeps_outside_entries() -> None:
    assert moved_path(["/repo/suites/jax", "/usr/lib", "/repo"], Path("/repo"),
                      Path("/tmp/base")) == ["/tmp/base/suites/jax", "/usr/lib", "/tmp/base"]


def test_the_environment_is_never_moved_into_a_tree() -> None:
    """The interpreter's site-packages stay where they are even inside the repository (a
    ``.venv`` at its root), and a prefix that holds the repository (a system Python's
    ``/usr``, a repository in ``/usr/src/app``) does not make the repository's own entries
    the environment's."""
    site_dir = next(p for p in sys.path if p.endswith("site-packages"))
    prefix = Path(sys.prefix)
    assert moved_path([site_dir, str(prefix / "suites")], prefix, Path("/t")) == [
        site_dir, "/t/suites"]
    repo = prefix / "src" / "app"
    assert prefix.resolve() not in environment_dirs(repo)
    assert Path(site_dir).resolve() in environment_dirs(repo)
    assert moved_path([str(repo / "suites"), site_dir], repo, Path("/t")) == [
        "/t/suites", site_dir]


def test_both_arms_run_from_trees_of_the_same_layout(tmp_path: Path) -> None:
    """Issue 15, part 4: the head arm runs from a copy of the working tree as git sees it,
    beside the base's extracted tree, not from the repository: the two arms differ only
    in their files' contents."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@e.com", "-c", "user.name=t", *args],
                       cwd=repo, check=True, capture_output=True)

    (repo / "pkg" / "model.py").write_text("WIDTH = 1\n")
    (repo / "gone.py").write_text("")
    (repo / ".gitignore").write_text("data/\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    (repo / "pkg" / "model.py").write_text("WIDTH = 2\n")  # changed, not committed
    (repo / "pkg" / "new.py").write_text("")  # untracked, not ignored
    (repo / "data").mkdir()
    (repo / "data" / "big.bin").write_bytes(b"0" * 100)  # ignored
    (repo / "gone.py").unlink()  # deleted in the working tree
    into = tmp_path / "compare"
    into.mkdir()
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                         text=True, check=True).stdout.strip()
    base, head = extract(repo, sha, into), snapshot(repo, into)
    assert (base.parent, head.parent) == (into, into) and len(base.name) == len(head.name)
    assert (base / "pkg" / "model.py").read_text() == "WIDTH = 1\n"
    assert (head / "pkg" / "model.py").read_text() == "WIDTH = 2\n"
    assert (head / "pkg" / "new.py").exists() and not (base / "pkg" / "new.py").exists()
    assert not (head / "data").exists() and not (base / "data").exists()
    assert not (head / "gone.py").exists() and (base / "gone.py").exists()
    # sys.path has the same shape in both arms
    entries = [str(repo / "pkg"), "/usr/lib", str(repo)]
    assert ([p.replace(str(base), "T") for p in moved_path(entries, repo, base)]
            == [p.replace(str(head), "T") for p in moved_path(entries, repo, head)])


def _committed(path: Path) -> Path:
    """A git repository at ``path`` with one commit."""
    path.mkdir(parents=True)
    (path / "a.py").write_text("")
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "base")
    return path


def test_a_bad_revision_is_a_user_error_naming_the_option_and_the_ref(tmp_path: Path) -> None:
    root = _committed(tmp_path / "repo")
    with pytest.raises(UserError) as info:
        resolve(root, "nosuchref")
    assert str(info.value) == (
        f"--accelperf-compare=nosuchref: git cannot resolve 'nosuchref' to a commit in "
        f"{root}; pass a branch, tag or commit (in a shallow CI clone fetch it first, e.g. "
        f"git fetch origin main && --accelperf-compare=origin/main)")
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(UserError, match=rf"^--accelperf-compare=main: {plain} is not in a "
                                        rf"git repository \(fatal: not a git repository"):
        resolve(plain, "main")


@pytest.fixture
def stuck_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``git`` that never answers (10 s here), first on PATH; the plugin's git timeouts
    cut to 1 s."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text("#!/bin/sh\nexec sleep 10\n")
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(tree, "GIT_TIMEOUT_S", 1.0, raising=False)  # none before the fix
    monkeypatch.setattr(tree, "ARCHIVE_TIMEOUT_S", 1.0, raising=False)


def test_a_git_that_does_not_answer_is_stopped_and_named(tmp_path: Path,
                                                         stuck_git: None) -> None:
    t0 = time.monotonic()
    with pytest.raises(UserError) as info:
        resolve(tmp_path, "main")
    assert time.monotonic() - t0 < 5
    assert str(info.value) == (f"--accelperf-compare=main: git rev-parse in {tmp_path} did "
                               f"not finish within 1 s (it was stopped); is the repository "
                               f"on a filesystem that hangs?")
    t0 = time.monotonic()
    with pytest.raises(CompareError, match=r"^git archive 0123456789ab did not finish within "
                                           r"1 s \(it was stopped\)$"):
        extract(tmp_path, "0123456789abcdef", tmp_path)
    assert time.monotonic() - t0 < 5


def test_a_comparison_that_cannot_be_set_up_is_not_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A setup that failed after its timeout (git archive stuck for 600 s) must not cost
    every later case of the session as long again."""
    comparison = Comparison("HEAD", _committed(tmp_path / "repo"), "cpu", 1, None)
    tried: list[str] = []

    def stuck(root: Path, sha: str, into: Path) -> Path:
        tried.append(sha)
        raise CompareError("git archive 0123456789ab did not finish within 600 s")

    monkeypatch.setattr(rounds, "extract", stuck)
    case = Case(backend="jax", batch=8)
    messages = []
    for _ in range(2):
        with pytest.raises(CompareError) as info:
            comparison.measure(case, "test_x.py", "test_x", rounds=2, block=1, budget=1,
                               tolerance=0.01)
        messages.append(str(info.value))
    assert len(tried) == 1
    assert messages == ["git archive 0123456789ab did not finish within 600 s",
                        "git archive 0123456789ab did not finish within 600 s (found by an "
                        "earlier case of this session; not tried again)"]
    comparison.close()


# -- issue 24, part 1: the process is a level of the interval ----------------------------


def test_a_process_level_offset_is_not_called_a_change() -> None:
    """Two processes of the same program differ in speed by around 1 % (memory layout,
    allocator, thread placement). The rounds of one pair share that offset: the interval
    over rounds alone (the old statistic) calls it a change; the two-level interval over
    process pairs does not, and reports the between-process spread beside the rounds'."""
    offsets = [(1.0, 1.013), (1.0, 0.992), (1.006, 1.0)]
    base, head, pairs = rounds_of_pairs(offsets, per_pair=20, jitter=0.002)
    first = [i for i, p in enumerate(pairs) if p == 0]
    old = paired_ratio([head[i] for i in first], [base[i] for i in first])
    assert throughput_verdict(old, 0.01) is Verdict.REGRESSION  # 1.3 %, a tight interval
    est, spread = process_ratio(head, base, pairs)
    assert throughput_verdict(est, 0.01) in (Verdict.PASS, Verdict.INCONCLUSIVE)
    assert ab_verdict(est, 0.01) in (Verdict.PASS, Verdict.INCONCLUSIVE)  # A/B mode's rule
    assert est.low < 1 < est.high
    assert spread.processes == 3 and spread.rounds == 60
    assert 0.005 < spread.process_sd < 0.02 and spread.within_sd < 0.003
    assert spread.process_dominates
    # a real change still shows through the process noise, given enough pairs
    slower = [[t * 1.05 for t in b] for b in head]
    assert throughput_verdict(process_ratio(slower, base, pairs)[0], 0.01) \
        is Verdict.REGRESSION
    with pytest.raises(ValueError, match="at least 2 are needed"):
        process_ratio(head, base, [0] * len(pairs))


def test_the_detail_names_both_levels_of_the_interval() -> None:
    base, head, pairs = rounds_of_pairs([(1.0, 1.0), (1.0, 1.0)], per_pair=4, jitter=0.01)
    measured = ABMeasurement(base=base, head=head, seconds=3.0, first=["base", "head"] * 4,
                             pairs=pairs, processes=2)
    check = ab_check("HEAD", measured, 32, 0.5, 5)
    assert "over 2 process pairs (between" in check.detail
    assert "between processes sd" in check.detail and "between rounds sd" in check.detail
    assert check.data["processes"] == 2 and check.data["pairs"] == pairs
    assert check.data["process_sd"] is not None and check.data["within_sd"] > 0
    single = ABMeasurement(base=base, head=head, seconds=3.0, first=["base", "head"] * 4,
                           pairs=[0] * len(pairs))
    assert "one process per revision" in ab_check("HEAD", single, 32, 0.5, 5).detail


#: A torch step whose speed is set per worker process (the stand-in for a process's memory
#: layout, which no test can set reliably): the worker's pair and arm choose a sleep.
PROCESS_MODEL = '''
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from pytest_accelperf.torch import TorchStep

#: (arm, pair) -> the process's speed: pair 0's head and pair 1's base 20 % slower.
SLOW = {("head", "0"), ("base", "1"), ("head", "2")}
ARM = Path(__file__).resolve().parent.name  # "base" or "head" in a worker's tree
FACTOR = 1.2 if (ARM, os.environ.get("ACCELPERF_AB_PAIR", "")) in SLOW else 1.0


def make_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        optimizer.zero_grad()
        loss = ((model(batch["x"]) - batch["y"]) ** 2).mean()
        loss.backward()
        optimizer.step()
        time.sleep(0.004 * FACTOR)
        return loss.detach()

    def make_batch(i):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(i))
        return {"x": x, "y": x.sum(dim=1, keepdim=True)}

    return TorchStep(step=step, make_batch=make_batch, model=model, stateful=())
'''

PROCESS_SUITE = '''
from process_model import make_step
from pytest_accelperf import cases

@cases(backend="torch", batch=[16], steps=6, warmup=1)
def test_step(accelperf):
    accelperf.train(make_step())
'''


@pytest.mark.slow
@pytest.mark.timing
def test_processes_of_different_speed_are_sampled_not_called_a_change(timed: Shared) -> None:
    """The same program in every worker, each process at its own speed: with one process
    per revision the rounds' interval calls the 20 % between its two processes a
    regression; over three process pairs the interval carries the between-process
    variance and the verdict is not a regression. One session: its three pairs' verdict,
    and the one-process verdict of the rounds of its first pair alone (what a session of
    one pair measures: that pair's head 20 % slower than its base), judged as A/B mode
    judges them (:func:`~pytest_accelperf.ab.verdict.ab_check`) at a tolerance of 5 %."""
    pytest.importorskip("torch")
    assert timed.outcome("test_speeds") == "PASSED"
    check = timed.check("test_speeds", "throughput")
    assert check["verdict"] in ("pass", "inconclusive"), check["detail"]
    data = check["data"]
    assert isinstance(data, dict) and data["processes"] == 3
    assert sorted(set(data["pairs"])) == [0, 1, 2]
    assert data["process_sd"] > 0.1  # the 20 % between processes, seen as such
    assert "over 3 process pairs (between processes sd" in str(check["detail"])
    # the old statistic: the first pair's rounds, as one process per revision times them
    first = [i for i, pair in enumerate(data["pairs"]) if pair == 0]
    assert len(first) >= 4, data["pairs"]  # --accelperf-compare-rounds=4 of a session of one
    one = ABMeasurement(base=[data["blocks"]["base"][i] for i in first],
                        head=[data["blocks"]["head"][i] for i in first],
                        seconds=data["seconds"], first=[data["first"][i] for i in first],
                        pairs=[0] * len(first))
    single = ab_check("HEAD", one, 16, 0.05, data["block"])
    assert single.verdict is Verdict.REGRESSION, single.detail
    assert "one process per revision" in single.detail


def test_close_after_a_start_cut_short_stops_the_arms_that_started(tmp_path: Path) -> None:
    """A start interrupted between a pair's two arms (Ctrl-C, a head arm that failed to
    start) left a pair with one arm, and closing raised KeyError: 'base' over the real
    error (seen on an H100). The arm that started is stopped."""
    import sys
    from multiprocessing import Pipe

    from pytest_accelperf.ab.arms import Arm

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ours, theirs = Pipe()
    comparison = object.__new__(Comparison)
    comparison._pairs = [{"head": Arm("head", proc, ours, tmp_path / "head-0.log")}]
    comparison._dir = None
    theirs.close()  # the worker never answers: stop() must still end it
    comparison.close()
    proc.wait(timeout=20)
    assert proc.returncode is not None
    assert comparison._pairs == []


def test_an_interrupted_comparison_keeps_what_its_workers_printed(tmp_path: Path) -> None:
    """Interrupted while a worker hung (an H100 session that never got past preparing its
    first case), nothing told why: the workers' logs went with their folder. Now they
    stay (the trees do not), and the folder is named."""
    folder = tmp_path / "accelperf-compare-x"
    (folder / "base").mkdir(parents=True)
    (folder / "base" / "model.py").write_text("x = 1\n")
    (folder / "base-0.log").write_text("compiling...\n")
    (folder / "socket").write_text("")
    comparison = object.__new__(Comparison)
    comparison._pairs, comparison._dir = [], folder
    assert comparison.close(keep_logs=True) == folder
    assert sorted(p.name for p in folder.iterdir()) == ["base-0.log"]

    comparison._dir = folder
    assert comparison.close() is None
    assert not folder.exists()
