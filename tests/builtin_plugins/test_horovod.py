"""The horovod plugin: 2 real ranks under horovodrun (gloo) against the closed form and one process.

Skipped, with the reason, where ``horovod.torch`` does not import (build it with
``scripts/build_horovod.sh``). The conflict with ``ddp`` is tested without Horovod in
``test_ddp.py``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hookdet.cli import commands as cli
from hookdet.plugins.builtin.horovod import _named_parameters
from tests.support.distributed_trials import (
    TESTS_DIR,
    expected_weights,
    hookdet_command,
    read_rank,
    read_weight,
    run_command,
    write_config,
)

pytest.importorskip(
    "horovod.torch", reason="Horovod with PyTorch support is not installed (scripts/build_horovod.sh builds it)"
)

LAUNCH_TIMEOUT = 180
BATCHES = 10
HPARAMS = {"global_batch_size": 4, "lr": 0.1, "records": 28, "lr_gamma": 0.9}


@pytest.mark.slow
@pytest.mark.parametrize(
    "aggregation, compression, launch",
    [(1, False, "horovodrun"), (2, True, "hookdet-run")],
    ids=["aggregation1-horovodrun", "aggregation2-fp16-compression-hookdet-run"],
)
def test_two_horovod_ranks_match_one_process(
    tmp_path: Path, aggregation: int, compression: bool, launch: str
) -> None:
    config = write_config(
        tmp_path / "experiment.yaml",
        HPARAMS,
        searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                  "max_length": {"batches": BATCHES}},
        min_validation_period={"batches": 5},
        optimizations={"aggregation_frequency": aggregation, "gradient_compression": compression},
        plugins={"only": ["callbacks", "preemption", "metrics_log", "checkpoint", "horovod"]},
    )
    one_process = write_config(
        tmp_path / "one.yaml",
        HPARAMS,
        searcher={"name": "single", "metric": "validation_loss", "smaller_is_better": True,
                  "max_length": {"batches": BATCHES}},
        min_validation_period={"batches": 5},
        optimizations={"aggregation_frequency": aggregation},
    )
    status = cli.main([
        "run", str(one_process), "--run-dir", str(tmp_path / "one"), "--model-dir", str(TESTS_DIR),
    ])
    assert status == 0
    if launch == "horovodrun":
        command = [
            sys.executable, "-m", "horovod.runner.launch", "-np", "2", "--gloo",
            *hookdet_command(config, tmp_path / "two"),
        ]
    else:
        command = hookdet_command(config, tmp_path / "two", "--slots", "2")
    result = run_command(command, timeout=LAUNCH_TIMEOUT)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"

    ranks = [read_rank(tmp_path / "two", rank) for rank in (0, 1)]
    assert [r["size"] for r in ranks] == [2, 2]
    final = [read_weight(tmp_path / "two", rank) for rank in (0, 1)]
    assert torch.equal(final[0], final[1])
    # Horovod averages the two ranks' gradients (each the mean over half the batch) where one
    # process takes one mean: float32 rounding differs, so equality is within tolerance. With fp16
    # compression the gradients travel with 11 significant bits.
    rtol = 2e-3 if compression else 2e-6
    torch.testing.assert_close(final[0], read_weight(tmp_path / "one", 0), rtol=rtol, atol=1e-6)
    closed_form = expected_weights(28, 4, 0.1, BATCHES, aggregation, lr_gamma=0.9)
    for record in ranks:
        assert record["batches"] == list(range(BATCHES))
        assert record["weights"] == pytest.approx(closed_form, rel=rtol, abs=1e-6)
    assert ranks[0]["validations"] == ranks[1]["validations"]
    assert len(ranks[0]["validations"]) == 2
    for name, value in read_rank(tmp_path / "one", 0)["validations"][-1].items():
        assert ranks[0]["validations"][-1][name] == pytest.approx(value, rel=10 * rtol), name
    # The optimizer Horovod built, and the scheduler stepped through it once per optimizer step.
    expected_lr = 0.1 * 0.9 ** (BATCHES // aggregation)
    assert ranks[0]["horovod"] == {
        "compression": "FP16Compressor" if compression else "NoneCompressor",
        "backward_passes_per_step": aggregation,
        "lr": pytest.approx(expected_lr),
    }


def test_every_optimized_parameter_gets_a_unique_name() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    extra = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([{"params": model.parameters()}, {"params": [extra]}], lr=0.1)
    named = _named_parameters(optimizer, [model])
    assert [name for name, _ in named] == ["model0.0.weight", "model0.0.bias", "model0.1.weight", "model0.1.bias", "group1.0"]
    assert [id(p) for _, p in named] == [id(p) for group in optimizer.param_groups for p in group["params"]]

