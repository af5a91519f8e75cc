"""Determined 0.38's searchers as state machines: what to create, what to stop, and when.

Ported from the semantics of ``master/pkg/searcher`` (random.go, grid.go, asha_stopping.go,
adaptive_asha.go, tournament.go); the driver feeds them the same events Determined's experiment
does, in the same order:

* ``initial_trials`` once; ``trial_created`` for each create;
* ``validation_completed(rid, units, metric)`` for each validation of the searcher metric;
* on an early exit, ``trial_exited_early(rid, reason)`` (``"invalid_hp"`` or ``"errored"``)
  and then ``trial_exited(rid)``; on a normal end just ``trial_exited(rid)``.

Each returns a list of actions: :class:`Create` (draws happen here, on the master's stream, in
Determined's order) or :class:`Stop`. The state is JSON-shaped so a search can be resumed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Union

from hookdet.search import go_math
from hookdet.search.space import MasterRandom, draw_trial, draw_with_fixed, grid

INVALID_HP = "invalid_hp"
ERRORED = "errored"
#: An errored ASHA trial counts as the worst metric in its rung (Determined's MaxFloat64).
EXITED_METRIC = 1.7976931348623157e308


@dataclass
class Create:
    request_id: str
    seed: int
    hparams: Dict[str, Any]
    bracket: int = 0


@dataclass
class Stop:
    request_id: str


@dataclass
class Pause:
    """ASHA with promotion: the trial waits at its rung (its checkpoint) for a promotion."""

    request_id: str


@dataclass
class Promote:
    """ASHA with promotion: resume a paused trial from its checkpoint to the next rung."""

    request_id: str


Action = Union[Create, Stop, Pause, Promote]


class Context:
    """What a search method draws from: the master's generator and the space."""

    def __init__(self, rand: MasterRandom, space: Mapping[str, Any]) -> None:
        self.rand, self.space = rand, space

    def create(self, bracket: int = 0) -> Create:
        draw = draw_trial(self.space, self.rand)
        return Create(draw.request_id, draw.seed, draw.hparams, bracket)


# ---------------------------------------------------------------------------------------------
# random, single, grid
# ---------------------------------------------------------------------------------------------


class RandomSearch:
    """``random`` (and ``single``, which is random with one trial): keep ``max_trials`` created,
    at most ``max_concurrent_trials`` at a time; an InvalidHP trial is replaced."""

    def __init__(self, max_trials: int, max_concurrent_trials: int = 0, single: bool = False):
        self.max_trials, self.max_concurrent = max_trials, max_concurrent_trials
        self.single = single
        self.state = {"created": 0, "pending": 0}

    def initial_trials(self, ctx: Context) -> List[Action]:
        count = self.max_trials
        if self.max_concurrent > 0:
            count = min(count, self.max_concurrent)
        actions: List[Action] = []
        for _ in range(count):
            actions.append(ctx.create())
            self.state["created"] += 1
            self.state["pending"] += 1
        return actions

    def trial_created(self, ctx: Context, rid: str) -> List[Action]:
        return []

    def validation_completed(self, ctx: Context, rid: str, units: int, metric: float) -> List[Action]:
        return []

    def trial_exited_early(self, ctx: Context, rid: str, reason: str) -> List[Action]:
        self.state["pending"] -= 1
        if not self.single and reason == INVALID_HP:
            self.state["created"] -= 1  # the replacement is created by trial_exited
        return []

    def trial_exited(self, ctx: Context, rid: str) -> List[Action]:
        self.state["pending"] -= 1
        if self.state["created"] < self.max_trials:
            self.state["created"] += 1
            self.state["pending"] += 1
            return [ctx.create()]
        return []


class GridSearch:
    """``grid``: one trial per grid point, taken from the end of the grid's list as
    Determined does; an InvalidHP trial's point is not retried."""

    def __init__(self, max_concurrent_trials: int = 0) -> None:
        self.max_concurrent = max_concurrent_trials
        self.state: Dict[str, Any] = {"remaining": [], "pending": 0}

    def initial_trials(self, ctx: Context) -> List[Action]:
        self.state["remaining"] = grid(ctx.space)
        count = len(self.state["remaining"])
        if self.max_concurrent > 0:
            count = min(count, self.max_concurrent)
        return [self._next(ctx) for _ in range(count)]

    def _next(self, ctx: Context) -> Create:
        point = self.state["remaining"].pop()
        self.state["pending"] += 1
        draw = draw_with_fixed(point, ctx.rand)
        return Create(draw.request_id, draw.seed, draw.hparams)

    def trial_created(self, ctx: Context, rid: str) -> List[Action]:
        return []

    def validation_completed(self, ctx: Context, rid: str, units: int, metric: float) -> List[Action]:
        return []

    def trial_exited_early(self, ctx: Context, rid: str, reason: str) -> List[Action]:
        return []

    def trial_exited(self, ctx: Context, rid: str) -> List[Action]:
        self.state["pending"] -= 1
        return [self._next(ctx)] if self.state["remaining"] else []


# ---------------------------------------------------------------------------------------------
# ASHA (stop-once, Determined 0.38) and its adaptive tournament
# ---------------------------------------------------------------------------------------------


def rung_units(num_rungs: int, divisor: float, max_length: int) -> List[int]:
    """Units a trial needs to reach each rung: ``max_length / divisor**(rungs-1-i)``, at least 1."""
    return [max(int(float(max_length) / go_math.pow(divisor, num_rungs - i - 1)), 1)
            for i in range(num_rungs)]


class AsyncHalvingSearch:
    """``async_halving`` (one bracket): a trial reaching a rung continues only while it is in
    the top ``max(floor(n / divisor), 1)`` of the ``n`` trials that reached that rung so far;
    otherwise (and at the top rung) it is stopped, and a new trial is created in its place while
    fewer than ``max_trials`` exist."""

    def __init__(self, num_rungs: int, max_length: int, max_trials: int, divisor: float,
                 max_concurrent_trials: int = 0, smaller_is_better: bool = True,
                 bracket: int = 0, promote: bool = False) -> None:
        self.num_rungs, self.divisor = num_rungs, divisor
        self.max_trials, self.max_concurrent = max_trials, max_concurrent_trials
        self.smaller_is_better, self.bracket, self.promote = smaller_is_better, bracket, promote
        self.state: Dict[str, Any] = {
            "rungs": [{"units": units, "metrics": [], "promoted": []}
                      for units in rung_units(num_rungs, divisor, max_length)],
            "trial_rungs": {}, "early_exit": {}, "completed": 0, "invalid": 0, "busy": 0,
        }

    def _concurrency(self) -> int:
        if self.max_concurrent > 0:
            return min(self.max_concurrent, self.max_trials)
        return min(max(1, int(go_math.pow(self.divisor, self.num_rungs - 1))), self.max_trials)

    def initial_trials(self, ctx: Context) -> List[Action]:
        count = self._concurrency()
        self.state["busy"] = count
        return [ctx.create(self.bracket) for _ in range(count)]

    def _jobs(self, ctx: Context) -> List[Action]:
        """ASHA with promotion (Li et al.): fill free slots, promoting first - from the highest
        rung down, a paused trial in the top ``floor(n / divisor)`` of its rung - else a new
        trial while fewer than ``max_trials`` exist."""
        actions: List[Action] = []
        while self.state["busy"] < self._concurrency():
            promoted = self._promotable()
            if promoted is not None:
                actions.append(Promote(promoted))
            elif self._all_trials() + len([a for a in actions if isinstance(a, Create)]) \
                    < self.max_trials:
                actions.append(ctx.create(self.bracket))
            else:
                break
            self.state["busy"] += 1
        return actions

    def _promotable(self) -> Optional[str]:
        for index in range(self.num_rungs - 2, -1, -1):
            rung = self.state["rungs"][index]
            top = int(float(len(rung["metrics"])) / self.divisor)
            for rid, _ in rung["metrics"][:top]:
                if rid not in rung["promoted"] and not self.state["early_exit"].get(rid):
                    rung["promoted"].append(rid)
                    self.state["trial_rungs"][rid] = index + 1
                    return rid
        return None

    def _record(self, ctx: Context, rid: str, units: int, metric: float) -> List[Action]:
        """Promotion mode: a trial reaching its rung waits there (the top rung ends it)."""
        index = self.state["trial_rungs"][rid]
        rung = self.state["rungs"][index]
        if units < rung["units"]:
            return []
        _insert_metric(rung["metrics"], rid, metric)
        self.state["busy"] -= 1
        ending = Stop(rid) if index == self.num_rungs - 1 else Pause(rid)
        return [ending] + self._jobs(ctx)

    def trial_created(self, ctx: Context, rid: str) -> List[Action]:
        self.state["trial_rungs"][rid] = 0
        return []

    def _all_trials(self) -> int:
        return len(self.state["trial_rungs"]) - self.state["invalid"]

    def validation_completed(self, ctx: Context, rid: str, units: int, metric: float) -> List[Action]:
        value = metric if self.smaller_is_better else -metric
        if self.promote:
            return self._record(ctx, rid, units, value)
        actions = self.early_stopping(rid, units, value)
        if actions and self._all_trials() < self.max_trials:
            actions.append(ctx.create(self.bracket))
        return actions

    def early_stopping(self, rid: str, units: int, metric: float) -> List[Action]:
        """Determined's ``doEarlyStopping`` (``metric`` already signed so smaller is better)."""
        rungs = self.state["rungs"]
        for index in range(self.state["trial_rungs"][rid], self.num_rungs):
            rung = rungs[index]
            self.state["trial_rungs"][rid] = index
            if units < rung["units"]:
                return []
            position = _insert_metric(rung["metrics"], rid, metric)
            if index == self.num_rungs - 1:
                return [Stop(rid)]
            keep = max(int(float(len(rung["metrics"])) / self.divisor), 1)
            if position >= keep:
                return [Stop(rid)]
        return []

    def trial_exited_early(self, ctx: Context, rid: str, reason: str) -> List[Action]:
        self.state["early_exit"][rid] = True
        if self.promote:
            return self._exited_promoting(ctx, rid, reason)
        if reason == INVALID_HP:
            self.state["invalid"] += 1
            for rung in self.state["rungs"][: self.state["trial_rungs"].get(rid, 0) + 1]:
                for position, (owner, _) in enumerate(rung["metrics"]):
                    if owner == rid:
                        del rung["metrics"][position]
                        break
            return [Stop(rid), ctx.create(self.bracket)]
        rung = self.state["rungs"][self.state["trial_rungs"].get(rid, 0)]
        _insert_metric(rung["metrics"], rid, EXITED_METRIC)
        return [ctx.create(self.bracket)] if self._all_trials() < self.max_trials else []

    def _exited_promoting(self, ctx: Context, rid: str, reason: str) -> List[Action]:
        self.state["busy"] -= 1
        if reason == INVALID_HP:
            self.state["invalid"] += 1
            for rung in self.state["rungs"]:
                rung["metrics"] = [entry for entry in rung["metrics"] if entry[0] != rid]
        else:
            rung = self.state["rungs"][self.state["trial_rungs"].get(rid, 0)]
            _insert_metric(rung["metrics"], rid, EXITED_METRIC)
        return self._jobs(ctx)

    def trial_exited(self, ctx: Context, rid: str) -> List[Action]:
        self.state["completed"] += 1
        return []


def _insert_metric(metrics: List[list], rid: str, metric: float) -> int:
    """Insert before the first metric >= ``metric`` (Go's sort.Search); return the index."""
    position = next((i for i, (_, value) in enumerate(metrics) if value >= metric), len(metrics))
    metrics.insert(position, [rid, metric])
    return position


def bracket_rungs(mode: str, max_rungs: int) -> List[int]:
    """Rungs per bracket for ``mode``, most aggressive first."""
    if mode == "aggressive":
        rungs = [max_rungs]
    elif mode == "standard":
        rungs = list(range((max_rungs - 1) // 2 + 1, max_rungs + 1))
    else:
        rungs = list(range(1, max_rungs + 1))
    return sorted(rungs, reverse=True)


def bracket_max_trials(max_trials: int, divisor: float, brackets: List[int]) -> List[int]:
    """Trials per bracket, weighted ``divisor**(rungs-1) / rungs``; the remainder to the first."""
    weights = [go_math.pow(divisor, rungs - 1) / rungs for rungs in brackets]
    total = go_math.sum_in_order(weights)
    trials = [max(int(weight / total * max_trials), 1) for weight in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    return trials


def bracket_max_concurrent(max_concurrent: int, divisor: float, max_trials: List[int]) -> List[int]:
    """Concurrency per bracket: ``max_concurrent`` split evenly (remainder to the first ones),
    or, when 0, the last bracket's trial count (at least ``int(divisor)``) for each."""
    count = len(max_trials)
    if max_concurrent == 0:
        return [max(max_trials[-1], int(divisor))] * count
    max_concurrent = max(max_concurrent, count)
    share, remainder = divmod(max_concurrent, count)
    return [share + (1 if index < remainder else 0) for index in range(count)]


def make_brackets(max_trials: int, max_length: int, divisor: float = 4.0, mode: str = "standard",
                  max_rungs: int = 5, max_concurrent_trials: int = 16,
                  bracket_rungs_override: Optional[List[int]] = None) -> List[Dict[str, int]]:
    """Adaptive ASHA's brackets: ``[{num_rungs, max_trials, max_concurrent_trials}, ...]``."""
    rungs = list(bracket_rungs_override or [])
    if not rungs:
        max_rungs = min(
            max_rungs,
            int(go_math.log(float(max_length)) / go_math.log(divisor)) + 1,
            int(go_math.log(float(max_trials)) / go_math.log(divisor)) + 1,
        )
        rungs = bracket_rungs(mode, max_rungs)
    rungs = sorted(rungs, reverse=True)
    trials = bracket_max_trials(max_trials, divisor, rungs)
    concurrent = bracket_max_concurrent(max_concurrent_trials, divisor, trials)
    return [{"num_rungs": r, "max_trials": t, "max_concurrent_trials": c}
            for r, t, c in zip(rungs, trials, concurrent)]


class AdaptiveASHASearch:
    """``adaptive_asha``: one :class:`AsyncHalvingSearch` per bracket; every event goes to the
    bracket that created the trial (Determined's tournament)."""

    def __init__(self, brackets: List[Dict[str, int]], max_length: int, divisor: float,
                 smaller_is_better: bool = True, promote: bool = False) -> None:
        self.brackets = [
            AsyncHalvingSearch(b["num_rungs"], max_length, b["max_trials"], divisor,
                               b["max_concurrent_trials"], smaller_is_better, bracket=index,
                               promote=promote)
            for index, b in enumerate(brackets)
        ]
        self.state: Dict[str, Any] = {"trial_table": {},
                                      "brackets": [b.state for b in self.brackets]}

    def load_state(self, state: Dict[str, Any]) -> None:
        self.state = state
        for bracket, saved in zip(self.brackets, state["brackets"]):
            bracket.state = saved

    def _mark(self, index: int, actions: List[Action]) -> List[Action]:
        for action in actions:
            if isinstance(action, Create):
                self.state["trial_table"][action.request_id] = index
        return actions

    def _of(self, rid: str) -> AsyncHalvingSearch:
        return self.brackets[self.state["trial_table"][rid]]

    def initial_trials(self, ctx: Context) -> List[Action]:
        actions: List[Action] = []
        for index, bracket in enumerate(self.brackets):
            actions.extend(self._mark(index, bracket.initial_trials(ctx)))
        return actions

    def trial_created(self, ctx: Context, rid: str) -> List[Action]:
        bracket = self._of(rid)
        return self._mark(bracket.bracket, bracket.trial_created(ctx, rid))

    def validation_completed(self, ctx: Context, rid: str, units: int, metric: float) -> List[Action]:
        bracket = self._of(rid)
        return self._mark(bracket.bracket, bracket.validation_completed(ctx, rid, units, metric))

    def trial_exited_early(self, ctx: Context, rid: str, reason: str) -> List[Action]:
        bracket = self._of(rid)
        return self._mark(bracket.bracket, bracket.trial_exited_early(ctx, rid, reason))

    def trial_exited(self, ctx: Context, rid: str) -> List[Action]:
        bracket = self._of(rid)
        return self._mark(bracket.bracket, bracket.trial_exited(ctx, rid))



def rungs_of(method: Any) -> List[List[int]]:
    """Each bracket's rung units (one bracket for non-ASHA searchers: the full length only)."""
    if isinstance(method, AdaptiveASHASearch):
        return [[rung["units"] for rung in b.state["rungs"]] for b in method.brackets]
    if isinstance(method, AsyncHalvingSearch):
        return [[rung["units"] for rung in method.state["rungs"]]]
    return [list(getattr(method, "rungs", []))]  # an Optuna search with a pruner has rungs too


def most_trials(method: Any, created: int) -> int:
    """The most trials ``method`` will have created by its end (``created`` so far): its
    ``max_trials`` (per bracket, summed), or a grid's points. InvalidHP replacements aside."""
    if isinstance(method, AdaptiveASHASearch):
        return sum(bracket.max_trials for bracket in method.brackets)
    if isinstance(method, GridSearch):
        return created + len(method.state["remaining"])
    return method.max_trials
