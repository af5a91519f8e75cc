"""Continue from Determined: a checkpoint the real ``determined==0.38.1`` wrote, continued under
hookdet, ends bit for bit where Determined's uninterrupted run ends.

Determined trains :class:`~tests.parity.trials.Continued` (two LR schedulers, a stateful
callback, draws from torch's, NumPy's and Python's generators) for 4 batches and checkpoints;
hookdet resumes that checkpoint directory (``Trainer.fit(latest_checkpoint=<dir>)``) to batch 7.
Determined trains the same 7 batches without stopping. Every batch's metrics from batch 3 on,
every validation and the final weights are equal.

Why not against Determined's own continuation: Determined's local resume trains the data from
batch 0 again (``local-resume-restarts-data``), so its continuation is not the run it continues;
what a continuation must equal is the run that never stopped, and that is compared here.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.parity import harness
from tests.parity.checks import COMPARED, assert_same_weights, events
from tests.parity.compare import AVERAGE_RTOL, metric_value, values_differ
from tests.parity.test_parity import _batch_metrics, _validations

#: Validations at 4 and at the end only: between them no loader starts a pass, so the draws the
#: trial makes from the global generators are the only ones (``loader-leaves-global-rng``: each
#: of Determined's loader passes draws one value from torch's global generator, hookdet's none).
PERIODS = {"validation_period": {"Batch": 4}, "checkpoint_period": {"Batch": 4},
           "reporting_period": {"Batch": 2}, "checkpoint_policy": "all"}


def continue_under_hookdet(tmp_path: Path, trial: str, fit: dict, checkpoint_dir: Path) -> dict:
    """One hookdet phase that resumes ``checkpoint_dir`` (a directory Determined wrote)."""
    workdir = tmp_path / "hookdet"
    workdir.mkdir(parents=True)
    note = harness._cwd(workdir) / "determined_checkpoint.txt"
    note.write_text(str(checkpoint_dir))
    spec = {"trial": trial, "hparams": {"global_batch_size": 4}, "exp_conf": harness.default_exp_conf(),
            "init": {"enable_tensorboard_logging": False}, "fit": fit, "seed": 1234,
            "resume_from": str(note)}
    return harness._collect(harness._launch("hookdet", spec, workdir, 1, 1), "hookdet", workdir, harness.TIMEOUT_S)[0]


@pytest.mark.slow
def test_a_determined_checkpoint_continues_under_hookdet_bit_for_bit(tmp_path):
    stopped = harness.run_case(tmp_path / "stopped", "Continued", dict(PERIODS, max_length={"Batch": 4}),
                               frameworks=("determined",))["determined"][0][0]
    straight = harness.run_case(tmp_path / "straight", "Continued", dict(PERIODS, max_length={"Batch": 7}),
                                frameworks=("determined",))["determined"][0][0]
    uuid = (tmp_path / "stopped" / "determined" / "cwd" / "latest_checkpoint.txt").read_text().strip()
    checkpoint_dir = tmp_path / "stopped" / "determined" / "data" / "determined" / uuid
    assert (checkpoint_dir / "trial_state.pkl").is_file() and (checkpoint_dir / "load_data.json").is_file()
    assert stopped["error"] is None

    continued = continue_under_hookdet(tmp_path, "Continued", dict(PERIODS, max_length={"Batch": 7}),
                                       checkpoint_dir)
    assert continued["error"] is None, continued["error"]
    startup = events(continued, "callback", method="on_trial_startup")[0]
    assert startup["first_batch_idx"] == 4
    loaded = events(continued, "callback", method="load_state_dict")
    assert loaded and loaded[0]["state"]["items"]["calls"] > 0  # the callback's state, as Determined saved it

    # By value (``metric-representation``): per batch exactly, averages within float32 rounding.
    expected = {index: metric_value(m) for index, m in _batch_metrics(straight).items()}
    got = {index: metric_value(m) for index, m in _batch_metrics(continued).items()}
    assert sorted(got) == [4, 5, 6]
    assert not values_differ({index: expected[index] for index in got}, got)
    validations = {k: metric_value(v) for k, v in _validations(straight).items() if k > 4}
    assert sorted(validations) == [7]
    assert not values_differ(validations, {k: metric_value(v) for k, v in _validations(continued).items()}, AVERAGE_RTOL)
    compared = assert_same_weights("determined-checkpoint", straight["weights"], continued["weights"])
    COMPARED["determined-checkpoint"] = compared + len(got) + len(validations) + 2


def test_loader_passes_leave_the_global_generator_alone(tmp_path):
    """``loader-leaves-global-rng``: Determined's training loader draws from torch's global
    generator when it starts, and its validation pass at batch 2 again; hookdet's loaders draw
    from their own. The same trial, seeded alike, so sees other noise from the first batch on,
    while its data, models and schedulers are the same (the other cases, which draw nothing)."""
    fit = {"validation_period": {"Batch": 2}, "reporting_period": {"Batch": 2}, "max_length": {"Batch": 4},
           "checkpoint_policy": "all"}
    results = harness.run_case(tmp_path, "Continued", fit)
    determined, hookdet = (results[name][0][0] for name in ("determined", "hookdet"))
    det = {index: metric_value(m) for index, m in _batch_metrics(determined).items()}
    hd = {index: metric_value(m) for index, m in _batch_metrics(hookdet).items()}
    assert sorted(det) == sorted(hd) == [0, 1, 2, 3]
    assert all(values_differ(det[index], hd[index]) for index in det)
    COMPARED["loader-leaves-global-rng"] = 4
