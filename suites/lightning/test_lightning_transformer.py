"""Lightning's own demo transformer, trained by ``lightning.Trainer.fit`` under the gate.

``LightningTransformer`` is the LightningModule Lightning ships in
``lightning.pytorch.demos`` (a ``torch.nn.Transformer`` language model, SGD, its
``training_step`` returning the NLL loss): code this project did not write, taken as
written. Its ``prepare_data`` downloads WikiText-2; nothing can be downloaded here, so the
suite's subclass overrides that one hook, and the data is synthetic tokens of the demo's
shape (sequences of 35, the next token the target), from a ``LightningDataModule``.

Two cases of global batch 8: one batch a step, and two micro-batches of 4 accumulated
(Lightning's ``accumulate_grad_batches``, driven by the case's ``grad_accum``). No
``bf16-mixed`` case: on this suite's CPU (no AVX512-BF16) the precision plugin's bf16
autocast made each step 62 times as long (7.3 s against 0.118 s, measured at load 2.5),
too long for a suite that CI runs; the program check tells the two precisions apart by the
dtypes of the ops dispatched (docs/measured.md).
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.demos import LightningTransformer
from torch.utils.data import DataLoader, TensorDataset

from pytest_accelperf import Case, CaseRunner, cases
from pytest_accelperf.lightning import LightningTask

VOCAB, SEQ = 2000, 35


class Transformer(LightningTransformer):
    """Lightning's demo, without its download (the one hook this suite replaces)."""

    def prepare_data(self) -> None:
        pass


class Tokens(LightningDataModule):
    """Synthetic token sequences of the demo's shape: inputs and next-token targets."""

    def __init__(self, batch_size: int, batches: int = 64) -> None:
        super().__init__()
        self.batch_size, self.batches = batch_size, batches

    def setup(self, stage: str) -> None:
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, VOCAB, (self.batches * self.batch_size, SEQ + 1),
                               generator=gen)
        self.train = TensorDataset(tokens[:, :-1], tokens[:, 1:])

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(self.train, batch_size=self.batch_size)


@cases(Case(backend="lightning", batch=8, steps=10, warmup=2, accels=("cpu", "gpu")),
       Case(backend="lightning", batch=8, grad_accum=2, steps=10, warmup=2,
            accels=("cpu", "gpu")))
def test_lightning_transformer(accelperf: CaseRunner) -> None:
    task = LightningTask(
        module=lambda case: Transformer(vocab_size=VOCAB),
        data=lambda case: Tokens(case.batch // case.grad_accum),
        trainer={"precision": "32-true"},
    )
    result = accelperf.train(task)
    assert result.run.outcome == "ok"
