"""The helpers every backend shares (:mod:`pytest_accelperf.backends.measure.common`)."""

from __future__ import annotations

import pytest

from pytest_accelperf.backends.measure.common import TaskError, task_of
from pytest_accelperf.hf import TrainerTask


def test_a_trainer_backend_takes_its_own_task_and_names_it_for_any_other() -> None:
    task = TrainerTask(model=None, args={}, train_dataset=[])
    assert task_of(task, TrainerTask, "hf") is task
    with pytest.raises(TaskError) as caught:
        task_of(object(), TrainerTask, "hf")
    assert str(caught.value) == ("the hf backend trains a TrainerTask (pytest_accelperf.hf); "
                                 "got object")
