"""Child process of tests/test_builtin_registry.py: every installed plugin through the same rows.

For each plugin named on the command line: it loads alone; a run with ``no:<it>`` still trains;
an unknown option is refused naming the experiment file and line; its ``state_dict`` survives a
round trip into a fresh instance after a run with it; its ``hookdet_unconfigure`` may be called
twice. Each plugin's rows run in a child forked from this process (fresh state, torch imported
once). Prints ``{plugin: {row: "ok" | "n/a: why" | "FAIL: what"}}`` as JSON on the last line.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict

import torch
import yaml

from hookdet import pytorch
from hookdet.config import load_experiment_config
from hookdet.errors import HookdetError
from hookdet.plugin import run_of
from hookdet.plugins.manager import PluginManager, installed_plugins

ROWS = ("loads alone", "no:X trains", "unknown option at file:line", "state_dict round-trips", "unconfigure twice")
HP = {"lr": 0.1, "global_batch_size": 2}


class TinyTrial(pytorch.PyTorchTrial):
    """y = 2x with one weight."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        torch.manual_seed(0)
        self.model = context.wrap_model(torch.nn.Linear(1, 1, bias=False))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=HP["lr"]))

    def _data(self) -> torch.utils.data.Dataset:
        x = torch.arange(8, dtype=torch.float32).unsqueeze(1)
        return torch.utils.data.TensorDataset(x, 2 * x)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._data(), batch_size=2)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self._data(), batch_size=4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Dict[str, Any]:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}


def train(exp_conf: Any, run_dir: Path) -> Any:
    """Two batches; the run."""
    with pytorch.init(hparams=HP, exp_conf=exp_conf, run_dir=run_dir) as context:
        pytorch.Trainer(TinyTrial(context), context).fit(max_length=pytorch.Batch(2))
    return run_of(context)


class Unavailable(Exception):
    """A row that cannot run on this machine, and why."""


def row(check: Callable[[], str]) -> str:
    try:
        return check()
    except Unavailable as why:
        return f"n/a: {why}"
    except AssertionError as error:
        return f"FAIL: {error}"
    except Exception as error:  # noqa: BLE001 - the row records what broke
        return f"FAIL: {type(error).__name__}: {error} {traceback.format_exc(limit=-2)}"


def rows_for(name: str, required: Dict[str, Any], work: Path) -> Dict[str, str]:
    work.mkdir(parents=True)
    results: Dict[str, str] = {}

    def loads_alone() -> str:
        manager = PluginManager({name: required} if required else None)
        manager.load_all([name])
        assert manager.get(name) is not None, "not registered"
        return "ok"

    def no_x_trains() -> str:
        run = train({"hyperparameters": HP, "plugins": [f"no:{name}"]}, work / "without")
        assert run.state.batches_trained == 2 and name not in run.plugins.named_plugins()
        return "ok"

    def unknown_option() -> str:
        path = work / "exp.yaml"
        path.write_text(yaml.safe_dump({
            "hyperparameters": HP, "plugins": [name],
            "plugin_config": {name: {**required, "no_such_option": 1}},
        }, sort_keys=False))
        lines = path.read_text().splitlines()
        block = next(i for i, line in enumerate(lines, 1) if line.strip() == f"{name}:")
        option = next(i for i, line in enumerate(lines, 1) if line.strip().startswith("no_such_option"))
        try:
            train(load_experiment_config(path), work / "unknown")
        except HookdetError as error:
            message = str(error)
            assert message.startswith((f"{path}:{block}: ", f"{path}:{option}: ")), message
            assert "no_such_option" in message, message
            return "ok"
        raise AssertionError("the unknown option was accepted")

    trained: Dict[str, Any] = {}

    def with_it() -> Any:
        if name == "horovod" and importlib.util.find_spec("horovod") is None:
            raise Unavailable("Horovod is not installed here (scripts/build_horovod.sh builds it)")
        if "run" not in trained:
            exp_conf = {"hyperparameters": HP, "plugins": {"only": [name, "checkpoint"] if name != "checkpoint" else [name]},
                        "plugin_config": {name: required} if required else {}}
            trained["run"] = train(exp_conf, work / "with")
        return trained["run"]

    def state_round_trip() -> str:
        plugin = with_it().plugins.get(name)
        if not hasattr(plugin, "state_dict"):
            return "n/a: keeps no state"
        state = plugin.state_dict()
        fresh = PluginManager({name: required} if required else None)
        fresh.load_all([name])
        fresh.get(name).load_state_dict(copy.deepcopy(state))
        assert fresh.get(name).state_dict() == state, f"{fresh.get(name).state_dict()} != {state}"
        return "ok"

    def unconfigure_twice() -> str:
        run = with_it()
        plugin = run.plugins.get(name)
        if not hasattr(plugin, "hookdet_unconfigure"):
            return "n/a: no hookdet_unconfigure"
        plugin.hookdet_unconfigure(run=run)  # the run already unconfigured it once
        return "ok"

    for label, check in zip(ROWS, (loads_alone, no_x_trains, unknown_option, state_round_trip, unconfigure_twice)):
        results[label] = row(check)
    return results


def in_a_fork(name: str, required: Dict[str, Any], work: Path) -> Dict[str, str]:
    """:func:`rows_for` ``name`` in a forked child: torch and hookdet are imported once, and
    nothing one plugin's rows leave behind (registrations, globals, threads) reaches the next."""
    out = work / f"{name}.rows.json"
    pid = os.fork()
    if pid == 0:
        try:
            out.write_text(json.dumps(rows_for(name, required, work / name)))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    if not out.exists():
        return {"rows": f"FAIL: the child for {name} ended with status {status} before writing its rows"}
    return json.loads(out.read_text())


def main() -> None:
    work, names = Path(sys.argv[1]), sys.argv[2:]
    required = json.loads(Path(work / "required.json").read_text()) if (work / "required.json").exists() else {}
    installed = installed_plugins()
    table = {name: in_a_fork(name, required.get(name, {}), work) if name in installed else {"installed": "FAIL: not installed"}
             for name in names}
    print(json.dumps(table))


if __name__ == "__main__":
    main()
