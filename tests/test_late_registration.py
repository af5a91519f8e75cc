"""A per-batch hook implementation registered from any hook is called from the next batch on.

The loop and the context cache which per-batch hooks have implementations; the plugin manager
counts registrations, and the loop looks again (between two batches) when the count moved.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

import hookdet.plugin
from hookdet import pytorch
from tests.support.trials import OneWeightTrial

HP = {"lr": 0.1, "records": 12, "global_batch_size": 1}


class BatchWatcher:
    """Records the batches it sees at batch end and before each optimizer step."""

    def __init__(self) -> None:
        self.batch_ends: List[int] = []
        self.steps: List[int] = []
        self.context: Any = None

    @hookdet.plugin.hookimpl
    def hookdet_train_batch_end(self, context: Any, batch_idx: int, metrics: Dict[str, Any]) -> None:
        self.context = context
        self.batch_ends.append(batch_idx)

    @hookdet.plugin.hookimpl
    def on_before_optimizer_step(self, parameters: Any) -> None:
        self.steps.append(len(self.batch_ends))


class RegistersLate:
    """Registers a :class:`BatchWatcher` from ``hook_name`` (once, at ``when``)."""

    def __init__(self, hook_name: str, when: int = 0) -> None:
        self.watcher = BatchWatcher()
        self.run: Any = None
        self.when = when
        setattr(self, hook_name, hookdet.plugin.hookimpl(self._registrar(hook_name)))

    @hookdet.plugin.hookimpl
    def hookdet_configure(self, run: Any) -> None:
        self.run = run

    def _registrar(self, hook_name: str) -> Any:
        spec_arguments = {
            "on_trial_startup": "def f(first_batch_idx, checkpoint_uuid): register(first_batch_idx)",
            "on_training_start": "def f(): register(0)",
            "on_validation_end": "def f(metrics): register(self.run.state.batches_trained)",
            "hookdet_train_batch_end": "def f(context, batch_idx, metrics): register(batch_idx)",
            "on_training_epoch_end": "def f(epoch_idx): register(self.run.state.batches_trained)",
        }[hook_name]
        namespace: Dict[str, Any] = {"register": self._register, "self": self}
        exec(spec_arguments, namespace)
        return namespace["f"]

    def _register(self, position: int) -> None:
        if position >= self.when and self.run.plugins.get("watcher") is None:
            self.registered_at = self.run.state.batches_trained
            self.run.plugins.register("watcher", self.watcher)


@pytest.mark.parametrize(
    "hook_name, when",
    [
        ("on_trial_startup", 0),
        ("on_training_start", 0),
        ("hookdet_train_batch_end", 4),  # a per-batch hook, in the middle of a stretch
        ("on_validation_end", 3),  # a boundary
        ("on_training_epoch_end", 0),  # the end of the first epoch (records 6 per epoch)
    ],
)
def test_a_hook_registered_late_is_called_from_the_next_batch(tmp_path: Path, hook_name: str, when: int) -> None:
    registrar = RegistersLate(hook_name, when)
    hp = dict(HP, records=6)
    with pytorch.init(hparams=hp, exp_conf={"hyperparameters": hp, "plugins": {"only": ["callbacks"]}},
                      run_dir=tmp_path, plugins=[registrar]) as context:
        trial = OneWeightTrial(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(12), validation_period=pytorch.Batch(3), reporting_period=pytorch.Batch(100)
        )
    first = registrar.registered_at  # batches trained when it registered: the next batch is the first seen
    assert registrar.watcher.batch_ends == list(range(first, 12)), registrar.watcher.batch_ends
    # the context's step hooks were bound again too: one optimizer step per batch seen since
    assert len(registrar.watcher.steps) == 12 - first
