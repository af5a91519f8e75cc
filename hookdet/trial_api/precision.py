"""The run's precision: one object that says how a forward runs, how a backward pass and an
optimizer step go, and what of it a checkpoint keeps (Lightning's ``Precision`` idea).

A run has exactly one. A plugin provides it by answering ``hookdet_make_precision(run)``
(the built-ins ``amp`` and ``apex`` do; a third-party FP8 plugin would); when no plugin answers,
the run trains in float32 with :class:`Precision` itself. Two plugins answering is refused when
the run opens, or when the trial switches a second one on: the structure allows one, so there is
no list of conflicts to keep in step.

What the context calls, and when:

* **Determined's switches**, from the trial: ``context.experimental.use_amp()``,
  ``wrap_scaler``, ``configure_apex_amp`` and ``autocast_forward_pass`` call the methods of the
  same names. While the run is in float32 the context first loads the built-in that answers the
  call (:data:`hookdet.plugins.selection.PRECISION_FOR_CALL`: ``use_amp`` loads ``amp``), as
  Determined switches them on from the trial; a precision that has no such switch refuses it
  in one line naming itself.
* **Wrapping**: every model ``wrap_model`` returns passes through :meth:`Precision.convert_model`
  (where a forward context such as autocast goes), every optimizer through
  :meth:`Precision.convert_optimizer`.
* **Per batch**, only while :attr:`Precision.changes_steps` is true: :meth:`Precision.backward`
  for ``context.backward``; :meth:`Precision.unscale_gradients` on optimizer-step batches, before
  gradients are averaged and clipped; :meth:`Precision.step` for the step itself (the default
  answer of ``hookdet_step_optimizer``, so a distribution plugin still wraps it);
  :meth:`Precision.batch_end` after ``train_batch``. While it is false the context runs plain
  torch and calls none of them.
* **State**: the plugin that provides the precision keeps its :meth:`Precision.state_dict` in
  checkpoints under the plugin's own name (a plugin's state, docs/writing-plugins.md);
  :class:`PrecisionPlugin` is such a plugin, less the precision it makes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import torch

from hookdet.errors import TrialError
from hookdet.markers import hookimpl

if TYPE_CHECKING:  # pragma: no cover
    from hookdet.loop.run import Run

#: The provider hook a precision plugin answers.
PRECISION_HOOK = "hookdet_make_precision"


class Precision:
    """Full float32 training, and the base a precision plugin's class derives from.

    Override what your precision changes; what it does not take (``use_amp`` on an apex
    precision, say) is refused in one line naming it.
    """

    #: Names the precision in messages: the name of the plugin that provides it.
    name = "float32"

    @property
    def changes_steps(self) -> bool:
        """Whether :meth:`backward`, :meth:`unscale_gradients`, :meth:`step` and
        :meth:`batch_end` do more than plain torch now; False: the context skips them per batch.
        Asked again after every switch and wrap, so it may change as the trial sets things up."""
        return False

    # ------------------------------------------------------------------ Determined's switches

    def use_amp(self, context: Any) -> None:
        """``context.experimental.use_amp()``."""
        raise self.refusal("context.experimental.use_amp()")

    def wrap_scaler(self, context: Any, scaler: Any) -> Any:
        """``context.wrap_scaler(scaler)``: returns what the trial uses."""
        raise self.refusal("context.wrap_scaler()")

    def configure_apex_amp(self, context: Any, models: Any, optimizers: Any, **arguments: Any) -> Tuple[Any, Any]:
        """``context.configure_apex_amp(models, optimizers, **arguments)``: returns the models and
        optimizers to use from now on."""
        raise self.refusal("context.configure_apex_amp()")

    def autocast_forward_pass(self, context: Any, module: torch.nn.Module) -> torch.nn.Module:
        """``context.autocast_forward_pass(module)``: returns the module to use."""
        raise self.refusal("context.autocast_forward_pass()")

    def refusal(self, call: str) -> TrialError:
        """The error for a switch this precision does not take."""
        return TrialError(
            f"{call}: this run's precision is {self.name!r}, which does not take it; a run has one "
            f"precision (remove {self.name!r} from the experiment file's plugins to use another)"
        )

    # ------------------------------------------------------------------ wrapping

    def convert_model(self, model: torch.nn.Module, context: Any) -> torch.nn.Module:
        """The model ``wrap_model`` returns, after the other plugins wrapped it."""
        return model

    def convert_optimizer(self, optimizer: torch.optim.Optimizer, context: Any) -> torch.optim.Optimizer:
        """The optimizer ``wrap_optimizer`` returns, after the other plugins wrapped it."""
        return optimizer

    # ------------------------------------------------------------------ per batch

    def backward(self, loss: torch.Tensor, context: Any, backward_kwargs: Dict[str, Any]) -> None:
        """``context.backward(loss, **backward_kwargs)``."""
        loss.backward(**backward_kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer, context: Any) -> None:
        """Make ``optimizer``'s gradients true-scale before they are averaged and clipped."""

    def step(self, optimizer: torch.optim.Optimizer, context: Any, scaler: Any) -> None:
        """Step ``optimizer``; through ``scaler`` when the trial passed one to ``step_optimizer``."""
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()

    def batch_end(self, context: Any) -> None:
        """After ``train_batch`` (a loss scale's update, say)."""

    # ------------------------------------------------------------------ state

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint keeps (tensors and plain values; ``torch.load(weights_only=True)``)."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


#: The precision of a run no plugin gives one.
FLOAT32 = Precision()


class PrecisionPlugin:
    """A plugin that provides one precision: made by :meth:`make` when the run is configured,
    the run's answer to ``hookdet_make_precision``, its state kept in checkpoints under the
    plugin's name. A subclass writes :meth:`make` (and its options); ``amp`` and ``apex`` are two."""

    #: The run's precision, once the run is configured.
    precision: Optional[Precision] = None

    def make(self, run: "Run") -> Precision:
        """The precision for ``run``."""
        raise NotImplementedError

    #: State given before the precision was made, handed to it when it is.
    pending_state: Optional[Dict[str, Any]] = None

    @hookimpl
    def hookdet_configure(self, run: "Run") -> None:
        """Make the precision (and give it any state loaded before)."""
        self.precision = self.make(run)
        if self.pending_state:
            self.precision.load_state_dict(self.pending_state)
        self.pending_state = None

    @hookimpl
    def hookdet_make_precision(self, run: "Run") -> Optional[Precision]:
        """The run's precision."""
        return self.precision

    def state_dict(self) -> Dict[str, Any]:
        """The precision's state (before it is made: the state it will be given)."""
        if self.precision is None:
            return dict(self.pending_state or {})
        return self.precision.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the precision's state (kept for it until it is made)."""
        if self.precision is None:
            self.pending_state = dict(state)
        else:
            self.precision.load_state_dict(state)


def precision_of(run: "Run") -> Precision:
    """The run's precision: the one plugin's answer to ``hookdet_make_precision``, else float32."""
    answer = run.plugins.one_answer(PRECISION_HOOK, what="the run's precision", run=run)
    return FLOAT32 if answer is None else answer


def precision_for_call(run: "Run", call: str) -> Precision:
    """The precision that answers the trial's ``call`` (``"use_amp"``, ...): the run's, after
    loading the built-in that answers it while the run is in float32 (the plugin manager knows
    which: :data:`hookdet.plugins.selection.PRECISION_FOR_CALL`)."""
    precision = precision_of(run)
    if precision is FLOAT32:
        run.plugins.load_precision_for(call)
        precision = precision_of(run)
    return precision
