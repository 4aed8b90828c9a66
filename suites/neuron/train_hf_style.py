"""An outside training script, run as a command by ``test_neuron.py``: it trains a small
torch classifier on the CPU and prints its metrics the way the Hugging Face ``Trainer``
does (``trainer.log_metrics("train", metrics)``), which the plugin then ingests.

Usage: ``python train_hf_style.py BATCH STEPS``. Deterministic (seeded), real training.
"""

from __future__ import annotations

import datetime as dt
import sys
import time

import torch


def fmt_runtime(seconds: float) -> str:
    """As the Trainer prints ``*_runtime``: a ``timedelta`` with hundredths."""
    text = str(dt.timedelta(seconds=round(seconds, 2)))
    return text[:-4] if "." in text else text + ".00"


def main(batch: int, steps: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(1024, 10, generator=gen)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        x = torch.randn(batch, 1024, generator=gen)
        y = (x @ w).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(float(loss.detach()))
    runtime = time.perf_counter() - t0
    metrics = {
        "epoch": "1.0",
        "total_flos": f"{int(6 * steps * batch * (1024 * 2048 + 2048 * 10)) >> 30}GF",
        "train_loss": f"{sum(losses) / len(losses):.4f}",
        "train_runtime": fmt_runtime(runtime),
        "train_samples_per_second": f"{steps * batch / runtime:.3f}",
        "train_steps_per_second": f"{steps / runtime:.3f}",
    }
    print("***** train metrics *****")
    width = max(map(len, metrics))
    for key, value in metrics.items():
        print(f"  {key:<{width}} = {value:>10}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
