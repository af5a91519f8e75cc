"""The ``optuna`` searcher's method (hookdet.search.optuna_search), fed events as the driver
feeds them: its mapping of Determined's spaces to Optuna's distributions, its pruning, and that a
method rebuilt from its saved (JSON) state decides exactly as one that was never interrupted."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

pytest.importorskip("optuna")

from hookdet.search import methods  # noqa: E402
from hookdet.search.optuna_search import distributions, hparams_of  # noqa: E402
from hookdet.search.settings import SearchConfigError, read_settings  # noqa: E402
from hookdet.search.space import MasterRandom  # noqa: E402

SPACE = {
    "global_batch_size": 8,
    "optimizer": {"lr": {"type": "log", "minval": -3, "maxval": -0.5, "base": 10},
                  "name": {"type": "categorical", "vals": ["sgd", {"momentum": 0.9}]}},
    "width": {"type": "int", "minval": 1, "maxval": 4},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "fixed": {"type": "const", "val": [1, 2]},
}


def settings(**searcher: Any):
    block = {"name": "optuna", "metric": "loss", "max_trials": 12, "max_concurrent_trials": 2,
             "time_metric": "batches", "max_time": 27, **searcher}
    return read_settings({"searcher": block}, "exp.yaml")


def loss(hparams: Dict[str, Any], units: int) -> float:
    """A made-up learning curve: better with lr near 0.03 and more width, falling with units."""
    lr = hparams["optimizer"]["lr"]
    return (math.log10(lr) + 1.5) ** 2 + 1.0 / hparams["width"] + 3.0 / units + hparams["dropout"]


def flipped(hparams: Dict[str, Any], units: int) -> float:
    """The same curve, best with lr far from 0.03: other results for the same trials."""
    return loss(hparams, units) - 2 * (math.log10(hparams["optimizer"]["lr"]) + 1.5) ** 2


def drive(method: Any, space: Dict[str, Any], resume_every: int = 0, curve=loss) -> List[Tuple[str, Any]]:
    """Run a whole search of ``method`` as the driver would (one trial's segment at a time, in
    creation order); every ``resume_every`` events the method is rebuilt from its JSON state
    and the generator's. Returns the decisions: creates with their hyperparameters, stops."""
    rand = MasterRandom(5)
    ctx = methods.Context(rand, space)
    rungs = method.rungs or [27]
    log: List[Tuple[str, Any]] = []
    open_trials: List[Dict[str, Any]] = []
    stopped = set()

    def take(actions):
        for action in actions:
            if isinstance(action, methods.Create):
                log.append(("create", action.hparams))
                open_trials.append({"rid": action.request_id, "hparams": action.hparams, "rung": 0})
            else:
                log.append(("stop", action.request_id))
                stopped.add(action.request_id)

    take(method.initial_trials(ctx))
    events = 0
    while open_trials:
        trial = open_trials.pop(0)
        units = rungs[trial["rung"]]
        take(method.validation_completed(ctx, trial["rid"], units, curve(trial["hparams"], units)))
        if trial["rid"] in stopped or units >= rungs[-1]:
            take(method.trial_exited(ctx, trial["rid"]))
        else:
            trial["rung"] += 1
            open_trials.append(trial)
        events += 1
        if resume_every and events % resume_every == 0:
            saved, generator = json.dumps(method.state), json.dumps(rand.get_state())
            method = type(method)(method.sampler, method.pruner, method.max_trials, method.max_concurrent,
                                  method.direction == "minimize", space, method.rungs, method.divisor,
                                  method.sampler_options, method.pruner_options)
            method.state = json.loads(saved)
            rand = MasterRandom(0)
            rand.set_state(json.loads(generator))
            ctx = methods.Context(rand, space)
    return log


def test_determineds_types_map_to_optunas_distributions_and_back() -> None:
    found = distributions(SPACE)
    assert sorted(found) == ["dropout", "optimizer.lr", "optimizer.name", "width"]
    assert (found["optimizer.lr"].low, found["optimizer.lr"].high, found["optimizer.lr"].log) == (10 ** -3, 10 ** -0.5, True)
    assert (found["width"].low, found["width"].high) == (1, 4)  # Determined's int range is inclusive
    assert found["optimizer.name"].choices == (0, 1)  # by index: Optuna's choices must be scalars
    params = {"dropout": 0.25, "optimizer.lr": 0.01, "optimizer.name": 1, "width": 3}
    assert hparams_of(SPACE, params) == {
        "dropout": 0.25, "fixed": [1, 2], "global_batch_size": 8, "width": 3,
        "optimizer": {"lr": 0.01, "name": {"momentum": 0.9}},
    }


@pytest.mark.parametrize("sampler, pruner", [("tpe", "hyperband"), ("cmaes", "median"), ("gp", "none"),
                                             ("random", "median")])
def test_a_method_rebuilt_from_its_saved_state_decides_as_an_uninterrupted_one(sampler: str, pruner: str) -> None:
    """The guarantee behind kill and resume: the same hyperparameters, the same stops."""
    pytest.importorskip({"cmaes": "cmaes", "gp": "scipy"}.get(sampler, "optuna"))
    uninterrupted = drive(settings(sampler=sampler, pruner=pruner).build(SPACE), SPACE)
    assert len([entry for entry in uninterrupted if entry[0] == "create"]) == 12
    for every in (1, 3):
        assert drive(settings(sampler=sampler, pruner=pruner).build(SPACE), SPACE, resume_every=every) == uninterrupted


def test_the_pruner_stops_trials_at_rungs_and_tpe_leaves_random_sampling() -> None:
    method = settings(sampler="tpe", pruner="hyperband", max_trials=16,
                      sampler_options={"n_startup_trials": 4}).build(SPACE)
    assert method.rungs == [1, 3, 9, 27]  # four rungs by default: 27 / 3**3, ..., 27
    log = drive(method, SPACE)
    stops = [entry for entry in log if entry[0] == "stop"]
    states = [trial["state"] for trial in method.state["trials"]]
    assert states.count("PRUNED") >= 4 and states.count("COMPLETE") >= 2, states
    assert len(stops) == states.count("PRUNED")


def creates(log: List[Tuple[str, Any]]) -> List[Dict[str, Any]]:
    return [entry[1] for entry in log if entry[0] == "create"]


def test_tpe_draws_from_the_results_and_random_does_not() -> None:
    """Other results for the same first trials: TPE's later draws change, a random sampler's
    do not (its seed is the master stream's, whatever the results)."""
    tpe = dict(sampler="tpe", sampler_options={"n_startup_trials": 4})
    seen, other = (creates(drive(settings(**tpe).build(SPACE), SPACE, curve=curve)) for curve in (loss, flipped))
    assert seen[:4] == other[:4] and seen[4:] != other[4:]
    seen, other = (creates(drive(settings(sampler="random").build(SPACE), SPACE, curve=curve)) for curve in (loss, flipped))
    assert seen == other


def test_larger_is_better_makes_a_maximising_study() -> None:
    method = settings(smaller_is_better=False).build(SPACE)
    assert method.study().direction.name == "MAXIMIZE"
    assert settings().build(SPACE).study().direction.name == "MINIMIZE"


BASE = {"name": "optuna", "metric": "loss", "max_trials": 4, "time_metric": "batches", "max_time": 8}


@pytest.mark.parametrize("change, message", [
    ({"sampler": "bayes"}, "searcher.sampler must be one of tpe, cmaes, gp, random; got 'bayes'"),
    ({"pruner": "asha"}, "searcher.pruner must be one of none, median, hyperband; got 'asha'"),
    ({"sampler_options": {"seed": 3}}, "searcher.sampler_options.seed is set by hookdet"),
    ({"pruner": "hyperband", "pruner_options": {"min_resource": 3}}, "searcher.pruner_options.min_resource is set by hookdet"),
    ({"sampler_options": {"n_startup": 3}}, "searcher.sampler_options: Optuna's sampler refuses them"),
    ({"pruner": "median", "max_time": None, "time_metric": None}, "a pruner needs `max_time` and `time_metric`"),
    ({"max_trials": None}, "searcher.max_trials is required by the 'optuna' searcher"),
])
def test_a_wrong_optuna_searcher_is_one_line_naming_the_field(change: Dict[str, Any], message: str) -> None:
    block = {key: value for key, value in {**BASE, **change}.items() if value is not None}
    with pytest.raises(SearchConfigError) as refused:
        read_settings({"searcher": block}, "exp.yaml")
    assert "exp.yaml: searcher" in str(refused.value) and message in str(refused.value), str(refused.value)


def test_the_experiment_loader_accepts_the_optuna_searcher(tmp_path: Path) -> None:
    from hookdet.config import parse_experiment_config

    config = parse_experiment_config({"searcher": {"name": "optuna", "metric": "loss", "sampler": "tpe",
                                                   "pruner": "median", "sampler_options": {"n_startup_trials": 3},
                                                   "max_trials": 4, "time_metric": "batches", "max_time": 8}},
                                     source="exp.yaml")
    assert config.searcher.name == "optuna"
