"""Search rules against Determined's own published test values (master/pkg/searcher/*_test.go,
master/pkg/nprand/nprand_test.go, Determined 0.38.1), against an independent port of its
master's generator, and against Go's own ``math`` (the floating point the master computes in)."""
from __future__ import annotations

import math
import random
import struct
import sys
import uuid
from pathlib import Path

import pytest

from hookdet.config import parse_experiment_config
from hookdet.search import go_math, methods
from hookdet.search.space import MasterRandom, SpaceError, check_spec, draw_trial, grid
from tests.support import hookdet_process
from tests.support.go_math_reference import bits, go_math_program, go_results


@pytest.fixture(scope="module")
def go_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return go_math_program(tmp_path_factory.mktemp("go"))


# --------------------------------------------------------------------- an independent nprand


class GoNprand:
    """Determined's ``nprand.State`` transcribed from its Go source, on Python's own MT19937
    (seeded with init_genrand as nprand.Seed is): Bits32, bitsLimit, Intn, UnitInterval, Read."""

    def __init__(self, seed: int) -> None:
        state = [seed & 0xFFFFFFFF]
        for index in range(1, 624):
            previous = state[-1]
            state.append((1812433253 * (previous ^ (previous >> 30)) + index) & 0xFFFFFFFF)
        self.mt = random.Random()
        self.mt.setstate((3, tuple(state) + (624,), None))

    def bits32(self) -> int:
        return self.mt.getrandbits(32)

    def bits_limit(self, limit: int) -> int:
        if limit == 0:
            return 0
        mask = limit
        for shift in (1, 2, 4, 8, 16, 32):
            mask |= mask >> shift
        while True:
            value = self.bits32() & mask
            if value <= limit:
                return value

    def intn(self, n: int) -> int:
        return self.bits_limit(n - 1)

    def uniform(self, low: float, high: float) -> float:
        a, b = self.bits32() >> 5, self.bits32() >> 6
        return low + (high - low) * ((a * (1 << 26) + b) / (1 << 53))

    def create(self, sample) -> tuple:
        """NewCreate(rand, sampleAll(...)): sample, then 16 bytes of request id, then the seed."""
        hparams = sample(self)
        raw = bytearray()
        for _ in range(4):
            raw += self.bits32().to_bytes(4, "little")
        raw[6] = (raw[6] & 0x0F) | 0x40
        raw[8] = (raw[8] & 0x3F) | 0x80
        return hparams, str(uuid.UUID(bytes=bytes(raw))), self.bits_limit((1 << 31) - 1)


def test_the_master_stream_matches_nprands_published_numpy_values() -> None:
    # nprand_test.go TestInt: state = np.random.RandomState(42); [state.randint(0,10) ...]
    published = [6, 3, 7, 4, 6, 9, 2, 6, 7, 4, 3, 7, 7, 2, 5, 4, 1, 7, 5, 1, 4, 0, 9, 5]
    ours, go = MasterRandom(42), GoNprand(42)
    assert [ours.intn(10) for _ in published] == published
    assert [go.intn(10) for _ in published] == published


def _go_math_calls() -> list:
    """Calls as the master makes them (log draws of many bases and ranges, rung and bracket
    arithmetic) and the edges of each function's range."""
    rng = random.Random(7)
    calls = [("pow", rng.choice([10.0, 2.0, math.e, 3.0, 1.5, 0.5]), rng.uniform(-9, 9)) for _ in range(6000)]
    calls += [("pow", divisor, float(k)) for divisor in (1.5, 2.0, 2.5, 3.0, 4.0, 10.0) for k in range(12)]
    calls += [("log", float(n), None) for n in range(1, 3000)]
    calls += [("log", math.exp(rng.uniform(-700, 700)), None) for _ in range(2000)]
    calls += [("exp", rng.uniform(-745, 709.8), None) for _ in range(2000)]
    calls += [("log", x, None) for x in (go_math._HALF_SQRT2, 2 * go_math._HALF_SQRT2, 1e-310, 5e-324, 0.0, -1.0, math.inf)]
    calls += [("exp", x, None) for x in (-745.2, -740.0, -708.5, 709.78, 710.0, 0.0, -0.0, 1e-20, -math.inf, math.inf)]
    calls += [("pow", x, y) for x, y in ((2.0, 1074.5), (10.0, -323.5), (0.1, 0.5), (4.0, -0.5), (-8.0, 3.0),
                                         (-8.0, 1 / 3), (0.0, -3.0), (-0.0, -3.0), (1e308, 2.0), (2.0, -1075.0),
                                         (-1.0, math.inf), (0.5, -math.inf), (-math.inf, -3.0), (2.0, 2.0**64))]
    return calls


@pytest.mark.parametrize("fma", [True, False], ids=["cpu-with-fma", "cpu-without-fma"])
def test_go_math_equals_gos_own_pow_log_and_exp_bit_for_bit(go_program: Path, fma: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(go_math, "MASTER_HAS_FMA", fma)
    calls = _go_math_calls()
    expected = go_results(go_program, calls, fma=fma)
    ours = [bits(getattr(go_math, op)(x) if y is None else go_math.pow(x, y)) for op, x, y in calls]
    wrong = [(call, got, want) for call, got, want in zip(calls, ours, expected) if got != want]
    assert not wrong, (len(wrong), wrong[:5])
    libm = [bits(math.pow(x, y)) for op, x, y in calls[:6000]]
    assert sum(a != b for a, b in zip(libm, expected)) > 1000  # what Python's pow would have drawn


def test_asha_brackets_take_gos_log(go_program: Path) -> None:
    """``int(Log(n) / Log(divisor)) + 1`` caps the rungs: with Go's Log, 243 batches at divisor 3
    allow 6 rungs (Go's Log(243)/Log(3) is exactly 5), where the C library's log gives 4.999…"""
    logs = dict(zip((243.0, 3.0), map(_from_bits, go_results(go_program, [("log", 243.0, None), ("log", 3.0, None)]))))
    cap = int(logs[243.0] / logs[3.0]) + 1
    assert cap == 6 and int(math.log(243.0) / math.log(3.0)) + 1 == 5
    brackets = methods.make_brackets(243, 243, divisor=3.0, max_rungs=8)
    assert [bracket["num_rungs"] for bracket in brackets] == [6, 5, 4, 3, 2, 1][:len(brackets)]
    assert brackets[0]["num_rungs"] == cap


SPACE = {
    "global_batch_size": 32,
    "n_filters": {"type": "int", "minval": 8, "maxval": 64},
    "dropout": {"type": "double", "minval": 0.2, "maxval": 0.5},
    "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
    "act": {"type": "categorical", "vals": ["relu", {"name": "gelu"}, [1, 2]]},
    "fixed": {"type": "const", "val": {"type": "not a spec"}},
}


def _reference_sample(rand: GoNprand) -> dict:
    """sampleAll in Go's order (names sorted) with Go's formulas."""
    out = {}
    for name in sorted(SPACE):
        spec = SPACE[name]
        if not isinstance(spec, dict):
            out[name] = spec
        elif spec["type"] == "const":
            out[name] = spec["val"]
        elif spec["type"] == "int":
            out[name] = spec["minval"] + rand.intn(spec["maxval"] - spec["minval"] + 1)
        elif spec["type"] == "double":
            out[name] = rand.uniform(spec["minval"], spec["maxval"])
        elif spec["type"] == "log":  # Go's Pow: asked of Go itself by _with_gos_pow
            out[name] = GoPow(spec["base"], rand.uniform(spec["minval"], spec["maxval"]))
        else:
            out[name] = spec["vals"][rand.intn(len(spec["vals"]))]
    return out


class GoPow:
    """A ``math.Pow(base, exponent)`` of the reference draw, to be computed by Go."""

    def __init__(self, base: float, exponent: float) -> None:
        self.base, self.exponent = base, exponent


def _with_gos_pow(program: Path, creates: list) -> list:
    """The reference creates with each :class:`GoPow` replaced by Go's result."""
    calls = [("pow", value.base, value.exponent) for hparams, _, _ in creates
             for value in hparams.values() if isinstance(value, GoPow)]
    results = iter(go_results(program, calls))
    return [({name: _from_bits(next(results)) if isinstance(value, GoPow) else value
              for name, value in hparams.items()}, request_id, seed)
            for hparams, request_id, seed in creates]


def _from_bits(hex_bits: str) -> float:
    return struct.unpack("<d", struct.pack("<Q", int(hex_bits, 16)))[0]


def test_trials_draw_determineds_hparams_request_ids_and_seeds(go_program: Path) -> None:
    ours, go = MasterRandom(1234), GoNprand(1234)
    creates = [go.create(_reference_sample) for _ in range(200)]
    expected = _with_gos_pow(go_program, creates)
    for hparams, request_id, seed in expected:
        draw = draw_trial(SPACE, ours)
        assert (draw.hparams, draw.request_id, draw.seed) == (hparams, request_id, seed)
        assert 0 <= draw.seed < 2**31
    # The C library's pow (hookdet's before) differs from Go's in the last bits of some draws.
    libm = [math.pow(hparams["lr"].base, hparams["lr"].exponent) for hparams, _, _ in creates]
    differ = sum(ours != go for ours, go in zip(libm, (hparams["lr"] for hparams, _, _ in expected)))
    assert differ > 0


def test_a_single_run_of_a_space_trains_trial_ones_draw_with_its_seed(go_program: Path) -> None:
    config = parse_experiment_config({"hyperparameters": SPACE,
                                      "reproducibility": {"experiment_seed": 99}})
    go = GoNprand(99)
    first, second = _with_gos_pow(go_program, [go.create(_reference_sample), go.create(_reference_sample)])
    assert config.hyperparameters == first[0]
    assert config.trial_seed() == first[2]
    assert config.trial_seed(2) == second[2]


def test_constant_only_configs_keep_their_seed_stream() -> None:
    config = parse_experiment_config({"hyperparameters": {"lr": 0.1},
                                      "reproducibility": {"experiment_seed": 5}})
    go = GoNprand(5)
    assert config.trial_seed() == go.create(lambda rand: {})[2]


# --------------------------------------------------------------------- spaces and grids


def _ints(maxval: int, count: int, minval: int = 0) -> dict:
    return {"type": "int", "minval": minval, "maxval": maxval, "count": count}


def test_grid_equals_determineds_test_grid() -> None:
    # grid_test.go TestGrid
    points = grid({"1": _ints(20, 3), "2": _ints(10, 3)})
    assert points == [{"1": a, "2": b} for a in (0, 10, 20) for b in (0, 5, 10)]


def test_nested_grid_equals_determineds() -> None:
    # grid_test.go TestNestedGrid
    points = grid({"1": _ints(20, 3), "2": {"3": _ints(10, 3)}})
    assert points == [{"1": a, "2": {"3": b}} for a in (0, 10, 20) for b in (0, 5, 10)]


def test_grid_int_counts_are_capped_and_rounded_as_determineds() -> None:
    # grid_test.go TestGridIntCount / TestGridIntCountNegative
    assert grid({"1": _ints(4, 5)}) == [{"1": v} for v in range(5)]
    assert grid({"1": _ints(-2, 3, minval=-4)}) == [{"1": -4}, {"1": -3}, {"1": -2}]
    assert grid({"1": _ints(4, 100)}) == [{"1": v} for v in range(5)]  # capped
    assert grid({"1": _ints(3, 1)}) == [{"1": 2}]  # midpoint 1.5 rounds away from zero
    assert grid({"1": {"type": "log", "minval": -4, "maxval": -2, "base": 10, "count": 1}}) == [
        {"1": pytest.approx(1e-3)}]
    assert grid({"1": {"type": "double", "minval": 0, "maxval": 1, "count": 3}}) == [
        {"1": 0.0}, {"1": 0.5}, {"1": 1.0}]


def test_malformed_specs_are_named() -> None:
    with pytest.raises(SpaceError, match="minval must be less than maxval"):
        check_spec({"type": "int", "minval": 3, "maxval": 3}, ("x",))
    with pytest.raises(SpaceError, match="non-empty list"):
        check_spec({"type": "categorical", "vals": []}, ("x",))
    with pytest.raises(SpaceError) as caught:
        check_spec({"type": "log", "minval": 0, "maxval": 1}, ("x",))
    assert "needs 'base'" in str(caught.value)


# --------------------------------------------------------------------- ASHA's numbers


def test_rungs_equal_determineds_make_rungs() -> None:
    # asha_stopping_test.go TestMakeRungs
    assert methods.rung_units(3, 3.0, 9) == [1, 3, 9]
    assert methods.rung_units(4, 2.0, 10) == [1, 2, 5, 10]
    assert methods.rung_units(1, 3.0, 9) == [9]
    assert methods.rung_units(3, 3.0, 900) == [100, 300, 900]


def test_bracket_sizes_equal_determineds() -> None:
    # adaptive_asha_test.go TestBracketMaxTrials / TestBracketMaxConcurrentTrials
    assert methods.bracket_max_trials(20, 3.0, [3, 2, 1]) == [12, 5, 3]
    assert methods.bracket_max_trials(50, 3.0, [4, 3]) == [35, 15]
    assert methods.bracket_max_trials(50, 4.0, [3, 2]) == [37, 13]
    assert methods.bracket_max_trials(100, 4.0, [4, 3, 2]) == [70, 22, 8]
    assert methods.bracket_max_concurrent(0, 3.0, [9, 3, 1]) == [3, 3, 3]
    assert methods.bracket_max_concurrent(11, 3.0, [9, 3, 1]) == [4, 4, 3]
    assert methods.bracket_max_concurrent(0, 4.0, [40, 10]) == [10, 10]


def test_bracket_splits_sum_weights_as_go_does_whatever_the_python(go_program: Path) -> None:
    """Adaptive ASHA's trials per bracket equal Go's for every divisor, mode and bracket count
    below, and for every max_trials up to 2,000 where a compensated sum of the weights (Python
    3.12's ``sum()``, here ``math.fsum``) would move a trial to another bracket; the weights are
    summed by :func:`go_math.sum_in_order`, not ``sum()``."""
    cases = []
    for divisor in (1.5, 2.0, 2.5, 3.0, 4.0, 4.5, 7.0):
        for mode in ("standard", "conservative"):
            for max_rungs in range(2, 10):
                brackets = methods.bracket_rungs(mode, max_rungs)
                weights = [go_math.pow(divisor, rungs - 1) / rungs for rungs in brackets]
                in_order, compensated = go_math.sum_in_order(weights), math.fsum(weights)
                cases.append((20, divisor, brackets))
                cases += [(max_trials, divisor, brackets) for max_trials in range(1, 2001)
                          if [int(w / in_order * max_trials) for w in weights]
                          != [int(w / compensated * max_trials) for w in weights]]
    moved = [case for case in cases if case[0] != 20]
    assert len(moved) >= 20  # the splits a compensated sum would have changed
    lines = [f"split {bits(float(max_trials))} {bits(divisor)} " + " ".join(bits(float(r)) for r in brackets)
             for max_trials, divisor, brackets in cases]
    expected = go_split(go_program, lines)
    assert len(expected) == len(cases)
    ours = [",".join(map(str, methods.bracket_max_trials(max_trials, divisor, brackets)))
            for max_trials, divisor, brackets in cases]
    wrong = [(case, got, want) for case, got, want in zip(cases, ours, expected) if got != want]
    assert not wrong, wrong[:5]


def go_split(program: Path, lines: list) -> list:
    """Go's answer to each ``split ...`` line."""
    import subprocess

    done = subprocess.run([str(program)], input="\n".join(lines) + "\n", capture_output=True,
                          text=True, check=True, timeout=120)
    return done.stdout.split()


def test_brackets_equal_determineds_make_brackets() -> None:
    # adaptive_asha_test.go TestMakeBrackets (first two cases)
    assert methods.make_brackets(10, 100, mode="standard", max_concurrent_trials=2) == [
        {"num_rungs": 2, "max_trials": 7, "max_concurrent_trials": 1},
        {"num_rungs": 1, "max_trials": 3, "max_concurrent_trials": 1},
    ]
    assert methods.make_brackets(10, 1000, divisor=3.0, mode="conservative",
                                 max_concurrent_trials=5) == [
        {"num_rungs": 3, "max_trials": 7, "max_concurrent_trials": 2},
        {"num_rungs": 2, "max_trials": 2, "max_concurrent_trials": 2},
        {"num_rungs": 1, "max_trials": 1, "max_concurrent_trials": 1},
    ]


def _asha(rungs, trial_rungs, divisor=3.0) -> methods.AsyncHalvingSearch:
    search = methods.AsyncHalvingSearch(len(rungs), 9, 10, divisor)
    search.state["rungs"] = rungs
    search.state["trial_rungs"] = trial_rungs
    return search


def test_early_stopping_equals_determineds_stop_trials_cases() -> None:
    # asha_stopping_test.go TestStopTrials
    empty = lambda: [{"units": 1, "metrics": []}, {"units": 3, "metrics": []},
                     {"units": 9, "metrics": []}]
    search = _asha(empty(), {"r1": 0})
    assert search.early_stopping("r1", 1, 0.5) == []
    assert search.state["trial_rungs"] == {"r1": 1}
    assert search.state["rungs"][0]["metrics"] == [["r1", 0.5]]

    rungs = empty()
    rungs[0]["metrics"] = [["r1", 0.5]]
    search = _asha(rungs, {"r1": 1, "r2": 0})
    assert search.early_stopping("r2", 1, 0.4) == []
    assert search.state["trial_rungs"] == {"r1": 1, "r2": 1}
    assert search.state["rungs"][0]["metrics"] == [["r2", 0.4], ["r1", 0.5]]

    rungs = empty()
    rungs[0]["metrics"] = [["r1", 0.5]]
    search = _asha(rungs, {"r1": 1, "r2": 0})
    assert search.early_stopping("r2", 1, 0.6) == [methods.Stop("r2")]
    assert search.state["trial_rungs"] == {"r1": 1, "r2": 0}
    assert search.state["rungs"][0]["metrics"] == [["r1", 0.5], ["r2", 0.6]]


def _reference_decisions(table, units, divisor):
    """ASHA stop-once, written from Determined's rule rather than its structure: at each rung a
    trial reaches, it continues iff its rank among the metrics recorded there so far (ties:
    earlier arrivals first) is below max(floor(n / divisor), 1); the top rung always stops."""
    seen = {rung: [] for rung in range(len(units))}
    decisions = []
    for trial, rung, metric in table:
        seen[rung].append(metric)
        rank = sum(1 for m in seen[rung] if m < metric)
        if rung == len(units) - 1:
            decisions.append((trial, "stop"))
        elif rank >= max(int(len(seen[rung]) / divisor), 1):
            decisions.append((trial, "stop"))
        else:
            decisions.append((trial, "continue"))
    return decisions


def test_asha_decisions_on_a_scripted_table_equal_the_reference() -> None:
    rng = random.Random(3)
    units, divisor = methods.rung_units(3, 3.0, 27), 3.0
    search = methods.AsyncHalvingSearch(3, 27, 60, divisor)
    alive, table, decisions = {}, [], []
    for step in range(400):
        if len(alive) < 4 and len(search.state["trial_rungs"]) < 60:
            rid = f"t{len(search.state['trial_rungs'])}"
            search.trial_created(None, rid)
            alive[rid] = 0
        if not alive:
            break
        rid = rng.choice(sorted(alive))
        rung = alive[rid]
        metric = round(rng.random(), 2)  # ties happen
        table.append((rid, rung, metric))
        actions = search.early_stopping(rid, units[rung], metric)
        decisions.append((rid, "stop" if actions else "continue"))
        if actions:
            del alive[rid]
        else:
            alive[rid] = rung + 1
    assert len(table) > 50
    assert decisions == _reference_decisions(table, units, divisor)


class _Ctx:
    """A context whose creates are numbered, to follow what the searchers create."""

    def __init__(self) -> None:
        self.count = 0
        self.space = {"x": {"type": "int", "minval": 0, "maxval": 1, "count": 2}}
        self.rand = MasterRandom(0)

    def create(self, bracket: int = 0) -> methods.Create:
        self.count += 1
        return methods.Create(f"r{self.count}", 0, {}, bracket)


def test_invalid_hp_is_replaced_by_random_and_asha_not_by_grid() -> None:
    ctx = _Ctx()
    rand_search = methods.RandomSearch(max_trials=2, max_concurrent_trials=1)
    [first] = rand_search.initial_trials(ctx)
    rand_search.trial_exited_early(ctx, first.request_id, methods.INVALID_HP)
    assert len(rand_search.trial_exited(ctx, first.request_id)) == 1  # replacement
    errored = methods.RandomSearch(max_trials=1, max_concurrent_trials=1)
    [only] = errored.initial_trials(ctx)
    errored.trial_exited_early(ctx, only.request_id, methods.ERRORED)
    assert errored.trial_exited(ctx, only.request_id) == []  # an errored trial is not

    asha = methods.AsyncHalvingSearch(2, 4, 1, 2.0, max_concurrent_trials=1)
    [trial] = asha.initial_trials(ctx)
    asha.trial_created(ctx, trial.request_id)
    actions = asha.trial_exited_early(ctx, trial.request_id, methods.INVALID_HP)
    assert [type(a) for a in actions] == [methods.Stop, methods.Create]

    grid_search = methods.GridSearch(max_concurrent_trials=1)
    ctx.rand = MasterRandom(0)
    [point] = grid_search.initial_trials(ctx)
    assert grid_search.trial_exited_early(ctx, point.request_id, methods.INVALID_HP) == []
    [next_point] = grid_search.trial_exited(ctx, point.request_id)
    assert next_point.hparams != point.hparams  # the next point, not the invalid one again
    assert grid_search.trial_exited(ctx, next_point.request_id) == []


def test_an_errored_asha_trial_counts_as_worst_in_its_rung() -> None:
    ctx = _Ctx()
    asha = methods.AsyncHalvingSearch(2, 4, 5, 2.0, max_concurrent_trials=2)
    for create in asha.initial_trials(ctx):
        asha.trial_created(ctx, create.request_id)
    asha.trial_exited_early(ctx, "r1", methods.ERRORED)
    assert asha.state["rungs"][0]["metrics"] == [["r1", methods.EXITED_METRIC]]
    assert asha.early_stopping("r2", 2, 1e300) == []  # better than the errored one: continues


def test_asha_with_promotion_pauses_at_rungs_and_promotes_the_top_of_a_rung() -> None:
    ctx = _Ctx()
    asha = methods.AsyncHalvingSearch(2, 4, 4, 2.0, max_concurrent_trials=1, promote=True)
    Pause, Promote, Stop, Create = methods.Pause, methods.Promote, methods.Stop, methods.Create
    assert asha.initial_trials(ctx) == [Create("r1", 0, {}, 0)]
    asha.trial_created(ctx, "r1")

    def report(rid: str, units: int, metric: float) -> list:
        actions = asha.validation_completed(ctx, rid, units, metric)
        for action in actions:
            if isinstance(action, Create):
                asha.trial_created(ctx, action.request_id)
        return actions

    # rung 0 (2 units) holds one trial: none in its top floor(1/2) = 0, so a new trial
    assert report("r1", 2, 0.5) == [Pause("r1"), Create("r2", 0, {}, 0)]
    # two trials at rung 0: the better one (r2) is promoted, resumed to rung 1
    assert report("r2", 2, 0.3) == [Pause("r2"), Promote("r2")]
    # the top rung ends r2; nothing else to promote (r2 was), so a new trial
    assert report("r2", 4, 0.2) == [Stop("r2"), Create("r3", 0, {}, 0)]
    # r3 is worse: rung 0 = [r2, r1, r3], its top 1 is r2, already promoted: a new trial
    assert report("r3", 2, 0.9) == [Pause("r3"), Create("r4", 0, {}, 0)]
    # four at rung 0, top 2 = [r4, r2]: r4 is promoted
    assert report("r4", 2, 0.1) == [Pause("r4"), Promote("r4")]
    # max_trials reached and nothing promotable: the search winds down
    assert report("r4", 4, 0.05) == [Stop("r4")]


def test_a_postgresql_store_without_its_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from hookdet.search.store import StoreError, check_driver

    monkeypatch.setitem(sys.modules, "psycopg2", None)  # the import fails as if not installed
    with pytest.raises(StoreError) as raised:
        check_driver("postgresql+psycopg2://user:secret@db.example:5432/search")
    message = str(raised.value)
    assert "pip install 'hookdet[search-postgres]'" in message and "secret" not in message
    check_driver("journal:/tmp/store.log")  # other stores need no driver


def test_config_options_reach_the_search_as_they_reach_the_trial(tmp_path: Path) -> None:
    """``hookdet run random.yaml --config searcher.max_trials=8`` searches 8 trials (the
    searcher block is read raw, so the options must be applied to it too)."""
    from hookdet.search.cli import load_search

    digits = Path(__file__).parent.parent / "examples" / "digits" / "random.yaml"
    config, raw, settings, _ = load_search(digits, ["searcher.max_trials=8", "searcher.max_length.batches=20",
                                                    "hyperparameters.dropout=0.5"])
    assert settings.max_trials == 8 and raw["searcher"]["max_trials"] == 8
    assert raw["searcher"]["max_length"] == {"batches": 20}  # a length replaces the file's, unit and all
    assert config.hyperparameters["dropout"] == 0.5 == raw["hyperparameters"]["dropout"]


# --------------------------------------------------------------- the accept/refuse table

SEARCHER_RULES = Path(__file__).resolve().parents[1] / "docs" / "search.md"


def _searcher_rule_rows() -> list:
    """(searcher block, Determined's verdict, hookdet's verdict, row text) from docs/search.md."""
    import yaml

    text = SEARCHER_RULES.read_text()
    table = text.split("<!-- searcher-rules -->")[1].split("<!-- /searcher-rules -->")[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        block = yaml.safe_load(cells[0].split("`")[1])
        rows.append(pytest.param(block, cells[1], cells[2], "no hyperparameters" in cells[0], id=cells[0][:60]))
    return rows


@pytest.mark.parametrize("block, determined, hookdet, no_space", _searcher_rule_rows())
def test_the_searcher_table_in_the_docs_is_what_hookdet_does(tmp_path: Path, block: dict, determined: str,
                                                              hookdet: str, no_space: bool) -> None:
    import yaml

    # Validating every batch: every rung can be decided (else the staged rows warn that none can).
    experiment = {"name": "rules", "entrypoint": "search_trial:LineTrial", "searcher": block,
                  "min_validation_period": {"batches": 1}}
    if not no_space:
        experiment["hyperparameters"] = {"lr": {"type": "double", "minval": 0.1, "maxval": 0.2, "count": 2}}
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment))
    result = hookdet_process.run("search", "preview", path, timeout=120)
    assert hookdet in ("accepted", "accepted, warns", "refused") and determined
    if hookdet == "refused":
        assert result.returncode == 2 and result.stderr.startswith("hookdet: error: "), result.stderr
        assert "Traceback" not in result.stderr
        return
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("hookdet: warning:")]
    assert bool(warnings) == (hookdet == "accepted, warns"), result.stderr
    assert all("has been deprecated and will be removed in a future release." in line for line in warnings)
    if no_space:
        assert "0 grid points" in result.stdout


def test_stop_once_is_ignored_as_determined_0_38_does_and_promotion_is_hookdets_own_field() -> None:
    from hookdet.search.settings import SearchConfigError, read_settings

    asha = {"name": "async_halving", "metric": "loss", "num_rungs": 2, "max_trials": 3,
            "time_metric": "batches", "max_time": 8}
    ignored = read_settings({"searcher": {**asha, "stop_once": False}}, "exp.yaml")
    assert not ignored.promote and not ignored.build({}).promote
    assert ignored.warnings == ["the `stop_once` field of the searcher config has been deprecated and will "
                                "be removed in a future release."]
    promoting = read_settings({"searcher": {**asha, "promote": True}}, "exp.yaml")
    assert promoting.promote and promoting.build({}).promote and promoting.warnings == []
    with pytest.raises(SearchConfigError, match=r"exp.yaml: searcher.promote must be true or false; got 'yes'"):
        read_settings({"searcher": {**asha, "promote": "yes"}}, "exp.yaml")
