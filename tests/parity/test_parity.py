"""Determined parity, one process: each case runs its trial under Determined 0.38.1 and hookdet.

Everything a user can observe is compared (``checks.assert_same_records``); the differences in
``expected_differences.py`` are asserted as hookdet documents them instead. See ``harness.py``.
"""
from __future__ import annotations


import pytest

from tests.parity import compare, harness
from tests.parity.checks import (
    COMPARED,
    PERIODS,
    assert_local_only_getters,
    assert_same_records,
    assert_same_weights,
    events,
)
from tests.parity.expected_differences import EXPECTED_DIFFERENCES

pytestmark = pytest.mark.slow

def single(results, phase=0):
    return results["determined"][phase][0], results["hookdet"][phase][0]


def compare_case(tmp_path, case, trial, fit, **options):
    results = harness.run_case(tmp_path, trial, fit, **options)
    determined, hookdet = single(results)
    assert_local_only_getters(case, determined, hookdet)
    assert_same_records(case, determined, hookdet, culprit=options.get("culprit"))
    return determined, hookdet


def test_basic(tmp_path):
    compare_case(tmp_path, "basic", "Basic", dict(PERIODS, max_length={"Batch": 6}))


def test_two_callbacks_in_order(tmp_path):
    """Each hook reaches the callbacks in build_callbacks order, state_dict included."""
    determined, _ = compare_case(tmp_path, "two-callbacks", "TwoCallbacks", dict(PERIODS, max_length={"Batch": 5}))
    shutdown = [e["name"] for e in events(determined, "callback", method="on_trial_shutdown")]
    assert shutdown == ["second", "first"]  # a stack, as Determined unwinds it


def test_callbacks_with_positional_and_star_args(tmp_path):
    """Determined passes most callback arguments positionally: any parameter names work."""
    determined, _ = compare_case(tmp_path, "positional-callbacks", "Positional", dict(PERIODS, max_length={"Batch": 5}))
    assert len(events(determined, "positional")) > 10


def test_two_models_schedulers_clipping(tmp_path):
    compare_case(tmp_path, "two-models", "TwoModels", dict(PERIODS, max_length={"Batch": 9}))


def test_every_reducer_kind(tmp_path):
    compare_case(tmp_path, "reducers", "Reducers", dict(PERIODS, max_length={"Batch": 6}))


def test_evaluate_full_dataset(tmp_path):
    """No validation-epoch hooks around evaluate_full_dataset, as in Determined."""
    determined, hookdet = compare_case(tmp_path, "full-dataset", "FullDataset", dict(PERIODS, max_length={"Batch": 6}))
    assert not events(hookdet, "callback", method="on_validation_epoch_start")


def test_set_stop_requested(tmp_path):
    compare_case(tmp_path, "stop-requested", "StopRequested", dict(PERIODS, max_length={"Batch": 8}))


def test_set_stop_requested_between_boundaries(tmp_path):
    """``stop-within-one-batch``: asked after batch 4, Determined trains on to its next boundary
    (batch 6: report, validation, checkpoint); hookdet stops at 5 with a checkpoint, and up to
    there everything is alike."""
    results = harness.run_case(tmp_path, "StopRequested", dict(PERIODS, max_length={"Batch": 9}),
                               hparams={"global_batch_size": 4, "stop_at": 4})
    determined, hookdet = single(results)
    assert_local_only_getters("stop-between-boundaries", determined, hookdet)
    assert [e["batch_idx"] for e in events(determined, "train_batch")] == list(range(6))
    assert [e["batch_idx"] for e in events(hookdet, "train_batch")] == list(range(5))
    assert events(hookdet, "callback", method="on_checkpoint_upload_end")[-1]["trained"] == 5
    assert events(determined, "callback", method="on_checkpoint_upload_end")[-1]["trained"] == 6
    cut = next(i for i, e in enumerate(determined["events"]) if e.get("batch_idx") == 5)
    prefix = dict(determined, events=determined["events"][:cut], weights=None)
    assert_same_records("stop-between-boundaries", prefix, dict(hookdet, events=hookdet["events"][:cut]),
                        weights=False)


def test_profiler_traces(tmp_path):
    """``profiler-traces-in-none``: the run is alike; the traces land in ./None under Determined,
    in the run's tensorboard/ directory under hookdet."""
    compare_case(tmp_path, "profiler", "Profiled", dict(PERIODS, max_length={"Batch": 3}))
    traces = lambda root: sorted(p.name for p in root.rglob("*.pt.trace.json*")) if root.exists() else []  # noqa: E731
    assert traces(tmp_path / "determined" / "cwd" / "None")
    assert not traces(tmp_path / "hookdet" / "cwd")
    assert traces(tmp_path / "hookdet" / "run" / "tensorboard")


def test_test_mode(tmp_path):
    compare_case(tmp_path, "test-mode", "Basic", dict(PERIODS, max_length={"Batch": 6}, test_mode=True))


def test_step_zero_validation_and_epoch_periods(tmp_path):
    fit = {"max_length": {"Epoch": 2}, "validation_period": {"Epoch": 1}, "checkpoint_period": {"Batch": 3},
           "reporting_period": {"Batch": 3}, "step_zero_validation": True, "checkpoint_policy": "none"}
    determined, _ = compare_case(tmp_path, "step-zero-epochs", "Basic", fit)
    assert events(determined, "callback", method="on_validation_start")[0]["trained"] == 0


def test_scheduler_step_modes(tmp_path):
    compare_case(tmp_path, "scheduler-modes", "SchedulerModes", dict(PERIODS, max_length={"Batch": 7}))


#: The phrase of Determined's misuse message that its own harness tests match on, kept in
#: hookdet's (clearer) sentence.
DETERMINEDS_WORDS = {"UnnamedReducerReturnsScalar": "with name=None but it did not return",
                     "NamedReducerReturnsDict": "with name set but it returned a dict anyway",
                     "PlainTorchLoader": "you can disable this check by calling"}


@pytest.mark.parametrize(
    "trial, culprit",
    [("TrainReturnsList", "train_batch"), ("EvaluateReturnsTensor", "evaluate_batch"), ("ChangingMetricNames", "other"),
     ("UnnamedReducerReturnsScalar", "name=None"), ("NamedReducerReturnsDict", "name"),
     ("PlainTorchLoader", "disable_dataset_reproducibility_checks()")],
)
def test_misuse_raises_alike(tmp_path, trial, culprit):
    """Raised at the same point as Determined, of its type (or, registered as
    ``misuse-error-type``, hookdet's TrialError where Determined trips over its own code)."""
    results = harness.run_case(tmp_path, trial, dict(PERIODS, max_length={"Batch": 4}))
    determined, hookdet = single(results)
    assert_local_only_getters(trial, determined, hookdet)
    det_error, hd_error = determined["error"], hookdet["error"]
    assert det_error is not None and hd_error is not None, (det_error, hd_error)
    assert culprit in hd_error["message"], hd_error
    words = DETERMINEDS_WORDS.get(trial)  # what Determined's own tests match on
    if words:
        assert words in det_error["message"] and words in hd_error["message"], (det_error, hd_error)
    if det_error["type"] == "AttributeError":
        assert "misuse-error-type" in EXPECTED_DIFFERENCES
        assert hd_error["type"] == "TrialError", hd_error
    else:
        assert det_error["type"] in hd_error["classes"], (det_error, hd_error)
    assert_same_records(trial, dict(determined, error=None), dict(hookdet, error=None), weights=False)


def test_reducer_result_shapes(tmp_path):
    """Lists, tuples, arrays, tensors, NumPy scalars and a dict from cross_slot_reduce reach the
    callbacks as Determined hands them on."""
    compare_case(tmp_path, "reducer-shapes", "ReducerResultShapes", dict(PERIODS, max_length={"Batch": 4}))


def test_resume_into_another_shape_raises_alike(tmp_path):
    """A checkpoint resumed into a model of another shape: Determined's ``RuntimeError`` (torch's
    load_state_dict), hookdet's CheckpointError that is also one, naming the model."""
    results = harness.run_case(tmp_path, "WiderOnResume", dict(RESUME_PERIODS, max_length={"Batch": 2}),
                               resume_fit=dict(RESUME_PERIODS, max_length={"Batch": 4}))
    determined, hookdet = results["determined"][1][0]["error"], results["hookdet"][1][0]["error"]
    assert determined is not None and determined["type"] == "RuntimeError", determined
    assert hookdet is not None and "RuntimeError" in hookdet["classes"], hookdet
    assert "model 0" in hookdet["message"] and "size mismatch" in hookdet["message"], hookdet
    assert "size mismatch" in determined["message"], determined


def test_vector_training_metric(tmp_path):
    """A training metric with several elements: its batches as they are, its average over all
    its elements, as Determined computes it."""
    determined, hookdet = compare_case(tmp_path, "vector-training-metric", "VectorTrainingMetric",
                                       dict(PERIODS, max_length={"Batch": 4}))
    workload = events(hookdet, "callback", method="on_training_workload_end")[0]
    assert workload["batch_metrics"]["list"][0]["items"]["vector"]["shape"] == [3]
    assert workload["batch_metrics"]["list"][0]["items"]["vector"]["ndarray"] == "float32"
    assert isinstance(workload["avg_metrics"]["items"]["vector"], float)


def test_tensorboard_on_by_default(tmp_path):
    """``tensorboard-not-a-dependency``: Determined's default run crashes at its first report."""
    results = harness.run_case(tmp_path, "Basic", dict(PERIODS, max_length={"Batch": 2}), init={})
    determined, hookdet = single(results)
    assert determined["error"]["type"] == "ModuleNotFoundError" and "tensorboard" in determined["error"]["message"]
    assert hookdet["error"] is None
    assert events(hookdet, "init")[0]["getters"]["items"]["enable_tensorboard_logging"] is True
    COMPARED["tensorboard-default"] = 2


def _lrs(record):
    return [event["lr"]["list"] for event in events(record, "train_batch")]


def test_aggregation_with_schedulers(tmp_path):
    """aggregation_frequency 2, averaged: schedulers step only when the optimizer does, every
    mode as Determined steps it; weights equal."""
    compare_case(tmp_path, "aggregation", "Aggregated", dict(PERIODS, max_length={"Batch": 8}),
                 hparams={"global_batch_size": 4, "optimizer_step_frequency": 1}, init={"aggregation_frequency": 2,
                 "enable_tensorboard_logging": False})


def test_step_every_optimizer_step_counts_optimizer_steps(tmp_path):
    """``step-every-optimizer-step-counts-batches``: frequency 2 under aggregation 2 is every other
    optimizer step in hookdet (batches 3 and 7), every optimizer step in Determined."""
    results = harness.run_case(
        tmp_path, "Aggregated", dict(PERIODS, max_length={"Batch": 8}),
        hparams={"global_batch_size": 4, "optimizer_step_frequency": 2},
        init={"aggregation_frequency": 2, "enable_tensorboard_logging": False},
    )
    determined, hookdet = single(results)
    assert [lrs[2] for lrs in _lrs(determined)] == [0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125]
    assert [lrs[2] for lrs in _lrs(hookdet)] == [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05]
    COMPARED["optimizer-step-frequency"] = 2


@pytest.mark.parametrize("average", [True, False])
def test_average_aggregated_gradients(tmp_path, average):
    """``wrap_optimizer(average_aggregated_gradients=...)`` under aggregation 2: the same weights."""
    compare_case(tmp_path, f"average-{average}", "Aggregated", dict(PERIODS, max_length={"Batch": 6}),
                 hparams={"global_batch_size": 4, "optimizer_step_frequency": 1, "average": average},
                 init={"aggregation_frequency": 2, "enable_tensorboard_logging": False})


def _batch_metrics(record):
    """Each trained batch's metrics, by batch index (from on_training_workload_end)."""
    by_batch = {}
    for event in events(record, "callback", method="on_training_workload_end"):
        batches = event["batch_metrics"]["list"]
        for offset, metrics in enumerate(batches):
            by_batch[event["trained"] - len(batches) + offset] = metrics
    return by_batch


def _validations(record):
    return {e["trained"]: e["metrics"] for e in events(record, "callback", method="on_validation_end")}


RESUME_PERIODS = {"validation_period": {"Batch": 2}, "checkpoint_period": {"Batch": 2},
                  "reporting_period": {"Batch": 2}, "checkpoint_policy": "all"}


def test_resume(tmp_path):
    """Stop at batch 3, resume in new processes to batch 7.

    Alike: the first run, and the resumed run's hooks up to training (``on_trial_startup`` before
    ``on_checkpoint_load_start`` and the callbacks' ``load_state_dict``, with the state saved).
    ``local-resume-restarts-data``: Determined trains batches 0.. again from the first records;
    hookdet continues at batch 3 and ends bit for bit where a run that never stopped ends.
    ``weights-only-load``: only Determined needs TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (the harness
    gives it to Determined alone).
    """
    results = harness.run_case(
        tmp_path / "resumed", "Resumable", dict(RESUME_PERIODS, max_length={"Batch": 3}),
        resume_fit=dict(RESUME_PERIODS, max_length={"Batch": 7}),
    )
    determined, hookdet = single(results)
    assert_local_only_getters("resume", determined, hookdet)
    assert_same_records("resume", determined, hookdet)

    det_resumed, hd_resumed = single(results, phase=1)
    startup = ["on_trial_startup", "on_checkpoint_load_start", "load_state_dict", "on_training_start"]
    for record in (det_resumed, hd_resumed):
        calls = events(record, "callback")
        assert [c["method"] for c in calls[:4]] == startup, [c["method"] for c in calls[:6]]
        assert calls[0]["checkpoint_uuid"] == "str"
        assert calls[1]["checkpoint_keys"]["list"] == ["callbacks", "lr_schedulers_state_dict",
                                                       "models_state_dict", "optimizers_state_dict", "rng_state"]
        assert calls[2]["state"]["items"]["name"] == "recorder" and calls[2]["state"]["items"]["calls"] > 0
    det_startup = events(det_resumed, "callback", method="on_trial_startup")[0]
    hd_startup = events(hd_resumed, "callback", method="on_trial_startup")[0]
    assert det_startup["first_batch_idx"] == 0 and hd_startup["first_batch_idx"] == 3
    det_first = events(det_resumed, "train_batch")[0]
    hd_first = events(hd_resumed, "train_batch")[0]
    assert (det_first["batch_idx"], det_first["records"]["values"]) == (0, [0, 1, 2, 3])
    assert (hd_first["batch_idx"], hd_first["records"]["values"]) == (3, [12, 13, 14, 15])

    straight = harness.run_case(tmp_path / "straight", "Resumable", dict(RESUME_PERIODS, max_length={"Batch": 7}),
                                frameworks=("hookdet",))["hookdet"][0][0]
    expected = _batch_metrics(straight)
    resumed = _batch_metrics(hd_resumed)
    assert sorted(resumed) == [3, 4, 5, 6]
    assert {index: expected[index] for index in resumed} == resumed
    assert {k: v for k, v in _validations(straight).items() if k > 3} == _validations(hd_resumed)
    compared = assert_same_weights("resume", straight["weights"], hd_resumed["weights"])
    COMPARED["resume"] += compared + 12


def test_determined_resume_needs_weights_only_workaround(tmp_path):
    """``weights-only-load``: without TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD Determined cannot resume."""
    results = harness.run_case(
        tmp_path, "Basic", dict(RESUME_PERIODS, max_length={"Batch": 1}),
        resume_fit=dict(RESUME_PERIODS, max_length={"Batch": 2}),
        frameworks=("determined",), unset_env=("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",),
    )
    error = results["determined"][1][0]["error"]
    assert error is not None and "weights_only" in error["message"], error
    COMPARED["weights-only"] = 1


def test_shuffled_data_order(tmp_path):
    """``DataLoader(shuffle=True)`` under the same seed: the same records in the same order."""
    results = harness.run_case(tmp_path, "Shuffled", dict(PERIODS, max_length={"Batch": 8}))
    determined, hookdet = single(results)
    orders = [[e["records"]["values"] for e in events(record, "train_batch")] for record in (determined, hookdet)]
    for order in orders:  # each epoch is a permutation of the 16 records
        assert sorted(sum(order[:4], [])) == sorted(sum(order[4:], [])) == list(range(16))
    # shuffle-order (expected_differences): Determined's order comes from torch's global
    # generator, hookdet's from the trial seed; the data differ, so only the calls are compared.
    assert orders[0] != orders[1]
    assert_local_only_getters("shuffle", determined, hookdet)
    assert compare.sequence(determined["events"]) == compare.sequence(hookdet["events"])
    COMPARED["shuffle"] = COMPARED.get("shuffle", 0) + 1


#: Misuse Determined also refuses at the call: (the case, a word both messages name).
REFUSED_ALIKE = [("stop_not_bool", "stop_requested"), ("tensorboard_not_bool", "enable_tensorboard_logging"),
                 ("reducer_not_callable", "wrap_reducer"), ("step_mode_not_a_mode", "step_mode"),
                 ("hparam_missing", "learning_rate"),
                 ("loader_iterable_dataset", "IterableDataset"), ("loader_no_batching", "batch_size=None"),
                 ("loader_negative_workers", "num_workers"), ("loader_negative_timeout", "timeout"),
                 ("loader_prefetch_without_workers", "prefetch_factor"),
                 ("loader_persistent_without_workers", "persistent_workers"),
                 ("loader_sampler_and_shuffle", "mutually exclusive"),
                 ("loader_batch_sampler_and_batch_size", "mutually exclusive"),
                 ("batch_length_of_empty_dict", "must have at least one"),
                 ("batch_length_of_a_string", "of incorrect type")]
#: Misuse Determined refuses with its InvalidExperimentException: (the case, a word both name).
REFUSED_INVALID_EXPERIMENT = [("optimizer_passes_zero", "backward_passes_per_step for local gradient aggregation must be"),
                              ("plateau_scheduler", "step_mode=MANUAL_STEP"),
                              ("scheduler_of_unwrapped_optimizer", "optimizer that is returned by wrap_optimizer()"),
                              ("scaler_after_model", "wrap_scaler before wrap_model")]
#: Misuse Determined trips over in its own code, or accepts: what hookdet's refusal names.
REFUSED_BY_HOOKDET = [("model_not_module", "wrap_model", "misuse-error-type"),
                      ("optimizer_not_optimizer", "wrap_optimizer", "misuse-refused-early"),
                      ("frequency_zero", "frequency", "misuse-refused-early"),
                      ("reducer_name_twice", "'r'", "misuse-refused-early"),
                      ("batch_zero", "Batch(0)", "misuse-refused-early"),
                      ("epoch_not_int", "1.5", "misuse-refused-early")]


def test_context_misuse(tmp_path):
    """Twenty-five wrong calls (to the context, ``Batch``, ``Epoch``, ``DataLoader``), each caught and
    recorded, in one trial. Fifteen raise Determined's exception type (hookdet's may derive from
    more) naming the culprit; four Determined refuses with its ``InvalidExperimentException``, a
    ``BaseException``, where hookdet raises an ``Exception`` with Determined's words
    (``invalid-experiment-exception``); six hookdet refuses at the call where Determined trips
    inside its own code (``misuse-error-type``) or accepts them and fails later or never
    (``misuse-refused-early``)."""
    results = harness.run_case(tmp_path, "MisusedContext", dict(PERIODS, max_length={"Batch": 3}))
    determined, hookdet = single(results)
    assert_local_only_getters("misuse", determined, hookdet)
    det_seen = {e["name"]: e for e in events(determined, "misuse")}
    hd_seen = {e["name"]: e for e in events(hookdet, "misuse")}
    cases = REFUSED_ALIKE + REFUSED_BY_HOOKDET + REFUSED_INVALID_EXPERIMENT
    assert list(det_seen) == list(hd_seen) and sorted(det_seen) == sorted(name for name, *_ in cases)
    for name, culprit in REFUSED_ALIKE:
        det, hd = det_seen[name], hd_seen[name]
        assert det["type"] is not None and det["type"] in hd["classes"]["list"], (name, det, hd)
        assert culprit in det["message"] and culprit in hd["message"], (name, det, hd)
    assert "invalid-experiment-exception" in EXPECTED_DIFFERENCES
    for name, words in REFUSED_INVALID_EXPERIMENT:
        det, hd = det_seen[name], hd_seen[name]
        assert det["type"] == "InvalidExperimentException" and "Exception" not in det["classes"]["list"], (name, det)
        assert "Exception" in hd["classes"]["list"], (name, hd)
        assert words.lower() in det["message"].lower() and words.lower() in hd["message"].lower(), (name, det, hd)
    for name, culprit, difference in REFUSED_BY_HOOKDET:
        assert difference in EXPECTED_DIFFERENCES
        det, hd = det_seen[name], hd_seen[name]
        assert hd["type"] is not None and culprit in hd["message"], (name, hd)
        assert det["type"] == ("AttributeError" if difference == "misuse-error-type" else None), (name, det)
    # ``getters-before-training``: in __init__, Determined raises; hookdet answers (batch 0).
    assert "getters-before-training" in EXPECTED_DIFFERENCES
    (det_getters,) = events(determined, "before_training")
    (hd_getters,) = events(hookdet, "before_training")
    raised = {"dict": "dict", "items": {"raised": "InternalException"}}
    assert {k: v for k, v in det_getters.items() if k != "event"} == dict.fromkeys(hd_getters.keys() - {"event"}, raised)
    assert (hd_getters["current_train_batch"], hd_getters["is_epoch_start"], hd_getters["is_epoch_end"]) == (0, False, False)
    for record in (determined, hookdet):
        record["events"] = [e for e in record["events"] if e["event"] not in ("misuse", "before_training")]
    assert_same_records("misuse", determined, hookdet, culprit="every misuse recorded", weights=False)
    COMPARED["misuse"] += 2 * len(det_seen)
