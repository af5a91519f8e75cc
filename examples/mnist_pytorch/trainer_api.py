"""The MNIST trial trained from a Python script with Determined's Trainer API.

``hookdet run const.yaml`` reads the experiment file and calls the same two functions this script
calls: ``pytorch.init()`` builds the run and its context, ``pytorch.Trainer(trial, context).fit()``
trains. Use the script form when training is one step of a larger program (a notebook, a sweep
driver, a test). Hyperparameters come from ``const.yaml`` so both ways train the same model::

    python trainer_api.py --batches 200                # train 200 batches
    python trainer_api.py --epochs 2 --run-dir runs/a  # two epochs into runs/a
    python trainer_api.py --epochs 4 --resume runs/a   # continue exactly where runs/a stopped

As in Determined, everything that trains happens inside ``with pytorch.init() as context``: the
``with`` block owns the plugins, the process group (when distributed) and open files.
"""
import argparse
import logging
import pathlib
from typing import Optional

from hookdet import pytorch
from hookdet.config import load_experiment_config
from model_def import MNistTrial

HERE = pathlib.Path(__file__).resolve().parent


def train(
    max_length: pytorch.TrainUnit,
    run_dir: Optional[str] = None,
    latest_checkpoint: Optional[str] = None,
    config_path: pathlib.Path = HERE / "const.yaml",
) -> MNistTrial:
    """Train ``MNistTrial`` for ``max_length`` with the settings of ``config_path``; return the trial.

    Validation runs every epoch and a checkpoint is kept at the end (``fit``'s defaults keep the
    best one), so ``latest_checkpoint=run_dir`` of an earlier call resumes it bit for bit.
    """
    # Read the file as `hookdet run` does (YAML 1.2, Determined's defaults, one clear error for a
    # bad field); a plain dict works too: pytorch.init(exp_conf={...}).
    exp_conf = load_experiment_config(config_path)
    with pytorch.init(hparams=exp_conf.hyperparameters, exp_conf=exp_conf, run_dir=run_dir) as context:
        trial = MNistTrial(context)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=max_length,
            validation_period=pytorch.Epoch(1),
            latest_checkpoint=latest_checkpoint,
        )
    return trial


def main() -> None:
    """Parse the command line (``--batches`` or ``--epochs``; default 100 batches) and train."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--batches", type=int, help="train this many batches")
    length.add_argument("--epochs", type=int, help="train this many epochs")
    parser.add_argument("--run-dir", help="where metrics and checkpoints go (default runs/<name>-<time>)")
    parser.add_argument("--resume", help="a run or checkpoint directory to continue from")
    args = parser.parse_args()
    if args.batches:
        max_length: pytorch.TrainUnit = pytorch.Batch(args.batches)
    elif args.epochs:
        max_length = pytorch.Epoch(args.epochs)
    else:
        max_length = pytorch.Batch(100)
    train(max_length, run_dir=args.run_dir, latest_checkpoint=args.resume)


if __name__ == "__main__":
    main()
