"""``context.configure_apex_amp``: apex's opt levels, on NVIDIA apex when it runs, else on torch.amp.

Determined hands ``configure_apex_amp`` straight to ``apex.amp.initialize`` and refuses to run
without CUDA. hookdet uses NVIDIA apex when it imports and CUDA is present; everywhere else
(every CPU machine, any box without apex) it runs the same opt levels on PyTorch's own mixed
precision, so a Determined trial calling ``configure_apex_amp`` runs unmodified:

* **O0** — float32: the model is checked/cast to float32, inputs cast to float32.
* **O1** — the forward runs under ``torch.autocast`` (apex patches torch functions instead);
  outputs in reduced precision come back as float32, so the loss runs in float32 as apex's
  float32 function list would make it. Dynamic loss scaling.
* **O2** — the model is cast to half precision except batch norm (kept float32), inputs are cast
  to half and outputs to float32; each optimizer holds float32 master weights, and the model is
  refreshed from them after every step. Dynamic loss scaling.
* **O3** — the whole model in half precision; loss scale 1.

Half precision is float16 on CUDA and bfloat16 elsewhere (``plugin_config.apex.dtype`` chooses;
an explicit ``cast_model_type`` is honoured as given). The keyword overrides behave as apex's:
the opt level sets defaults, any argument that is not None overrides it, and the combinations
apex refuses are refused here with one error naming the argument.

Loss scaling follows apex's ``LossScaler``: dynamic scales start at ``min(2**16,
max_loss_scale)``, halve on an overflow (never below ``min_loss_scale``) and skip that step, and
double after 2000 clean backward passes (never above ``max_loss_scale``); a fixed ``loss_scale``
never changes and never skips. Gradients are unscaled after each backward pass, so with
``num_losses > 1`` each loss keeps its own scale. As in Determined, the n-th distinct loss passed
to ``context.backward`` within a batch is loss id n; with ``num_losses=1`` every loss shares one
scale (apex's documented behaviour; Determined 0.38 raises on a second backward instead).

Deciding whether to skip a step reads one flag from the device per optimizer step, as apex and
``GradScaler`` do; nothing else here waits on the device per batch. Scales, growth counters and
master weights are checkpointed through the plugin's state, so resuming is bitwise exact.

Split along its seams: :mod:`.options` (settings, the opt-level table, argument checks),
:mod:`.backends` (NVIDIA apex and the torch.amp emulation, model casting) and :mod:`.plugin`
(the plugin class and its hooks).
"""
from .options import NAME
from .plugin import ApexPlugin

__all__ = ["NAME", "ApexPlugin"]
