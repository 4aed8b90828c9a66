"""The program check, the compile-time check and the leak verdict, on records built by hand
(the backends' records are tested on real programs in unit/backends/jax/test_program.py and
unit/backends/torch/test_program.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pytest_accelperf.checks.compile_time import check_compile_time
from pytest_accelperf.checks.memory import check_memory
from pytest_accelperf.checks.program import check_program
from pytest_accelperf.records.program import changes, describe_changes, program_record
from pytest_accelperf.records.verdict import Tolerances, Verdict
from pytest_accelperf.store.schema import validate_block

TOL = Tolerances()
MiB = 2**20


def xla(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "flops": 1.0e9, "hardware_flops": 2.0e9, "bytes_accessed": 4.0e8,
        "collectives": {"all-reduce": {"count": 2, "bytes": 8 * MiB}},
        "host_callbacks": 0, "custom_calls": 0, "ops": {"dot": 12, "fusion": 30},
    }
    fields.update(overrides)
    return program_record("xla", **fields)


def block(program: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"outcome": "ok", "environment": {}}
    if program is not None:
        out["program"] = program
    out.update(extra)
    return out


def test_the_same_program_passes_and_says_what_it_saw() -> None:
    result = check_program(block(xla()), block(xla()), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.PASS
    assert "same program" in result.detail and "all-reduce x2" in result.detail
    assert changes(xla(), xla(), 0.0) == []


def test_an_added_all_gather_is_a_regression_named_with_its_bytes() -> None:
    now = xla(collectives={"all-reduce": {"count": 2, "bytes": 8 * MiB},
                           "all-gather": {"count": 4, "bytes": 48 * MiB}})
    result = check_program(block(now), block(xla()), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert "all-gather: 0 → 4 per step (+48.00 MiB)" in result.detail
    assert "FLOPs +0.0%" in result.detail
    assert "--accelperf-update" in result.detail


def test_more_flops_is_a_regression_and_names_the_ops_that_changed() -> None:
    now = xla(flops=2.4e9, hardware_flops=4.8e9, ops={"dot": 12, "fusion": 30,
                                                      "convolution": 2})
    result = check_program(block(now), block(xla()), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert "FLOPs +140.0%" in result.detail
    assert "ops: convolution 0 → 2" in result.detail


def test_a_host_callback_is_a_regression() -> None:
    result = check_program(block(xla(host_callbacks=1)), block(xla()), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert "host callbacks: 0 → 1 per step" in result.detail


def test_a_graph_break_is_a_regression_and_fewer_graphs_an_improvement() -> None:
    base = program_record("torch.compile", flops=1e6, graphs=1, graph_breaks=0, recompiles=0)
    broken = program_record("torch.compile", flops=1e6, graphs=2, graph_breaks=1,
                            recompiles=0, break_reasons=["Unsupported Tensor.item() call "
                                                         "(model.py:25 in forward)"])
    result = check_program(block(broken), block(base), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert ("graph breaks: 0 → 1 per step (Unsupported Tensor.item() call (model.py:25 in "
            "forward))") in result.detail
    back = check_program(block(base), block(broken), TOL, comparable=True)
    assert back is not None and back.verdict is Verdict.IMPROVEMENT


def test_amounts_within_the_tolerance_pass_counts_never_do() -> None:
    assert changes(xla(), xla(flops=1.005e9), 0.01) == []
    assert [c.name for c in changes(xla(), xla(flops=1.02e9), 0.01)] == ["flops"]
    found = changes(xla(), xla(collectives={"all-reduce": {"count": 3, "bytes": 8 * MiB}}), 0.5)
    assert [c.name for c in found] == ["collectives.all-reduce.count"]


def test_only_the_op_histogram_moving_passes_and_shows_it() -> None:
    result = check_program(block(xla(ops={"dot": 12, "fusion": 31})), block(xla()), TOL,
                           comparable=True)
    assert result is not None and result.verdict is Verdict.PASS
    assert "fusion 30 → 31" in result.detail


def test_another_environment_or_source_is_incomparable_and_no_record_no_check() -> None:
    other = check_program(block(xla(flops=9e9)), block(xla()), TOL, comparable=False)
    assert other is not None and other.verdict is Verdict.INCOMPARABLE
    torch = program_record("torch", flops=1.0e9)
    src = check_program(block(torch), block(xla()), TOL, comparable=True)
    assert src is not None and src.verdict is Verdict.INCOMPARABLE
    assert check_program(block(), block(xla()), TOL, comparable=True) is None
    new = check_program(block(xla()), None, TOL, comparable=True)
    assert new is not None and new.verdict is Verdict.NEW
    missing = check_program(block(xla()), block(), TOL, comparable=True)
    assert missing is not None and missing.verdict is Verdict.NEW


def test_flops_of_a_bind_axes_step_recorded_as_one_shards_are_not_compared() -> None:
    """Issue 23: a ``bind_axes`` step's FLOPs were one shard's (21.5 MFLOP stored for
    ``test_pmap_style``'s 4x2 case); now the global batch's (``global_flops``). A baseline
    that lacks the mark is not a +285 % regression of unchanged code: its FLOPs are left
    out, and said so; the rest of the program is compared as ever."""
    shard = xla(flops=21.5e6)
    whole = xla(flops=82.7e6, global_flops=True)
    assert whole["global_flops"] is True and "global_flops" not in shard
    validate_block(block(whole))
    result = check_program(block(whole), block(shard), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.PASS, result.detail
    assert result.detail.endswith("; FLOPs not compared: the baseline's count is one shard's, "
                                  "recorded before a bind_axes step was counted over the "
                                  "global batch (--accelperf-update records it)")
    assert result.baseline is None and result.now == 82.7e6
    more = copy.deepcopy(whole)
    more["host_callbacks"] = 1
    result = check_program(block(more), block(shard), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert "host callbacks: 0 → 1" in result.detail
    # Both counted over the global batch: compared.
    result = check_program(block(xla(flops=90e6, global_flops=True)), block(whole), TOL,
                           comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert result.detail.startswith("FLOPs +8.8%"), result.detail


def test_amounts_of_a_baseline_that_counted_loop_bodies_once_are_not_compared() -> None:
    """A baseline recorded before loop bodies were counted per iteration (no ``loops``):
    a scanned step's FLOPs would read +900 %, a pipeline's ticks +600 %, on unchanged
    code. Its amounts are left out, and said so; its counts are compared as ever."""
    once = xla(flops=21e6)
    counted = xla(flops=210e6, loops=1)
    assert counted["loops"] == 1 and "loops" not in once
    validate_block(block(counted))
    result = check_program(block(counted), block(once), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.PASS, result.detail
    assert result.detail.endswith(
        "FLOPs and bytes not compared: the baseline counted each loop's body once, where "
        "these count it once per iteration (recorded before the plugin counted loops, or "
        "by a jaxlib that cannot cost a loop's body; --accelperf-update records it)")
    more = copy.deepcopy(counted)
    more["host_callbacks"] = 1
    result = check_program(block(more), block(once), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    # Both counted per iteration: compared.
    result = check_program(block(xla(flops=420e6, loops=1)), block(counted), TOL,
                           comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert result.detail.startswith("FLOPs +100.0%"), result.detail


def test_describe_changes_is_empty_for_identical_programs() -> None:
    assert describe_changes(xla(), copy.deepcopy(xla()), 0.01) == []


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="not one of"):
        program_record("tpu-magic")


def test_a_block_with_a_program_and_growth_validates_and_a_bad_one_does_not() -> None:
    good = block(xla(), memory={"per_device": {"cpu:0": 10}, "peak": 10, "source": "x",
                                "growth": {"bytes_per_step": 0.0, "steps": 4,
                                           "after_warmup": 5, "after_steps": 5,
                                           "source": "live_arrays"}})
    validate_block(good)
    bad = block({**xla(), "collectives": {"all-reduce": {"count": -1, "bytes": 0}}})
    with pytest.raises(ValueError):
        validate_block(bad)


# -- an eager torch step's record: host syncs, matmul dtypes, bytes -----------------------------
def eager(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "flops": 1.0e6, "bytes_accessed": 4.0e5, "host_syncs": 0, "host_sync_sites": {},
        "ops": {"mm[bf16]": 3, "addmm[bf16]": 2, "_to_copy[f32]": 6, "convolution[f32]": 1},
    }
    fields.update(overrides)
    return program_record("torch", **fields)


def test_a_host_sync_is_a_regression_naming_where_and_one_less_an_improvement() -> None:
    site = "_local_scalar_dense at train.py in step: logged = loss.item()"
    now = eager(host_syncs=2, host_sync_sites={site: 2},
                ops={**eager()["ops"], "_local_scalar_dense[f32]": 2})
    result = check_program(block(now), block(eager()), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert result.detail.startswith(
        f"host syncs: 0 → 2 per step ({site}: 0 → 2); FLOPs +0.0%; "
        f"ops: _local_scalar_dense[f32] 0 → 2 ("), result.detail
    back = check_program(block(eager()), block(now), TOL, comparable=True)
    assert back is not None and back.verdict is Verdict.IMPROVEMENT
    assert back.detail.startswith(f"host syncs: 2 → 0 per step ({site}: 2 → 0)")


def test_wider_matmuls_are_a_regression_and_the_same_widths_in_another_mix_pass() -> None:
    f32 = eager(ops={"mm[f32]": 3, "addmm[f32]": 2, "convolution[f32]": 1})
    found = changes(eager(), f32, 0.01)
    # bf16 x 5 (2 bytes) against f32 x 5 (4 bytes); convolution is no matrix product here
    # (nor a precision, as XLA's convolution[highest] would be).
    assert [(c.name, c.baseline, c.now) for c in found] == [("matmul_dtypes", 10.0, 20.0)]
    assert describe_changes(eager(), f32, 0.01)[0] == "matmul dtypes: bf16 5 → 0, f32 0 → 5"
    f16 = eager(ops={"mm[f16]": 3, "addmm[f16]": 2, "_to_copy[f32]": 6, "convolution[f32]": 1})
    assert changes(eager(), f16, 0.01) == []
    result = check_program(block(f16), block(eager()), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.PASS
    assert "matmul dtypes: bf16 5 → 0, f16 0 → 5" in result.detail


def test_a_torch_baseline_recorded_before_the_op_counts_passes() -> None:
    old = program_record("torch", flops=1.0e6)
    result = check_program(block(eager(host_syncs=3)), block(old), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.PASS, result.detail
    assert result.detail.endswith(
        "; the baseline has no bytes accessed, host syncs, op histogram (recorded before they "
        "were read): not compared; re-record with --accelperf-update to gate them")
    assert describe_changes(old, eager(), 0.01) == []
    validate_block(block(eager(host_sync_sites={"nonzero at x.py:1 in f": 1}, host_syncs=1)))
    with pytest.raises(ValueError):
        validate_block(block({**eager(), "host_syncs": -1}))


# -- compile time ----------------------------------------------------------------------------
def timed(compile_time: float, probe: float = 0.001) -> dict[str, Any]:
    return block(compile_time=compile_time, probe={"kind": "matmul", "samples": [probe] * 8})


def test_a_slower_compile_beyond_the_tolerance_and_the_floor_is_a_regression() -> None:
    result = check_compile_time(timed(3.0), timed(1.0), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.REGRESSION
    assert "compile 3.00 s, baseline 1.00 s" in result.detail


def test_a_slower_machine_is_corrected_for_by_the_probe() -> None:
    result = check_compile_time(timed(3.0, probe=0.003), timed(1.0), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.PASS
    assert "corrected for a machine 3.00x" in result.detail


def test_a_small_change_is_never_a_verdict_and_an_unsteady_probe_is_inconclusive() -> None:
    small = check_compile_time(timed(0.2), timed(0.05), TOL, comparable=True)
    assert small is not None and small.verdict is Verdict.PASS
    unsteady = block(compile_time=3.0, probe={"kind": "matmul",
                                              "samples": [0.001, 0.01, 0.001, 0.02, 0.05]})
    result = check_compile_time(unsteady, timed(1.0), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.INCONCLUSIVE
    assert "too unsteady" in result.detail


def test_a_compile_beside_another_job_is_inconclusive() -> None:
    """Seen: an unchanged 2.8 s JAX compile took 5.6 s while other jobs shared the two
    cores; the probe, timed beside the steps, did not see it, and the check said
    regression. What other processes used during the compile decides now."""
    busy = {"foreign_cores": 1.2, "steal_cores": 0.0, "cores": 2, "seconds": 5.6}
    result = check_compile_time(timed(5.9), timed(2.8), TOL, comparable=True,
                                compile_load=busy, max_foreign_load=0.25)
    assert result is not None and result.verdict is Verdict.INCONCLUSIVE
    assert "other processes used 1.20 cores on average while it compiled" in result.detail
    assert result.data["load"] == busy
    alone = {**busy, "foreign_cores": 0.05}
    result = check_compile_time(timed(5.9), timed(2.8), TOL, comparable=True,
                                compile_load=alone, max_foreign_load=0.25)
    assert result is not None and result.verdict is Verdict.REGRESSION


def test_a_faster_compile_is_an_improvement_and_no_compile_no_check() -> None:
    result = check_compile_time(timed(1.0), timed(3.0), TOL, comparable=True)
    assert result is not None and result.verdict is Verdict.IMPROVEMENT
    assert check_compile_time(block(), timed(1.0), TOL, comparable=True) is None


# -- leaks -----------------------------------------------------------------------------------
def with_growth(per_step: float, *, per_device: int = 10 * MiB) -> dict[str, Any]:
    steps = 16
    return block(memory={"per_device": {"cpu:0": per_device}, "peak": per_device,
                         "source": "profiler",
                         "growth": {"bytes_per_step": per_step, "steps": steps,
                                    "after_warmup": 1 * MiB,
                                    "after_steps": 1 * MiB + per_step * steps,
                                    "source": "profiler"}})


def test_a_leak_is_a_memory_regression_with_or_without_a_baseline() -> None:
    leak = with_growth(133_000.0)
    for baseline in (None, with_growth(0.0)):
        result = check_memory(leak, baseline, TOL)
        assert result is not None and result.verdict is Verdict.REGRESSION
        assert "live memory grew 129.88 KiB per step over 16 measured steps" in result.detail
        assert "a leak" in result.detail


def test_no_growth_leaves_the_peak_verdict_alone() -> None:
    result = check_memory(with_growth(0.0), with_growth(0.0), TOL)
    assert result is not None and result.verdict is Verdict.PASS
    assert result.data["growth"]["bytes_per_step"] == 0.0
    tolerant = Tolerances(leak_bytes_per_step=1e6)
    result = check_memory(with_growth(133_000.0), with_growth(0.0), tolerant)
    assert result is not None and result.verdict is Verdict.PASS


# -- A/B: the two arms' programs diffed beside the timing verdict -------------------------------
def test_ab_verdict_names_the_program_change_or_says_the_program_is_the_same() -> None:
    from pytest_accelperf.ab.rounds import ABMeasurement
    from pytest_accelperf.ab.verdict import ab_check

    base_blocks = [[0.010] * 5 for _ in range(10)]
    head_blocks = [[0.013] * 5 for _ in range(10)]
    slower = ABMeasurement(base=base_blocks, head=head_blocks, seconds=1.0,
                           programs={"base": xla(), "head": xla(flops=1.3e9)})
    check = ab_check("main (abc)", slower, 32, 0.01, 5)
    assert check.verdict is Verdict.REGRESSION
    assert "; program: FLOPs +30.0%" in check.detail
    assert check.data["program_diff"] == ["FLOPs +30.0%"]
    same = ABMeasurement(base=base_blocks, head=head_blocks, seconds=1.0,
                         programs={"base": xla(), "head": xla()})
    assert "same program in both revisions" in ab_check("main", same, 32, 0.01, 5).detail
    unknown = ABMeasurement(base=base_blocks, head=head_blocks, seconds=1.0)
    assert "program" not in ab_check("main", unknown, 32, 0.01, 5).detail
    # A torch step's record is diffed by the same function, its new fields included.
    head = eager(host_syncs=1, host_sync_sites={"nonzero at a.py in f: i = m.nonzero()": 1})
    synced = ABMeasurement(base=base_blocks, head=head_blocks, seconds=1.0,
                           programs={"base": eager(), "head": head})
    assert ("; program: host syncs: 0 → 1 per step (nonzero at a.py in f: i = m.nonzero(): "
            "0 → 1)") in ab_check("main", synced, 32, 0.01, 5).detail


# -- confirmation backs off before re-measuring (issue 15, part 1) ----------------------------
def test_wait_for_quiet_waits_at_most_its_bound_and_returns_at_once_when_quiet() -> None:
    import os

    from pytest_accelperf.stats.contention import wait_for_quiet

    waited, load = wait_for_quiet(-1.0, max_wait=2.0)  # never quiet enough
    assert load is not None and 2.0 <= waited < 3.5
    waited, load = wait_for_quiet(float((os.cpu_count() or 1) + 1), max_wait=5.0)
    assert load is not None and waited < 1.5  # one window, and it was quiet enough


def test_hfu_uses_the_hardware_flops_and_mfu_the_model_s() -> None:
    from pytest_accelperf.records.run import Run

    run = Run(case_id="c", n_devices=8, step_times=[0.5, 0.5, 0.5], flops_per_step=1e9,
              peak_flops_per_device=1e9,
              program=program_record("xla", flops=1e9, hardware_flops=2e9))
    assert run.mfu == pytest.approx(1e9 / 0.5 / 8e9)
    assert run.hfu == pytest.approx(2 * run.mfu)
    assert run.to_json()["derived"]["hfu"] == pytest.approx(0.5)
    assert Run(case_id="c", step_times=[0.5]).hfu is None


def test_another_host_cpu_runs_the_same_program_but_not_the_same_step_times() -> None:
    """The committed baselines were recorded on a runner whose CPU has avx_vnni; on one
    without it every program check was `incomparable`, the one check that needs no timing.
    The host's CPU makes step times and numerics incomparable, not the program."""
    from pytest_accelperf.checks import run_checks
    from pytest_accelperf.provision.describe import PROGRAM_KEYS, differences, stack_changes
    from pytest_accelperf.records.run import Run

    base_env = {"platform": "cpu-x8", "host_cpu": "Xeon A", "cpu_isa": "avx2 avx_vnni",
                "python": "3.11.7", "packages": {"jax": "0.10.2"}}
    now_env = {**base_env, "host_cpu": "Xeon B", "cpu_isa": "avx2"}
    timing = differences(now_env, base_env)
    assert timing == ["host_cpu: Xeon A -> Xeon B", "cpu_isa: this host lacks avx_vnni"]
    assert differences(now_env, base_env, keys=PROGRAM_KEYS) == []
    run = Run(case_id="c", losses=[1.0], loss_steps=[0], step_times=[0.01] * 5,
              program=xla(flops=2e9))
    baseline = block(xla(), environment=base_env)
    checks = {c.metric: c for c in run_checks(run, None, baseline, TOL, differences=timing,
                                              program_differences=[])}
    assert checks["program"].verdict is Verdict.REGRESSION  # FLOPs doubled: still caught
    before = {c.metric: c for c in run_checks(run, None, baseline, TOL, differences=timing)}
    assert before["program"].verdict is Verdict.INCOMPARABLE  # what every CI run saw
    # A newer jax is the stack, not the machine: the program is compared across it
    # (an upgrade is judged), and the verdict names it.
    newer = {**base_env, "packages": {"jax": "0.11.2"}}
    assert differences(newer, base_env, keys=PROGRAM_KEYS) == []
    assert differences(newer, base_env) == []
    assert stack_changes(newer, base_env, "jax") == ["jax 0.10.2 → 0.11.2"]
    upgraded = {c.metric: c for c in run_checks(run, None, baseline, TOL,
                                                stack=stack_changes(newer, base_env, "jax"))}
    assert upgraded["program"].verdict is Verdict.REGRESSION
    assert upgraded["program"].detail.endswith("; stack: jax 0.10.2 → 0.11.2")
    assert upgraded["program"].data["stack"] == ["jax 0.10.2 → 0.11.2"]
