"""The torch trace of ``--accelperf-explain`` under a suite's ``filterwarnings = error``.

On an H200 (torch 2.11+cu130) torch's profiler warned, as it started, that it "clears
events at the end of each cycle"; the repository's suites turn warnings into errors, and
the explanation ended "no trace: profiling failed: UserWarning: ..." (torch warns once a
process, so the first explanation). The trace is
one cycle, so the warning is filtered there, and only there.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pytest_accelperf.gate.explain import _torch_trace

CYCLE_WARNING = ("Warning: Profiler clears events at the end of each cycle. Only events "
                 "from the current cycle will be reported. To keep events across cycles, "
                 "set acc_events=True.")


def test_cycle_warning_does_not_fail_the_trace(tmp_path: Path) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _torch_trace(tmp_path):
            warnings.warn(CYCLE_WARNING, UserWarning, stacklevel=1)
            torch.ones(4) @ torch.ones(4)
        assert (tmp_path / "trace.json").stat().st_size > 0
        # any other warning inside the trace is still the suite's to judge
        with pytest.raises(UserWarning, match="another"), _torch_trace(tmp_path):
            warnings.warn("another warning", UserWarning, stacklevel=1)
