"""Run one phase of one parity case in this process, under ``$PARITY_FRAMEWORK``, and write its record.

``python runner.py SPEC.json OUT.json`` with ``PARITY_FRAMEWORK`` = ``determined`` or ``hookdet``.
The same user code runs under both: ``pytorch.init(hparams=..., exp_conf=...)``, the trial built
inside it, ``Trainer(trial, context).fit(**fit)``. Under ``WORLD_SIZE`` > 1 the process is one
rank of a gloo job; Determined then gets its documented local recipe (``USE_TORCH_DISTRIBUTED``,
``init_process_group("gloo")``, ``DistributedContext.from_torch_distributed()``), hookdet its own
(the same environment variables, nothing else). The record: the trial's events, the error ``fit``
raised (type and message), and every model's final weights.
"""
from __future__ import annotations

import gc
import importlib
import json
import os
import random
import sys
from pathlib import Path
from typing import Any, Dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests.parity import record  # noqa: E402


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def unit(pytorch: Any, value: Any) -> Any:
    """``{"Batch": 4}`` -> ``pytorch.Batch(4)``; anything else unchanged."""
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("Batch", "Epoch"):
        kind, length = next(iter(value.items()))
        return getattr(pytorch, kind)(length)
    return value


def distributed_context(name: str) -> Any:
    """Determined's local multi-process recipe; hookdet needs none (its ddp plugin reads the env)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or name != "determined":
        return None
    import determined as det
    import torch.distributed as dist

    dist.init_process_group("gloo")
    # DistributedContext.from_torch_distributed(), with the ZMQ ports this rank's environment
    # names passed on: Determined reads them into its defaults as it is imported, and a runner
    # forked from the warm server imported it before the harness chose them (two cases at once
    # would share the default ports).
    env = os.environ
    return det.core.DistributedContext(
        rank=int(env["RANK"]), size=int(env["WORLD_SIZE"]), local_rank=int(env["LOCAL_RANK"]),
        local_size=int(env["LOCAL_WORLD_SIZE"]), cross_rank=int(env["GROUP_RANK"]),
        cross_size=int(env["GROUP_WORLD_SIZE"]), chief_ip=env.get("DET_CHIEF_IP"),
        pub_port=int(env["INTER_TRAIN_PROCESS_COMM_PORT_1"]), pull_port=int(env["INTER_TRAIN_PROCESS_COMM_PORT_2"]))


def main(spec_path: str, out_path: str) -> int:
    name = record.framework()
    spec: Dict[str, Any] = json.loads(Path(spec_path).read_text())
    module, _, class_name = spec["trial"].rpartition(".")  # "Basic" or "data_trials.BatchStructures"
    trial_class = getattr(importlib.import_module("tests.parity." + (module or "trials")), class_name)
    latest = Path(spec["resume_from"]).read_text().strip() if spec.get("resume_from") else None
    out: Dict[str, Any] = {"framework": name, "error": None, "weights": None}
    try:
        if "experiment_file" in spec:
            run_experiment_file(name, spec, trial_class, latest)
        else:
            run_fit(name, spec, trial_class, latest)
    except (Exception, SystemExit) as error:  # a misuse case records what the user would see
        out["error"] = {
            "type": type(error).__name__,
            "message": str(error),
            "classes": [cls.__name__ for cls in type(error).__mro__],
        }
        record.event("fit_raised")  # where it raised; what it raised is out["error"]
    context = record.CONTEXTS[-1] if record.CONTEXTS else None
    out["weights"] = weights(context) if context is not None else None
    out["events"] = record.EVENTS
    if record.LATEST_CHECKPOINT and (context is None or _is_chief(context)):
        Path("latest_checkpoint.txt").write_text(record.LATEST_CHECKPOINT[-1])
        Path("first_checkpoint.txt").write_text(record.LATEST_CHECKPOINT[0])
        with open("checkpoints.txt", "a") as every:  # every uuid the callbacks saw, phase after phase
            every.writelines(f"{uuid}\n" for uuid in record.LATEST_CHECKPOINT)
    Path(out_path).write_text(json.dumps(out))
    # Free the trial's objects now, not in the interpreter's finalization: a DDP model there
    # destroys its gloo process group's threads in no safe order ("terminate called without an
    # active exception", rc -6, seen once under the full suite's load).
    record.CONTEXTS.clear()
    del context
    gc.collect()
    return 0


def run_fit(name: str, spec: Dict[str, Any], trial_class: Any, latest_checkpoint: Any) -> None:
    """``pytorch.init(...)``, the trial, ``Trainer(trial, context).fit(**spec["fit"])``."""
    pytorch = importlib.import_module(name + ".pytorch")
    fit = {key: unit(pytorch, value) for key, value in spec.get("fit", {}).items()}
    if latest_checkpoint is not None:
        fit["latest_checkpoint"] = latest_checkpoint
    init_kwargs = dict(hparams=spec["hparams"], exp_conf=spec.get("exp_conf"))
    init_kwargs.update(spec.get("init", {}))
    distributed = distributed_context(name)
    if distributed is not None:
        init_kwargs["distributed"] = distributed
    with pytorch.init(**init_kwargs) as context:
        seed_all(spec["seed"])  # the same generator state for both, whatever init seeded
        trial = trial_class(context)
        pytorch.Trainer(trial, context).fit(**fit)


def run_experiment_file(name: str, spec: Dict[str, Any], trial_class: Any, latest_checkpoint: Any) -> None:
    """The case's ``experiment_file`` through Determined's legacy harness or ``hookdet run``."""
    from tests.parity import experiment_files

    if name == "determined":
        experiment_files.determined_legacy_harness(trial_class, spec["experiment_file"], spec["seed"], latest_checkpoint)
    else:
        experiment_files.hookdet_run(spec["trial"], spec["experiment_file"], latest_checkpoint)


def _is_chief(context: Any) -> bool:
    return context.distributed.get_rank() == 0


def weights(context: Any) -> Any:
    """Every wrapped model's parameters and buffers, unwrapped from DDP, as exact values."""
    result = []
    for model in getattr(context, "models", []):
        model = getattr(model, "module", model)
        result.append({key: record.plain(value) for key, value in model.state_dict().items()})
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
