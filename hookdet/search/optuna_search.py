"""``searcher: {name: optuna}``: Optuna's samplers and pruners as a search method of hookdet's.

Determined has no model-based search; Optuna has TPE, CMA-ES and Gaussian-process samplers and
the median and Hyperband pruners. This method lets them choose each trial's hyperparameters and
stop trials early, while hookdet's driver keeps its guarantees (kill and resume, N workers,
warm start, the summary), because the method is, like Determined's, a function of the events
the driver feeds it in their fixed order:

* Its state is the list of trials Optuna has seen (parameters, intermediate values, final value,
  state, and the system attributes samplers and pruners keep on trials), JSON-shaped, saved with
  the driver's state.
* For every question (what to try next, whether to prune) it builds a fresh in-memory study from
  that list, asks it, and records the answer in the list. No sampler or pruner object outlives a
  question, so a resumed driver asks exactly the study an uninterrupted one would have.
* Each sampler is seeded by a draw from the master's random stream (which the experiment's seed
  starts), made when the trial is created.

Trials train rung by rung when a pruner is set: to ``max_time / divisor**(num_rungs - 1 - i)``
units, the pruner judging each rung's validation (Hyperband's brackets are given exactly these
rungs: ``min_resource`` the first, ``reduction_factor`` the divisor). Hyperparameters map to
Optuna's distributions: ``int`` to ``IntDistribution(minval, maxval)``, ``double`` to
``FloatDistribution``, ``log`` to a log ``FloatDistribution`` over ``base**minval ..
base**maxval``, ``categorical`` to the index of its value; ``const`` values are not searched.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Dict, List, Mapping, Tuple

from hookdet.search.methods import INVALID_HP, Action, Context, Create, Stop
from hookdet.search.space import is_spec
from hookdet.search.store import load_optuna

#: ``sampler`` names and Optuna's classes (``optuna.samplers``), with the module each needs.
SAMPLERS = {"tpe": ("TPESampler", None), "cmaes": ("CmaEsSampler", "cmaes"),
            "gp": ("GPSampler", "scipy"), "random": ("RandomSampler", None)}
#: ``pruner`` names and Optuna's classes (``optuna.pruners``).
PRUNERS = {"none": "NopPruner", "median": "MedianPruner", "hyperband": "HyperbandPruner"}
#: Options hookdet sets itself: a search's seed comes from the experiment's, rungs from the searcher.
RESERVED_OPTIONS = {"seed", "min_resource", "max_resource", "reduction_factor"}
_STUDY_NAME = "hookdet"  # Hyperband assigns brackets by a hash of the study's name and trial number


def distributions(space: Mapping[str, Any], prefix: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """Optuna's distribution for every searched hyperparameter, by dotted name."""
    optuna = load_optuna()
    found: Dict[str, Any] = {}
    for name in sorted(space):
        value, dotted = space[name], ".".join(prefix + (name,))
        if isinstance(value, Mapping) and not is_spec(value):
            found.update(distributions(value, prefix + (name,)))
        elif is_spec(value) and value["type"] == "int":
            found[dotted] = optuna.distributions.IntDistribution(value["minval"], value["maxval"])
        elif is_spec(value) and value["type"] == "double":
            found[dotted] = optuna.distributions.FloatDistribution(value["minval"], value["maxval"])
        elif is_spec(value) and value["type"] == "log":
            base = float(value["base"])
            found[dotted] = optuna.distributions.FloatDistribution(
                base ** value["minval"], base ** value["maxval"], log=True)
        elif is_spec(value) and value["type"] == "categorical":
            found[dotted] = optuna.distributions.CategoricalDistribution(list(range(len(value["vals"]))))
    return found


def hparams_of(space: Mapping[str, Any], params: Mapping[str, Any], prefix: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """The trial's hyperparameters: ``params`` (Optuna's, by dotted name) put back into the
    space's shape, a categorical's index replaced by its value, constants as they are."""
    hparams: Dict[str, Any] = {}
    for name in sorted(space):
        value, dotted = space[name], ".".join(prefix + (name,))
        if isinstance(value, Mapping) and not is_spec(value):
            hparams[name] = hparams_of(value, params, prefix + (name,))
        elif not is_spec(value):
            hparams[name] = copy.deepcopy(value)
        elif value["type"] == "const":
            hparams[name] = copy.deepcopy(value["val"])
        elif value["type"] == "categorical":
            hparams[name] = copy.deepcopy(value["vals"][params[dotted]])
        else:
            hparams[name] = params[dotted]
    return hparams


def make_sampler(name: str, seed: int, options: Mapping[str, Any]) -> Any:
    """A fresh sampler ``name`` (:data:`SAMPLERS`) seeded with ``seed``."""
    optuna = load_optuna()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return getattr(optuna.samplers, SAMPLERS[name][0])(seed=seed, **options)


def make_pruner(name: str, rungs: List[int], divisor: float, options: Mapping[str, Any]) -> Any:
    """A fresh pruner ``name`` (:data:`PRUNERS`); Hyperband's brackets on the search's rungs."""
    optuna = load_optuna()
    if name == "hyperband":
        options = dict(options, min_resource=rungs[0], max_resource=rungs[-1], reduction_factor=int(divisor))
    return getattr(optuna.pruners, PRUNERS[name])(**options)


class OptunaSearch:
    """Keeps ``max_concurrent_trials`` trials open until ``max_trials`` were created (as
    ``random`` does, an InvalidHP trial replaced); Optuna's sampler picks each trial's
    hyperparameters, its pruner stops trials at rungs."""

    def __init__(self, sampler: str, pruner: str, max_trials: int, max_concurrent_trials: int,
                 smaller_is_better: bool, space: Mapping[str, Any], rungs: List[int], divisor: float,
                 sampler_options: Mapping[str, Any], pruner_options: Mapping[str, Any]) -> None:
        self.sampler, self.pruner = sampler, pruner
        self.max_trials, self.max_concurrent = max_trials, max_concurrent_trials
        self.direction = "minimize" if smaller_is_better else "maximize"
        self.space, self.rungs, self.divisor = space, rungs, divisor
        self.sampler_options, self.pruner_options = dict(sampler_options), dict(pruner_options)
        self.distributions = distributions(space)
        # trials: Optuna's view of each trial, in creation order (its number is the index).
        self.state: Dict[str, Any] = {"trials": [], "index": {}, "created": 0}

    # ----------------------------------------------------------------------- the study

    def study(self, sampler_seed: int = 0) -> Any:
        """A fresh in-memory study holding every trial so far, in order."""
        optuna = load_optuna()
        study = optuna.create_study(
            storage=optuna.storages.InMemoryStorage(), study_name=_STUDY_NAME, direction=self.direction,
            sampler=make_sampler(self.sampler, sampler_seed, self.sampler_options),
            pruner=make_pruner(self.pruner, self.rungs or [1], self.divisor, self.pruner_options),
        )
        for saved in self.state["trials"]:
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState[saved["state"]], params=saved["params"],
                distributions=self.distributions, value=saved["value"],
                intermediate_values={int(step): value for step, value in saved["intermediate"].items()},
                system_attrs=saved["system_attrs"],
            ))
        return study

    def _record(self, rid: str) -> Dict[str, Any]:
        return self.state["trials"][self.state["index"][rid]]

    # ----------------------------------------------------------------------- events

    def create(self, ctx: Context) -> Create:
        """A new trial: its id and seed from the master's stream, then the sampler's seed, then
        the sampler's choice given every trial so far."""
        request_id, seed, sampler_seed = ctx.rand.request_id(), ctx.rand.trial_seed(), ctx.rand.trial_seed()
        study = self.study(sampler_seed)
        asked = study.ask(self.distributions)
        self.state["index"][request_id] = len(self.state["trials"])
        self.state["trials"].append({
            "params": dict(asked.params), "state": "RUNNING", "value": None, "intermediate": {},
            "system_attrs": dict(study.trials[asked.number].system_attrs),
        })
        self.state["created"] += 1
        return Create(request_id, seed, hparams_of(self.space, asked.params))

    def initial_trials(self, ctx: Context) -> List[Action]:
        count = self.max_trials if self.max_concurrent <= 0 else min(self.max_trials, self.max_concurrent)
        return [self.create(ctx) for _ in range(count)]

    def trial_created(self, ctx: Context, rid: str) -> List[Action]:
        return []

    def validation_completed(self, ctx: Context, rid: str, units: int, metric: float) -> List[Action]:
        """The rung's value joins the trial's intermediate values; at the last rung it is the
        trial's value, before it the pruner may stop the trial."""
        record = self._record(rid)
        record["intermediate"][str(units)] = metric
        if not self.rungs or units >= self.rungs[-1]:
            record["state"], record["value"] = "COMPLETE", metric
            return []
        study = self.study()
        number = self.state["index"][rid]
        pruned = study.pruner.prune(study, study.trials[number])
        record["system_attrs"] = dict(study.trials[number].system_attrs)  # e.g. Hyperband's rungs
        if not pruned:
            return []
        record["state"], record["value"] = "PRUNED", metric
        return [Stop(rid)]

    def trial_exited_early(self, ctx: Context, rid: str, reason: str) -> List[Action]:
        record = self._record(rid)
        record["state"], record["value"] = "FAIL", None
        if reason == INVALID_HP:
            self.state["created"] -= 1  # replaced by trial_exited, as random replaces it
        return []

    def trial_exited(self, ctx: Context, rid: str) -> List[Action]:
        record = self._record(rid)
        if record["state"] == "RUNNING":  # it ended short of the search's length: its last value
            last = sorted(record["intermediate"].items(), key=lambda item: int(item[0]))
            record["state"], record["value"] = ("COMPLETE", last[-1][1]) if last else ("FAIL", None)
        if self.state["created"] < self.max_trials:
            return [self.create(ctx)]
        return []

