"""Trials for the differential suite, written once against Determined's public API.

Every trial imports its framework through ``PARITY_FRAMEWORK`` (``determined`` or ``hookdet``),
so this one file runs unchanged under both; what each observes goes to :mod:`tests.parity.record`.
Models are tiny linear layers on 16 synthetic records (4 batches of 4 per epoch, per rank), so a
whole case runs in a second or two.
"""
from __future__ import annotations

import importlib
import os
import random
from typing import Any, Dict

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.parity.record import CONTEXTS, LATEST_CHECKPOINT, event, type_name

pytorch = importlib.import_module(os.environ.get("PARITY_FRAMEWORK", "hookdet") + ".pytorch")

RECORDS = 16


class Regression(Dataset):
    """``RECORDS`` fixed records ``(x, y, index)``: the index tells which records a batch held."""

    def __init__(self, records: int = RECORDS, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(records, 3, generator=generator)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(records, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> Any:
        return self.x[index], self.y[index], index


def getters(context: Any) -> Dict[str, Any]:
    """What ``train_batch``/``evaluate_batch`` can ask the context, a user's view of it."""
    return {
        "hparams": context.get_hparams(),
        "global_batch_size": context.get_global_batch_size(),
        "per_slot_batch_size": context.get_per_slot_batch_size(),
        "rank": context.distributed.get_rank(),
        "size": context.distributed.get_size(),
        "stop_requested": context.get_stop_requested(),
        "enable_tensorboard_logging": context.get_enable_tensorboard_logging(),
    }


def train_getters(context: Any) -> Dict[str, Any]:
    """:func:`getters` plus the ones that only mean something while training."""
    return dict(
        getters(context),
        current_train_batch=context.current_train_batch(),
        current_train_epoch=context.current_train_epoch(),
        is_epoch_start=context.is_epoch_start(),
        is_epoch_end=context.is_epoch_end(),
    )


class Recorder(pytorch.PyTorchCallback):
    """Records every callback call with its arguments, and where training stands at that moment."""

    def __init__(self, trial: Any, name: str = "recorder") -> None:
        self.trial = trial
        self.name = name
        self.calls = 0

    def _seen(self, method: str, **arguments: Any) -> None:
        self.calls += 1
        event("callback", name=self.name, method=method, trained=self.trial.trained, **arguments)

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Any) -> None:
        self._seen("on_trial_startup", first_batch_idx=first_batch_idx, checkpoint_uuid=_kind(checkpoint_uuid))

    def on_trial_shutdown(self) -> None:
        self._seen("on_trial_shutdown")

    def on_training_start(self) -> None:
        self._seen("on_training_start")

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self._seen("on_training_epoch_start", epoch_idx=epoch_idx)

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self._seen("on_training_epoch_end", epoch_idx=epoch_idx)

    def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
        self._seen(
            "on_training_workload_end",
            avg_metrics=avg_metrics,
            batch_metrics=batch_metrics,
            types=[type_name(avg_metrics), type_name(batch_metrics)]
            + sorted({type_name(v) for m in batch_metrics for v in m.values()}),
        )

    def on_validation_start(self) -> None:
        self._seen("on_validation_start")

    def on_validation_epoch_start(self) -> None:
        self._seen("on_validation_epoch_start")

    def on_validation_epoch_end(self, outputs: Any) -> None:
        self._seen("on_validation_epoch_end", outputs=outputs)

    def on_validation_end(self, metrics: Any) -> None:
        self._seen("on_validation_end", metrics=metrics, types=sorted({type_name(v) for v in metrics.values()}))

    def on_checkpoint_load_start(self, checkpoint: Any) -> None:
        self._seen("on_checkpoint_load_start", checkpoint_keys=_determined_keys(checkpoint))

    def on_checkpoint_save_start(self, checkpoint: Any) -> None:
        self._seen("on_checkpoint_save_start", checkpoint_keys=_determined_keys(checkpoint))

    def on_checkpoint_write_end(self, checkpoint_dir: Any) -> None:
        self._seen("on_checkpoint_write_end", checkpoint_dir=_directory(checkpoint_dir))

    def on_checkpoint_upload_end(self, uuid: Any) -> None:
        LATEST_CHECKPOINT.append(uuid)
        self._seen("on_checkpoint_upload_end", uuid=_kind(uuid))

    def on_checkpoint_end(self, checkpoint_dir: Any) -> None:
        self._seen("on_checkpoint_end", checkpoint_dir=_directory(checkpoint_dir))

    def state_dict(self) -> Dict[str, Any]:
        self._seen("state_dict")
        return {"calls": self.calls, "name": self.name}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._seen("load_state_dict", state=state_dict)
        self.calls = state_dict["calls"]


#: The keys Determined's own checkpoint dict has; hookdet adds its own (see expected differences).
DETERMINED_CHECKPOINT_KEYS = (
    "models_state_dict",
    "optimizers_state_dict",
    "lr_schedulers_state_dict",
    "callbacks",
    "amp_state",
    "scalers_state_dict",
    "rng_state",
)


def outcome(function: Any, *args: Any) -> Any:
    """What ``function(*args)`` returns, or the type of what it raises."""
    try:
        return function(*args)
    except Exception as error:  # noqa: BLE001 - the type is the observation
        return {"raised": type(error).__name__}


def _determined_keys(checkpoint: Any) -> Any:
    return sorted(key for key in checkpoint if key in DETERMINED_CHECKPOINT_KEYS)


def _kind(value: Any) -> Any:
    """A uuid-like string reads as "str" (its value differs per run), None as None."""
    return None if value is None else type(value).__name__


def _directory(value: Any) -> Any:
    return {"type": type(value).__name__, "is_dir": os.path.isdir(str(value))}


class BaseTrial(pytorch.PyTorchTrial):
    """One linear model, SGD, MSE; records every batch, its metrics and the context's getters."""

    #: Whether evaluate_batch takes batch_idx (overridden by subclasses that say otherwise).
    lr = 0.05

    def __init__(self, context: Any) -> None:
        self.context = context
        CONTEXTS.append(context)
        self.trained = 0  # batches trained so far (the last train_batch's batch_idx + 1)
        self.model = context.wrap_model(nn.Linear(3, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=self.lr))
        event("init", getters=getters(context))
        event("init_local_only", trial_seed=outcome(context.get_trial_seed),
              tensorboard_path_is_none=context.get_tensorboard_path() is None,
              trial_id=outcome(context.get_trial_id), experiment_id=outcome(context.get_experiment_id))

    def build_callbacks(self) -> Dict[str, Any]:
        return {"recorder": Recorder(self)}

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(Regression(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(Regression(8, seed=1), batch_size=self.context.get_per_slot_batch_size())

    def loss(self, batch: Any) -> torch.Tensor:
        x, y, _ = batch
        return nn.functional.mse_loss(self.model(x), y)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        event("train_batch", epoch_idx=epoch_idx, batch_idx=batch_idx, records=batch[2],
              getters=train_getters(self.context))
        loss = self.loss(batch)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        self.trained = batch_idx + 1
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        event("evaluate_batch", records=batch[2], getters=getters(self.context))
        return {"val_loss": self.loss(batch)}


class Basic(BaseTrial):
    """The plainest trial: ``evaluate_batch(batch)``, one callback."""


def hparam(context: Any, name: str, default: Any) -> Any:
    return context.get_hparams().get(name, default)


class Resumable(BaseTrial):
    """:class:`Basic` with a stateful callback (its state is checkpointed and restored)."""


class WiderOnResume(BaseTrial):
    """Misuse on resume: the model has another shape than the checkpoint's (phase 2 finds the
    checkpoint phase 1 named in ``latest_checkpoint.txt`` and builds a wider layer)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        CONTEXTS.append(context)
        self.trained = 0
        hidden = 5 if os.path.exists("latest_checkpoint.txt") else 4
        self.model = context.wrap_model(nn.Sequential(nn.Linear(3, hidden), nn.Linear(hidden, 1)))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=self.lr))


class TwoCallbacks(BaseTrial):
    """Two callbacks: the order each hook reaches them in (on_trial_shutdown included)."""

    def build_callbacks(self) -> Dict[str, Any]:
        return {"first": Recorder(self, "first"), "second": Recorder(self, "second")}


class PositionalCallback(pytorch.PyTorchCallback):
    """Written as users do: other parameter names than the base class, ``*args`` signatures."""

    def __init__(self, trial: Any) -> None:
        self.trial = trial

    def on_trial_startup(self, *args: Any) -> None:
        event("positional", method="on_trial_startup", count=len(args), first=args[0])

    def on_training_epoch_start(self, epoch) -> None:  # type: ignore[override]
        event("positional", method="on_training_epoch_start", epoch=epoch)

    def on_training_epoch_end(self, *args: Any) -> None:
        event("positional", method="on_training_epoch_end", args=list(args))

    def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
        event("positional", method="on_training_workload_end", batches=len(batch_metrics))

    def on_validation_epoch_end(self, results) -> None:  # type: ignore[override]
        event("positional", method="on_validation_epoch_end", batches=len(results))

    def on_validation_end(self, m) -> None:  # type: ignore[override]
        event("positional", method="on_validation_end", keys=sorted(m))

    def on_checkpoint_save_start(self, ckpt) -> None:  # type: ignore[override]
        event("positional", method="on_checkpoint_save_start", is_dict=isinstance(ckpt, dict))

    def on_checkpoint_write_end(self, path) -> None:  # type: ignore[override]
        event("positional", method="on_checkpoint_write_end", is_dir=os.path.isdir(path))

    def on_checkpoint_upload_end(self, *args: Any, **kwargs: Any) -> None:
        LATEST_CHECKPOINT.append((list(args) + list(kwargs.values()))[0])
        event("positional", method="on_checkpoint_upload_end", args=len(args), kwargs=sorted(kwargs))


class Positional(BaseTrial):
    def build_callbacks(self) -> Dict[str, Any]:
        return {"positional": PositionalCallback(self)}


class TwoModels(BaseTrial):
    """Two models, two optimizers, an LR scheduler each (every batch / every epoch), clipping,
    ``evaluate_batch(batch, batch_idx)``."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.head = context.wrap_model(nn.Linear(3, 1))
        self.head_optimizer = context.wrap_optimizer(torch.optim.Adam(self.head.parameters(), lr=0.01))
        self.scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH,
        )
        self.head_scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.head_optimizer, step_size=1, gamma=0.3),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y, records = batch
        event("train_batch", batch_idx=batch_idx, records=records,
              lrs=[self.optimizer.param_groups[0]["lr"], self.head_optimizer.param_groups[0]["lr"]])
        loss = nn.functional.mse_loss(self.model(x) + self.head(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer, clip_grads=lambda p: torch.nn.utils.clip_grad_norm_(p, 0.5))
        self.context.step_optimizer(self.head_optimizer, clip_grads=lambda p: torch.nn.utils.clip_grad_value_(p, 0.1))
        self.trained = batch_idx + 1
        return {"loss": loss, "head_norm": self.head.weight.norm()}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> Dict[str, Any]:  # type: ignore[override]
        x, y, records = batch
        event("evaluate_batch", batch_idx=batch_idx, records=records)
        return {"val_loss": nn.functional.mse_loss(self.model(x) + self.head(x), y)}


class SchedulerModes(BaseTrial):
    """MANUAL_STEP stepped by the trial and STEP_EVERY_OPTIMIZER_STEP, under
    ``aggregation_frequency`` (hparam ``aggregation``) and averaging (hparam ``average``)."""

    def __init__(self, context: Any) -> None:
        self.context = context
        CONTEXTS.append(context)
        self.trained = 0
        self.model = context.wrap_model(nn.Linear(3, 1))
        average = hparam(context, "average", None)
        kwargs = {} if average is None else {"average_aggregated_gradients": average}
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1), **kwargs)
        self.manual = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0 / (1 + step)),
            step_mode=pytorch.LRScheduler.StepMode.MANUAL_STEP,
        )
        self.per_step = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.9),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP,
        )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        event("train_batch", batch_idx=batch_idx, lr=self.optimizer.param_groups[0]["lr"],
              per_step_calls=self.per_step._scheduler.last_epoch if hasattr(self.per_step, "_scheduler") else None)
        loss = self.loss(batch)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        if batch_idx % 3 == 2:
            self.manual.step()
        self.trained = batch_idx + 1
        return {"loss": loss}


class SumReducer(pytorch.MetricReducer):
    """A stateful MetricReducer: sums what it was given, across ranks too."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, value: Any) -> None:
        event("reducer_update", value=value, type=type_name(value))
        self.total += float(value)
        self.count += 1

    def per_slot_reduce(self) -> Any:
        return self.total, self.count

    def cross_slot_reduce(self, per_slot_metrics: Any) -> Any:
        event("cross_slot_reduce", received=[list(m) for m in per_slot_metrics])
        return sum(total for total, _ in per_slot_metrics) / max(1, sum(count for _, count in per_slot_metrics))


class PairReducer(pytorch.MetricReducer):
    """``name=None``: returns a dict of metrics."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.values: list = []

    def update(self, value: Any) -> None:
        self.values.append(value)

    def per_slot_reduce(self) -> Any:
        return self.values

    def cross_slot_reduce(self, per_slot_metrics: Any) -> Any:
        flat = [v for values in per_slot_metrics for v in values]
        return {"pair_min": min(flat), "pair_max": max(flat)}


def _listed_mean(values: Any) -> float:
    event("reducer_fn", received=values, type=type_name(values))
    return float(np.mean(values))


class Reducers(BaseTrial):
    """Every reducer kind, non-scalar metrics, per-metric evaluation_reducer."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.fn_reducer = context.wrap_reducer(_listed_mean, name="fn_mean")
        self.sum_reducer = context.wrap_reducer(SumReducer(), name="summed")
        self.pair_reducer = context.wrap_reducer(PairReducer(), name=None, for_training=False)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        x, _, _ = batch
        self.fn_reducer.update(float(batch_idx))
        self.sum_reducer.update(metrics["loss"].item())
        metrics["row_mean"] = x.mean()
        return metrics

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        x, y, records = batch
        loss = self.loss(batch)
        self.pair_reducer.update(float(records.sum()))
        self.sum_reducer.update(float(loss))
        return {"val_loss": loss, "val_max": loss * 2, "val_sum": records.float().sum(), "val_vector": x.mean(dim=0)}

    def evaluation_reducer(self) -> Any:
        return {"val_loss": pytorch.Reducer.AVG, "val_max": pytorch.Reducer.MAX,
                "val_sum": pytorch.Reducer.SUM, "val_vector": pytorch.Reducer.AVG}


class ShapedReducer(pytorch.MetricReducer):
    """Counts its updates and returns them as ``shape`` says: the value types a user's
    cross_slot_reduce returns (a list, a tuple, an array, a tensor, a NumPy scalar, a dict)."""

    def __init__(self, shape: str) -> None:
        self.shape = shape
        self.reset()

    def reset(self) -> None:
        self.count = 0

    def update(self, value: Any) -> None:
        self.count += 1

    def per_slot_reduce(self) -> Any:
        return self.count

    def cross_slot_reduce(self, per_slot_metrics: Any) -> Any:
        counts = [float(count) for count in per_slot_metrics]
        return {
            "list": counts,
            "tuple": tuple(counts),
            "ndarray": np.array(counts),
            "tensor": torch.tensor(counts),
            "numpy_scalar": np.float32(sum(counts)),
            "ndarray_0d": np.array(sum(counts)),
            "tensor_0d": torch.tensor(sum(counts)),
            "one_item_list": [sum(counts)],
            "dict": {"shaped_dict_sum": sum(counts), "shaped_dict_list": counts},
        }[self.shape]


class ReducerResultShapes(BaseTrial):
    """Reducers whose cross-rank results are lists, tuples, arrays, tensors, NumPy scalars and a
    dict: what the callbacks, the logs and the searcher receive of each."""

    SHAPES = ("list", "tuple", "ndarray", "tensor", "numpy_scalar", "ndarray_0d", "tensor_0d", "one_item_list")

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.shaped = [context.wrap_reducer(ShapedReducer(shape), name=f"shaped_{shape}") for shape in self.SHAPES]
        self.shaped.append(context.wrap_reducer(ShapedReducer("dict"), name=None))

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        for reducer in self.shaped:
            reducer.update(batch_idx)
        return super().train_batch(batch, epoch_idx, batch_idx)

    def evaluate_batch(self, batch: Any) -> Dict[str, Any]:
        for reducer in self.shaped:
            reducer.update(0)
        return super().evaluate_batch(batch)


class UnnamedReducerReturnsScalar(BaseTrial):
    """Misuse: a reducer wrapped with ``name=None`` returns a number, not a dict."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.reducer = context.wrap_reducer(lambda values: float(len(values)), name=None)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.reducer.update(1.0)
        return super().train_batch(batch, epoch_idx, batch_idx)


class NamedReducerReturnsDict(BaseTrial):
    """Misuse: a reducer wrapped with a name returns a dict."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.reducer = context.wrap_reducer(ShapedReducer("dict"), name="named")

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.reducer.update(1.0)
        return super().train_batch(batch, epoch_idx, batch_idx)


class PlainTorchLoader(BaseTrial):
    """Misuse: ``build_training_data_loader`` returns a torch DataLoader, checks not disabled."""

    def build_training_data_loader(self) -> Any:
        return torch.utils.data.DataLoader(Regression(), batch_size=self.context.get_per_slot_batch_size())


class FullDataset(BaseTrial):
    """``evaluate_full_dataset`` instead of ``evaluate_batch``."""

    evaluate_batch = pytorch.PyTorchTrial.evaluate_batch  # not overridden

    def evaluate_full_dataset(self, data_loader: Any) -> Dict[str, Any]:
        losses = []
        for batch in data_loader:
            event("full_dataset_batch", records=batch[2])
            losses.append(self.loss(batch))
        return {"val_loss": torch.stack(losses).mean()}


class StopRequested(BaseTrial):
    """Asks to stop after batch 2 (``set_stop_requested``)."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        if batch_idx == hparam(self.context, "stop_at", 2):
            self.context.set_stop_requested(True)
        return metrics


class TrainReturnsList(BaseTrial):
    """Misuse: ``train_batch`` returns a list."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        return [super().train_batch(batch, epoch_idx, batch_idx)["loss"]]


class EvaluateReturnsTensor(BaseTrial):
    """Misuse: ``evaluate_batch`` returns a bare tensor."""

    def evaluate_batch(self, batch: Any) -> Any:
        return self.loss(batch)


class ChangingMetricNames(BaseTrial):
    """Misuse: ``evaluate_batch`` returns other metric names for its second batch."""

    def evaluate_batch(self, batch: Any) -> Any:
        return {"val_loss" if int(batch[2][0]) == 0 else "other": self.loss(batch)}


class VectorTrainingMetric(BaseTrial):
    """``train_batch`` returns a metric with several elements."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        metrics["vector"] = batch[0].mean(dim=0)
        return metrics


class Aggregated(BaseTrial):
    """For ``aggregation_frequency`` > 1: one scheduler of each automatic mode, each on its own
    optimizer's schedule; ``average_aggregated_gradients`` from hparam ``average`` when given."""

    def __init__(self, context: Any) -> None:
        self.context = context
        CONTEXTS.append(context)
        self.trained = 0
        self.model = context.wrap_model(nn.Linear(3, 1))
        average = hparam(context, "average", None)
        kwargs = {} if average is None else {"average_aggregated_gradients": average}
        self.optimizers = [
            context.wrap_optimizer(torch.optim.SGD([p], lr=0.1), **kwargs) for p in self.model.parameters()
        ]
        extra = context.wrap_optimizer(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), **kwargs)
        self.optimizers.append(extra)
        modes = pytorch.LRScheduler.StepMode
        for optimizer, mode, frequency in [
            (self.optimizers[0], modes.STEP_EVERY_BATCH, 1),
            (self.optimizers[1], modes.STEP_EVERY_EPOCH, 1),
            (extra, modes.STEP_EVERY_OPTIMIZER_STEP, hparam(context, "optimizer_step_frequency", 1)),
        ]:
            context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5), step_mode=mode, frequency=frequency
            )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        event("train_batch", batch_idx=batch_idx, lr=[o.param_groups[0]["lr"] for o in self.optimizers])
        loss = self.loss(batch)
        self.context.backward(loss)
        for optimizer in self.optimizers:
            self.context.step_optimizer(optimizer)
        self.trained = batch_idx + 1
        return {"loss": loss}


class Profiled(BaseTrial):
    """``context.set_profiler(...)``: where do the traces go?"""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        context.set_profiler(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=1, repeat=1),
        )


class Shuffled(BaseTrial):
    """``DataLoader(shuffle=True)``: the order each epoch's records come in."""

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(Regression(), batch_size=self.context.get_per_slot_batch_size(), shuffle=True)


def _misuses() -> Dict[str, Any]:
    """Wrong calls to the context, by name: each takes the trial (its model and optimizer built)."""
    step_lr = torch.optim.lr_scheduler.StepLR
    every_batch = pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH
    return {
        "stop_not_bool": lambda t: t.context.set_stop_requested("yes"),
        "tensorboard_not_bool": lambda t: t.context.set_enable_tensorboard_logging("yes"),
        "reducer_not_callable": lambda t: t.context.wrap_reducer(5, name="count"),
        "step_mode_not_a_mode": lambda t: t.context.wrap_lr_scheduler(step_lr(t.optimizer, 1), step_mode="batch"),
        "hparam_missing": lambda t: t.context.get_hparam("learning_rate"),
        "model_not_module": lambda t: t.context.wrap_model("model"),
        "optimizer_not_optimizer": lambda t: t.context.wrap_optimizer("optimizer"),
        "frequency_zero": lambda t: t.context.wrap_lr_scheduler(step_lr(t.optimizer, 1), step_mode=every_batch, frequency=0),
        "reducer_name_twice": lambda t: [t.context.wrap_reducer(len, name="r") for _ in range(2)],
        "batch_zero": lambda t: pytorch.Batch(0),
        "epoch_not_int": lambda t: pytorch.Epoch(1.5),
        **_loader_misuses(),
        "batch_length_of_empty_dict": lambda t: t.get_batch_length({}),
        "batch_length_of_a_string": lambda t: t.get_batch_length("records"),
        "optimizer_passes_zero": lambda t: t.context.wrap_optimizer(
            torch.optim.SGD(t.model.parameters(), lr=0.1), backward_passes_per_step=0),
        "plateau_scheduler": lambda t: t.context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.ReduceLROnPlateau(t.optimizer), step_mode=every_batch),
        "scheduler_of_unwrapped_optimizer": lambda t: t.context.wrap_lr_scheduler(
            step_lr(torch.optim.SGD(t.model.parameters(), lr=0.1), 1), step_mode=every_batch),
        "scaler_after_model": lambda t: t.context.wrap_scaler(torch.amp.GradScaler("cpu")),
    }


def _loader_misuses() -> Dict[str, Any]:
    """Wrong ``DataLoader(...)`` calls, refused by the constructor in both packages."""
    loader, data = pytorch.DataLoader, Regression()
    sequential = torch.utils.data.SequentialSampler(data)
    return {
        "loader_iterable_dataset": lambda t: loader(_Stream(), batch_size=2),
        "loader_no_batching": lambda t: loader(data, batch_size=None),
        "loader_negative_workers": lambda t: loader(data, batch_size=2, num_workers=-1),
        "loader_negative_timeout": lambda t: loader(data, batch_size=2, timeout=-1),
        "loader_prefetch_without_workers": lambda t: loader(data, batch_size=2, prefetch_factor=2),
        "loader_persistent_without_workers": lambda t: loader(data, batch_size=2, persistent_workers=True),
        "loader_sampler_and_shuffle": lambda t: loader(data, batch_size=2, sampler=sequential, shuffle=True),
        "loader_batch_sampler_and_batch_size": lambda t: loader(
            data, batch_size=2, batch_sampler=torch.utils.data.BatchSampler(sequential, 2, False)),
    }


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(4))


class MisusedContext(BaseTrial):
    """Makes every wrong call of :func:`_misuses` in ``__init__``, recording what each raised (a
    ``misuse`` event), then stops: some leave Determined's context broken for training."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        for name, misuse in _misuses().items():
            try:
                misuse(self)
            except BaseException as error:  # noqa: BLE001 - Determined's InvalidExperimentException is one
                event("misuse", name=name, type=type(error).__name__, message=str(error),
                      classes=[cls.__name__ for cls in type(error).__mro__])
            else:
                event("misuse", name=name, type=None)
        event("before_training", current_train_batch=outcome(context.current_train_batch),
              is_epoch_start=outcome(context.is_epoch_start), is_epoch_end=outcome(context.is_epoch_end))
        raise RuntimeError("every misuse recorded")


class Continued(SchedulerModes):
    """:class:`SchedulerModes` whose batches draw from every global generator (torch, NumPy,
    Python), so a checkpoint carries RNG state that matters, and a callback with state."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y, records = batch
        noise = torch.randn_like(x) * 0.01 + float(np.random.rand()) * 0.01 + random.random() * 0.01
        return super().train_batch((x + noise, y, records), epoch_idx, batch_idx)

    def build_callbacks(self) -> Dict[str, Any]:
        return {"recorder": Recorder(self)}
