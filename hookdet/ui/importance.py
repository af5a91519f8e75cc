"""Which hyperparameters mattered in a search: Optuna's importance of each (its default
evaluator, PED-ANOVA), over the trials that reported the searcher metric.

The trials go into an in-memory Optuna study as the search's trial view gives them to Optuna
(:func:`hookdet.search.trial_view.parameter`: Determined's ranges, log and categorical
hyperparameters as such); constants, and values the experiment's space does not name, are left
out. Computed again only when a trial's best value
or the space changed (the search page asks every second).
"""
from __future__ import annotations

import functools
import json
import math
from typing import Any, Dict, List, Tuple

from hookdet.search.trial_view import parameter, spec_at

#: Fewer trials than this tell nothing about importance.
FEWEST_TRIALS = 3


def importances(space: Dict[str, Any], rows: List[Dict[str, Any]], smaller_is_better: bool) -> Dict[str, Any]:
    """``{"values": {name: importance}}`` (summing to 1), or ``{"note": why there are none}``."""
    measured = tuple((float(row["best"]), json.dumps(row["hparams"], sort_keys=True)) for row in rows
                     if isinstance(row.get("best"), (int, float)) and math.isfinite(row["best"]))
    return _importances(json.dumps(space, sort_keys=True), measured, smaller_is_better)


@functools.lru_cache(maxsize=8)
def _importances(space_json: str, measured: Tuple[Tuple[float, str], ...], smaller_is_better: bool) -> Dict[str, Any]:
    import optuna

    space = json.loads(space_json)
    if len(measured) < FEWEST_TRIALS:
        return {"note": f"{len(measured)} trials have reported the metric; importance needs {FEWEST_TRIALS}"}
    trials = []
    try:
        for best, hparams_json in measured:
            hparams = json.loads(hparams_json)
            params, distributions = {}, {}
            for name, value in hparams.items():
                try:
                    spec = spec_at(space, name)
                except (KeyError, TypeError):  # not in the experiment's space: not searched
                    continue
                if not isinstance(spec, dict) or spec.get("type") in (None, "const"):
                    continue
                distributions[name], params[name] = parameter(optuna, spec, value)
            trials.append(optuna.trial.create_trial(params=params, distributions=distributions, value=best))
        if not trials[0].params:
            return {"note": "no hyperparameter is searched"}
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(direction="minimize" if smaller_is_better else "maximize")
        study.add_trials(trials)
        return {"values": dict(optuna.importance.get_param_importances(study))}
    except (KeyError, TypeError, ValueError, RuntimeError) as error:  # a space the trials do not fit
        return {"note": f"Optuna could not rank them: {error}"}
