"""hookdet's own cost per batch, with the model, the data and the optimizer taken out.

::

    .venv/bin/python benchmarks/loop_overhead.py [--batches 20000] [--repeats 5]

A trial whose ``train_batch`` still calls ``context.backward`` and ``context.step_optimizer``
(on a loss whose ``backward`` and an optimizer whose ``step``/``zero_grad`` do nothing) and
returns a loss tensor, fed from a Python list of ready batches, runs through ``pytorch.init`` +
``Trainer.fit`` with the default plugins. What is left per batch is everything the loop, the
context and the plugins do: ``to_device``, bookkeeping, hooks, metric collection and the
report every 100 batches. The same calls without hookdet (a bare for-loop that unpacks the
batch, calls the no-op ``backward`` and keeps the detached loss) are the reference.

Main-thread CPU time over batches 1000..N, best of ``--repeats``: steady enough on a busy
machine to see a change of half a microsecond, which ``overhead.py``'s whole-step timings
cannot. The loop runs hot here (nothing evicts its code from the caches between batches), so
a real step pays these lines two to four times over; use this to compare versions of hookdet,
and ``overhead.py`` for what a user sees.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from hookdet import pytorch

FIRST_TIMED = 1000


class _NoOpLoss:
    """Stands in for a loss: ``context.backward`` calls this ``backward``, which does nothing."""

    def backward(self, **kwargs: Any) -> None:
        return None


def _null_trial(batches: List[Any], loss: torch.Tensor, marks: List[float], last: int) -> type:
    noop = _NoOpLoss()

    class NullTrial(pytorch.PyTorchTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            context.experimental.disable_dataset_reproducibility_checks()
            self.model = context.wrap_model(torch.nn.Linear(2, 2))
            optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            optimizer.step = lambda *args, **kwargs: None  # type: ignore[method-assign]
            optimizer.zero_grad = lambda *args, **kwargs: None  # type: ignore[method-assign]
            self.optimizer = context.wrap_optimizer(optimizer)

        def build_training_data_loader(self) -> Any:
            return batches

        def build_validation_data_loader(self) -> Any:
            return batches[:2]

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
            if batch_idx == FIRST_TIMED or batch_idx == last:
                marks.append(time.thread_time())
            self.context.backward(noop)  # type: ignore[arg-type]
            self.context.step_optimizer(self.optimizer)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
            return {"validation_loss": 0.0}

    return NullTrial


def hookdet_per_batch(total: int, batches: List[Any], loss: torch.Tensor) -> float:
    """CPU seconds per batch of a null trial under ``Trainer.fit`` with the default plugins."""
    marks: List[float] = []
    trial_class = _null_trial(batches, loss, marks, total - 1)
    config = {
        "name": "loop-overhead",
        "hyperparameters": {"global_batch_size": 4},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": total}},
    }
    with tempfile.TemporaryDirectory() as run_dir:
        with pytorch.init(hparams=config["hyperparameters"], exp_conf=config, run_dir=run_dir) as context:
            pytorch.Trainer(trial_class(context), context).fit(max_length=pytorch.Batch(total))
    return (marks[1] - marks[0]) / (total - 1 - FIRST_TIMED)


def bare_per_batch(total: int, batches: List[Any], loss: torch.Tensor) -> float:
    """CPU seconds per batch of the same calls in a bare for-loop."""
    noop, kept = _NoOpLoss(), []
    index, started, ended = 0, 0.0, 0.0
    while index < total:
        for batch in batches:
            if index == FIRST_TIMED:
                started = time.thread_time()
            if index == total - 1:
                ended = time.thread_time()
            inputs, labels = batch
            noop.backward()
            kept.append(loss.detach())
            index += 1
            if index == total:
                break
    return (ended - started) / (total - 1 - FIRST_TIMED)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20000, help="batches per fit (default 20000)")
    parser.add_argument("--repeats", type=int, default=5, help="fits per mode; the best counts")
    args = parser.parse_args(argv)
    if args.batches < FIRST_TIMED + 2:
        parser.error(f"--batches must be at least {FIRST_TIMED + 2}")
    torch.set_num_threads(1)
    batches = [(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))] * 64
    loss = torch.zeros((), requires_grad=True) * 1.0
    hookdet, bare = [], []
    for _ in range(args.repeats):
        hookdet.append(hookdet_per_batch(args.batches, batches, loss))
        bare.append(bare_per_batch(args.batches, batches, loss))
    import hookdet as package

    print(f"hookdet {Path(package.__file__).parent}")
    print(f"hookdet loop {min(hookdet) * 1e6:7.2f} µs/batch (best of {args.repeats})")
    print(f"bare loop    {min(bare) * 1e6:7.2f} µs/batch")
    print(f"overhead     {(min(hookdet) - min(bare)) * 1e6:7.2f} µs/batch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
