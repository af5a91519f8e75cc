"""The ``searcher`` block of a search, read as Determined 0.38 reads it, and the method it builds.

The experiment loader (``hookdet.config``) keeps only what one trial needs from ``searcher``;
a search reads the whole block here. Errors name the file and field, as the loader's do.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hookdet.config.blocks import runs_a_command
from hookdet.config.sections import NOT_RUN_HERE, SEARCHERS, bare_length_refusal
from hookdet.errors import HookdetError
from hookdet.search import methods

#: ``time_metric`` values a search can train to (a trial is trained in segments to each rung).
TIME_UNITS = ("batches", "epochs", "records")
_FIELDS = {
    "single": set(),
    "random": {"max_trials", "max_concurrent_trials"},
    "grid": {"max_concurrent_trials"},
    "async_halving": {"num_rungs", "max_trials", "divisor", "max_concurrent_trials", "stop_once",
                      "time_metric", "max_time", "promote"},
    "adaptive_asha": {"max_trials", "mode", "divisor", "max_rungs", "max_concurrent_trials",
                      "stop_once", "time_metric", "max_time", "bracket_rungs", "promote"},
    # hookdet's own: Optuna's samplers and pruners (hookdet.search.optuna_search).
    "optuna": {"sampler", "pruner", "sampler_options", "pruner_options", "max_trials",
               "max_concurrent_trials", "time_metric", "max_time", "num_rungs", "divisor"},
}
#: Determined 0.38's words for the fields it still reads but has deprecated (a warning, not an error).
DEPRECATED = {
    "max_length": "the `max_length` field of the searcher config has been deprecated and will be "
                  "removed in a future release.",
    "stop_once": "the `stop_once` field of the searcher config has been deprecated and will be "
                 "removed in a future release.",
}
_COMMON = {"name", "metric", "smaller_is_better", "max_length", "source_trial_id",
           "source_checkpoint_uuid"}


class SearchConfigError(HookdetError):
    """A searcher block a search cannot run; the message names the file and field, and
    ``field`` is that field's path in the file where one field is at fault (so a caller that
    has the file's lines can add the line)."""

    def __init__(self, message: str, field: Optional[Tuple[str, ...]] = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class SearchSettings:
    """A search's searcher block. ``unit``/``max_length`` are None when the block gives no
    length (a ``single``, ``random`` or ``grid`` search of trials that set their own, as a
    Trainer-API script does); ``warnings`` are Determined's deprecation warnings for the block."""

    name: str
    metric: str
    smaller_is_better: bool
    unit: Optional[str]
    max_length: Optional[int]
    max_trials: int = 1
    max_concurrent_trials: int = 16
    divisor: float = 4.0
    mode: str = "standard"
    max_rungs: int = 5
    num_rungs: int = 1
    bracket_rungs: List[int] = field(default_factory=list)
    promote: bool = False
    sampler: str = "tpe"
    pruner: str = "none"
    sampler_options: Dict[str, Any] = field(default_factory=dict)
    pruner_options: Dict[str, Any] = field(default_factory=dict)
    max_restarts: int = 5
    warnings: List[str] = field(default_factory=list)

    @property
    def staged(self) -> bool:
        """Whether trials train rung by rung (ASHA, or an Optuna pruner), a decision at each rung."""
        return self.name in ("adaptive_asha", "async_halving") or self.pruner != "none"

    def build(self, space: Mapping[str, Any]) -> Any:
        """The search method (:mod:`hookdet.search.methods`) these settings describe, over the
        hyperparameter ``space``."""
        if self.name in ("single", "random"):
            single = self.name == "single"
            return methods.RandomSearch(1 if single else self.max_trials,
                                        1 if single else self.max_concurrent_trials, single=single)
        if self.name == "grid":
            return methods.GridSearch(self.max_concurrent_trials)
        if self.name == "optuna":
            from hookdet.search.optuna_search import OptunaSearch

            rungs = methods.rung_units(self.num_rungs, self.divisor, self.max_length) if self.staged else []
            return OptunaSearch(self.sampler, self.pruner, self.max_trials, self.max_concurrent_trials,
                                self.smaller_is_better, space, rungs, self.divisor,
                                self.sampler_options, self.pruner_options)
        if self.name == "async_halving":
            return methods.AsyncHalvingSearch(
                self.num_rungs, self.max_length, self.max_trials, self.divisor,
                self.max_concurrent_trials, self.smaller_is_better, promote=self.promote)
        brackets = methods.make_brackets(
            self.max_trials, self.max_length, self.divisor, self.mode, self.max_rungs,
            self.max_concurrent_trials, self.bracket_rungs)
        return methods.AdaptiveASHASearch(brackets, self.max_length, self.divisor,
                                          self.smaller_is_better, promote=self.promote)


def _whole(raw: Mapping, key: str, default: Optional[int], minimum: int, where: str,
           block: Tuple[str, ...] = ("searcher",)) -> int:
    value = raw.get(key)
    if value is None:  # absent or null: not set, so Determined's default
        value = default
    if value is None:
        raise SearchConfigError(f"{where}.{key} is required by the '{raw['name']}' searcher")
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SearchConfigError(f"{where}.{key} must be a whole number of at least {minimum}; "
                                f"got {value!r}", field=block + (key,))
    return value


def _length(raw: Mapping, where: str, command: bool) -> tuple:
    """(unit, units): ``time_metric`` + ``max_time``, which ASHA needs (Determined 0.38 refuses
    it without them); else the legacy ``max_length`` (a bare number, for a ``command``
    entrypoint, in batches), or (None, None) where none is given."""
    name = raw.get("name", "single")
    if name in ("adaptive_asha", "async_halving") and (raw.get("max_time") is None or raw.get("time_metric") is None):
        raise SearchConfigError(f"{where}: the `{name}` searcher requires `max_time` and "
                                "`time_metric` to be set (as Determined 0.38 does; e.g. "
                                "time_metric: batches, max_time: 1000)")
    if name == "optuna" and raw.get("pruner", "none") != "none" and raw.get("max_time") is None:
        raise SearchConfigError(f"{where}: a pruner needs `max_time` and `time_metric` (trials train "
                                "rung by rung to it; e.g. time_metric: batches, max_time: 1000)")
    if raw.get("max_time") is not None or raw.get("time_metric") is not None:
        metric = raw.get("time_metric")
        if metric not in TIME_UNITS:
            raise SearchConfigError(
                f"{where}.time_metric must be one of {', '.join(TIME_UNITS)} (a search trains "
                f"each trial to its next rung in that unit); got {metric!r}")
        return metric, _whole(raw, "max_time", None, 1, where)
    length = raw.get("max_length")
    if length is None:
        return None, None
    if isinstance(length, int) and not isinstance(length, bool) and command and length >= 1:
        return "batches", length
    if isinstance(length, int) and not isinstance(length, bool):
        raise SearchConfigError(f"{where}.max_length: {bare_length_refusal(length)}")
    if isinstance(length, Mapping) and len(length) == 1:
        (unit, units), = length.items()
        if unit in TIME_UNITS and isinstance(units, int) and units >= 1:
            return unit, units
    raise SearchConfigError(
        f"{where}: set time_metric and max_time (e.g. time_metric: batches, max_time: 1000), or "
        f"the legacy max_length (e.g. max_length: {{batches: 1000}}); got max_length {length!r}")


def _searcher_name(raw: Mapping[str, Any], where: str) -> str:
    """The block's ``name``: required, and one of the searchers hookdet runs."""
    if "name" not in raw:
        raise SearchConfigError(f"{where}.name is required (as Determined requires it): "
                                f"{', '.join(SEARCHERS)}")
    name = raw["name"]
    if name in NOT_RUN_HERE:
        raise SearchConfigError(f"{where}.name: {NOT_RUN_HERE[name]}")
    if name not in SEARCHERS:
        raise SearchConfigError(f"{where}.name must be one of {', '.join(SEARCHERS)}; got {name!r}")
    return name


def read_settings(data: Mapping[str, Any], source: str) -> SearchSettings:
    """The searcher block of experiment file ``data`` (from ``source``) as search settings."""
    where = f"{source}: searcher"
    raw = data.get("searcher") or {}
    if not isinstance(raw, Mapping):
        raise SearchConfigError(f"{where} must be a mapping; got {raw!r}")
    raw = {key: value for key, value in raw.items() if value is not None}  # null: not set
    name = _searcher_name(raw, where)
    unknown = sorted(set(raw) - _COMMON - _FIELDS[name])
    if unknown:
        raise SearchConfigError(f"{where}.{unknown[0]} is not a field of the '{name}' searcher")
    problems = []
    if not isinstance(raw.get("metric"), str) or not raw["metric"]:
        problems.append(f"{where}.metric is required: the name of the validation metric the "
                        "searcher compares trials by (Determined 0.38 requires it too)")
    try:
        unit, max_length = _length(raw, where, runs_a_command(data.get("entrypoint")))
    except SearchConfigError as error:
        problems.append(str(error))
    if problems:
        raise SearchConfigError("\n  ".join(problems))
    settings = SearchSettings(
        name=name,
        metric=raw["metric"],
        smaller_is_better=_flag(raw, "smaller_is_better", where, default=True),
        unit=unit,
        max_length=max_length,
        max_restarts=_whole(data, "max_restarts", 5, 0, f"{source}: experiment", block=()),
    )
    if name in ("random", "adaptive_asha", "async_halving", "optuna"):
        settings.max_trials = _whole(raw, "max_trials", None, 1, where)
    if name != "single":
        settings.max_concurrent_trials = _whole(raw, "max_concurrent_trials", 16, 0, where)
    if name in ("adaptive_asha", "async_halving"):
        divisor = raw.get("divisor", 4.0)
        if not isinstance(divisor, (int, float)) or isinstance(divisor, bool) or divisor <= 1:
            raise SearchConfigError(f"{where}.divisor must be a number above 1; got {divisor!r}",
                                    field=("searcher", "divisor"))
        settings.divisor = float(divisor)
        settings.promote = _flag(raw, "promote", where)
    if name == "async_halving":
        settings.num_rungs = _whole(raw, "num_rungs", None, 1, where)
    if name == "adaptive_asha":
        settings.max_rungs = _whole(raw, "max_rungs", 5, 1, where)
        mode = raw.get("mode", "standard") or "standard"
        if mode not in ("aggressive", "standard", "conservative"):
            raise SearchConfigError(f"{where}.mode must be aggressive, standard or conservative; "
                                    f"got {mode!r}", field=("searcher", "mode"))
        settings.mode = mode
        settings.bracket_rungs = _bracket_rungs(raw, where)
    if name == "optuna":
        read_optuna_fields(settings, raw, where)
    settings.warnings = [DEPRECATED[key] for key in DEPRECATED if raw.get(key) is not None]
    return settings


def read_optuna_fields(settings: SearchSettings, raw: Mapping[str, Any], where: str) -> None:
    """The ``optuna`` searcher's own fields into ``settings``; the sampler and pruner are built
    once here, so a wrong option is refused before anything runs."""
    from hookdet.search import optuna_search

    problems = []
    for key, known in (("sampler", optuna_search.SAMPLERS), ("pruner", optuna_search.PRUNERS)):
        value = raw.get(key, "tpe" if key == "sampler" else "none")
        if value not in known:
            problems.append(f"{where}.{key} must be one of {', '.join(known)}; got {value!r}")
        options = raw.get(f"{key}_options") or {}
        if not isinstance(options, Mapping):
            problems.append(f"{where}.{key}_options must be a mapping of {key} arguments; got {options!r}")
        elif set(options) & optuna_search.RESERVED_OPTIONS:
            taken = sorted(set(options) & optuna_search.RESERVED_OPTIONS)[0]
            problems.append(f"{where}.{key}_options.{taken} is set by hookdet (the seed from "
                            "reproducibility.experiment_seed, rungs from num_rungs and divisor)")
        setattr(settings, key, value)
        setattr(settings, f"{key}_options", dict(options) if isinstance(options, Mapping) else {})
    if problems:
        raise SearchConfigError("\n  ".join(problems))
    settings.num_rungs = _whole(raw, "num_rungs", 4, 2 if settings.pruner != "none" else 1, where)
    settings.divisor = float(_whole(raw, "divisor", 3, 2, where))
    needed = optuna_search.SAMPLERS[settings.sampler][1]
    if needed is not None and importlib.util.find_spec(needed) is None:
        raise SearchConfigError(f"{where}.sampler {settings.sampler} needs the {needed} package: "
                                "pip install 'hookdet[search]'")
    for key, make in (("sampler", lambda: optuna_search.make_sampler(settings.sampler, 0, settings.sampler_options)),
                      ("pruner", lambda: optuna_search.make_pruner(settings.pruner, [1, 2], settings.divisor,
                                                                   settings.pruner_options))):
        try:
            make()
        except (TypeError, ValueError) as error:
            raise SearchConfigError(f"{where}.{key}_options: Optuna's {key} refuses them: {error}") from None


def _bracket_rungs(raw: Mapping, where: str) -> List[int]:
    """``bracket_rungs``: a list of whole numbers of rungs, one per bracket (Determined's
    schema: an array of integers)."""
    rungs = raw.get("bracket_rungs", [])
    if not isinstance(rungs, list) or not all(
            isinstance(count, int) and not isinstance(count, bool) and count >= 1 for count in rungs):
        raise SearchConfigError(f"{where}.bracket_rungs must be a list of whole numbers of rungs "
                                f"(at least 1 each), one per bracket, e.g. [3, 2]; got {rungs!r}",
                                field=("searcher", "bracket_rungs"))
    return list(rungs)


def _flag(raw: Mapping, key: str, where: str, default: bool = False) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise SearchConfigError(f"{where}.{key} must be true or false; got {value!r}", field=("searcher", key))
    return value
