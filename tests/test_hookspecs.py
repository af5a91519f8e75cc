"""The hook catalogue: every spec is documented, grouped, and fires in a real run."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Dict

import torch

from hookdet import hookspecs, pytorch
from hookdet.builtin_plugins.callbacks import LIFECYCLE_METHODS
from tests.hook_recorder import SPEC_NAMES, HookRecorder
from tests.trials import OneWeightTrial


def test_every_spec_has_a_docstring() -> None:
    for name in SPEC_NAMES:
        assert inspect.getdoc(getattr(hookspecs, name)), f"{name} is undocumented"


def test_every_spec_appears_in_the_loop_map() -> None:
    module_doc = hookspecs.__doc__ or ""
    for name in SPEC_NAMES:
        assert name in module_doc, f"{name} is missing from the pseudocode map in hookspecs' docstring"


def test_lifecycle_hooks_are_exactly_the_callback_methods() -> None:
    lifecycle = {name for name in SPEC_NAMES if not name.startswith("hookdet_")}
    assert lifecycle == set(LIFECYCLE_METHODS)
    for name in lifecycle:
        spec_parameters = list(inspect.signature(getattr(hookspecs, name)).parameters)
        callback_parameters = list(inspect.signature(getattr(pytorch.PyTorchCallback, name)).parameters)[1:]
        assert spec_parameters == callback_parameters, name


def test_per_batch_hooks_are_specs() -> None:
    assert set(hookspecs.PER_BATCH_HOOKS) <= set(SPEC_NAMES)
    assert set(hookspecs.CHIEF_ONLY_HOOKS) <= set(SPEC_NAMES)


def test_every_spec_fires(tmp_path: Path) -> None:
    """A fit, a checkpoint and a resume with a plugin that implements every hook fire them all."""
    hparams: Dict[str, Any] = {"lr": 0.1, "records": 4, "global_batch_size": 1}
    exp_conf = {"hyperparameters": hparams, "plugins": ["callbacks", "checkpoint", "metrics_log"]}
    fired = set()
    for run_dir, resume in ((tmp_path / "first", None), (tmp_path / "second", tmp_path / "first")):
        recorder = HookRecorder()
        with pytorch.init(hparams=hparams, exp_conf=exp_conf, run_dir=run_dir, plugins=[recorder]) as context:
            trial = OneWeightTrial(context)
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(4 if resume is None else 6),
                validation_period=pytorch.Batch(2),
                latest_checkpoint=None if resume is None else str(resume),
            )
        fired.update(recorder.names())
        assert isinstance(trial.model.weight, torch.Tensor)
    assert fired == set(SPEC_NAMES), f"never fired: {sorted(set(SPEC_NAMES) - fired)}"
