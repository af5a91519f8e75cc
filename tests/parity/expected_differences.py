"""Every difference between Determined 0.38.1 and hookdet that the parity suite expects, with why.

The suite compares everything else exactly; for each entry here it asserts hookdet's documented
behaviour instead (the test named in ``checked_by``). ``docs/migrating-from-determined.md`` lists
the same ids in its table of intended differences, and ``test_docs_table.py`` holds the two
together both ways.

Kinds:

- ``determined-bug``: Determined, run locally, does something wrong; hookdet does it right.
- ``intended``: a deliberate choice of hookdet's, for the reason given.
- ``PENDING_OTHER_BRANCH``: a hookdet difference that another branch of issue 14 fixes
  (public surface, samplers, scripts, Trainer retention); the suite records it until then.
"""
from __future__ import annotations

from typing import Dict, NamedTuple


class Difference(NamedTuple):
    kind: str
    determined: str
    hookdet: str
    reason: str
    checked_by: str


EXPECTED_DIFFERENCES: Dict[str, Difference] = {
    "local-resume-restarts-data": Difference(
        "determined-bug",
        "a local resume trains on the data from batch 0 again and reports first_batch_idx 0",
        "resumes the data exactly where the checkpoint stopped (first_batch_idx = batches trained)",
        "a resumed run must see the data an uninterrupted run sees, or resume is not resume",
        "test_parity.py::test_resume",
    ),
    "weights-only-load": Difference(
        "determined-bug",
        "its checkpoints pickle Python objects and fail to load on torch >= 2.6 unless "
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1",
        "checkpoints hold only tensors and plain values and load with weights_only=True",
        "resume must work on current PyTorch without disabling its safety check",
        "test_parity.py::test_resume",
    ),
    "tensorboard-not-a-dependency": Difference(
        "determined-bug",
        "enables TensorBoard logging by default without depending on tensorboard: the first "
        "report raises ModuleNotFoundError",
        "depends on tensorboard; the default run trains and logs",
        "a default run must not crash at its first report",
        "test_parity.py::test_tensorboard_on_by_default",
    ),
    "tensorboard-path-none": Difference(
        "determined-bug",
        "context.get_tensorboard_path() returns None locally",
        "returns the run's tensorboard directory",
        "a trial writing its own TensorBoard files needs a directory",
        "test_parity.py::test_basic",
    ),
    "trial-seed-unset": Difference(
        "determined-bug",
        "context.get_trial_seed() is None locally",
        "the trial seed derived from reproducibility.experiment_seed as Determined's master derives it",
        "a local run must be reproducible and seed the same in every rank and on every resume",
        "test_parity.py::test_basic",
    ),
    "step-every-optimizer-step-counts-batches": Difference(
        "determined-bug",
        "an LRScheduler with STEP_EVERY_OPTIMIZER_STEP steps every batch, even between "
        "optimizer steps under aggregation_frequency > 1",
        "steps once per real optimizer step, as its name says",
        "the scheduler must follow the optimizer, not the batch count",
        "test_parity.py::test_step_every_optimizer_step_counts_optimizer_steps",
    ),
    "profiler-traces-in-none": Difference(
        "determined-bug",
        "context.set_profiler writes its traces into a directory named 'None' in the working "
        "directory (its TensorBoard path is None locally)",
        "writes them into the run's tensorboard/ directory, where TensorBoard looks",
        "a trace nobody finds is no trace",
        "test_parity.py::test_profiler_traces",
    ),
    "report-averaging": Difference(
        "intended",
        "reports the metrics its callbacks get: averages computed in the values' dtype "
        "(float32 for float32 tensors)",
        "callbacks get Determined's values and types exactly; metrics.jsonl, TensorBoard, the "
        "checkpoint metadata and the searcher average the same values in float64, so reports "
        "and callbacks agree within float32 rounding",
        "a float64 average is the more exact one, and the reports are hookdet's own files",
        "../builtin_plugins/test_checkpoint.py::test_checkpoint_contents_need_no_unpickling",
    ),
    "invalid-experiment-exception": Difference(
        "intended",
        "refuses backward_passes_per_step < 1, a ReduceLROnPlateau outside MANUAL_STEP, a "
        "scheduler of an unwrapped optimizer and wrap_scaler after wrap_model with "
        "determined.errors.InvalidExperimentException, a BaseException that `except Exception` "
        "does not catch",
        "refuses the same calls with a ValueError (TrialError for wrap_scaler) whose message "
        "carries Determined's words and names the method",
        "an error in user code should be catchable as one; hookdet cannot raise Determined's "
        "class without depending on Determined",
        "test_parity.py::test_context_misuse",
    ),
    "misuse-error-type": Difference(
        "intended",
        "train_batch returning a list, or evaluate_batch a bare tensor, fails inside Determined's "
        "own code with AttributeError (\"'list' object has no attribute ...\")",
        "raises TrialError at the same point, naming the method and what it returned; likewise "
        "context.wrap_model given something that is not a module (Determined: AttributeError "
        "from its own code; hookdet: TypeError naming wrap_model)",
        "an error should say which method broke which rule, not where the framework tripped",
        "test_parity.py::test_misuse_raises_alike, test_parity.py::test_context_misuse",
    ),
    "stop-within-one-batch": Difference(
        "intended",
        "set_stop_requested(True) takes effect at the next reporting, validation or checkpoint "
        "boundary: training goes on until then (up to scheduling_unit, 100 batches by default)",
        "training stops after the current batch, with a checkpoint there (and the validation due "
        "at that batch, if any)",
        "a stop request, a preemption signal's in particular, must be honoured within a batch",
        "test_parity.py::test_set_stop_requested_between_boundaries",
    ),
    "shuffle-order": Difference(
        "determined-bug",
        "DataLoader(shuffle=True) draws its order from the global torch generator (RandomSampler), "
        "so a resumed run sees another order",
        "the order of Determined's ReproducibleShuffleSampler seeded with the trial seed, a pure "
        "function of the seed and the epoch",
        "a shuffled run must resume exactly (DESIGN section 7); the samplers themselves match "
        "Determined's index for index",
        "test_parity.py::test_shuffled_data_order",
    ),
    "namedtuple-batch": Difference(
        "intended",
        "to_device rebuilds a namedtuple batch (as the default collate makes from namedtuple "
        "records) as a plain tuple, so batch.x raises AttributeError",
        "keeps the namedtuple, with the same items",
        "indexing works the same under both, and the trial's own field names keep working",
        "test_parity_data.py::test_batch_structures_and_get_batch_length",
    ),
    "data-length-nested": Difference(
        "determined-bug",
        "data_length (and so the default get_batch_length) of a dict or list takes len() of its "
        "first item, so {'inputs': {'x': ..., 'y': ...}} counts 2, the inner dict's keys",
        "finds the first tensor or array, recursively, as Determined's docstring says, and counts "
        "its first dimension",
        "a batch's length is its number of records",
        "test_parity_data.py::test_batch_structures_and_get_batch_length",
    ),
    "batch-length-in-training": Difference(
        "intended",
        "calls get_batch_length after every training batch, for a samples-per-second figure it "
        "computes and never reports (and before every validation batch, as hookdet does)",
        "calls it only on validation batches, where its count is used (logged at DEBUG)",
        "the per-batch path calls no user code whose result nobody uses (DESIGN: no hook without "
        "an implementation)",
        "test_parity_data.py::test_batch_structures_and_get_batch_length",
    ),
    "plain-loader-one-epoch": Difference(
        "determined-bug",
        "a plain torch.utils.data.DataLoader (allowed after "
        "disable_dataset_reproducibility_checks()) is iterated once: when its first epoch ends, "
        "training spins forever, with no error and no further batch",
        "starts the loader's next epoch, as for its own DataLoader",
        "a run longer than one epoch must train, not hang",
        "test_parity_data.py::test_plain_torch_loader_past_its_first_epoch",
    ),
    "misuse-refused-early": Difference(
        "intended",
        "accepts wrap_optimizer of a non-optimizer, wrap_lr_scheduler(frequency=0), a second "
        "wrap_reducer with a name already used, Batch(0) and Epoch(1.5), and fails later (AttributeError at the first "
        "checkpoint for the non-optimizer, ZeroDivisionError at the first batch for frequency 0) "
        "or never (the second reducer silently replaces the first's metric)",
        "refuses each at the call, naming the method and the argument",
        "an error belongs at the line that caused it",
        "test_parity.py::test_context_misuse",
    ),
    "local-ids-missing": Difference(
        "determined-bug",
        "context.get_trial_id() and get_experiment_id() raise AttributeError locally "
        "('DummyTrainContext' object has no attribute '_trial_id')",
        "1 for a single run; in a search, the trial's number",
        "a trial that names its outputs by trial id must run locally too",
        "test_parity.py::test_basic",
    ),
    "getters-before-training": Difference(
        "intended",
        "context.current_train_batch(), is_epoch_start() and is_epoch_end() raise "
        "InternalException (\"Training hasn't started\") when called before training, e.g. in "
        "the trial's __init__",
        "answer for the position training starts from (batch 0, or the resume point)",
        "no trial written for Determined calls them there, and an answer is more useful than an "
        "internal error",
        "test_parity.py::test_context_misuse",
    ),
    "loader-leaves-global-rng": Difference(
        "intended",
        "every pass of a DataLoader (each validation, the training loader's start) draws one "
        "value from torch's global generator, so a trial drawing from that generator in "
        "train_batch (noise, dropout on the CPU) sees another stream after each validation",
        "the loaders draw from generators of their own, seeded from the trial seed; the global "
        "generators are the trial's alone",
        "what a trial draws must not depend on how many loader passes ran before it, or a resumed "
        "run (whose loaders start anew) could not continue the stream exactly",
        "test_parity_determined_checkpoints.py::test_loader_passes_leave_the_global_generator_alone",
    ),
    "core-local-stand-ins": Difference(
        "intended",
        "det.core has Dummy* classes (DummyTrainContext, DummyCheckpointContext, DummyPreemptContext, "
        "DummySearcherContext, DummySearcherOperation, DummyProfilerContext, "
        "DummyExperimentalCoreContext): what core.init() returns off a cluster, logging metrics "
        "only, never preempting, storing no metadata",
        "core.init() off a cluster returns the real contexts over a local run; of the stand-ins "
        "only DummyDistributedContext (one process, rank 0 of 1) exists",
        "a stand-in that drops what the script reports is what hookdet replaces; a script that "
        "names a stand-in class gets an AttributeError rather than a context that loses its data",
        "test_public_surface.py::test_every_public_name_and_signature_matches_determined",
    ),
}
