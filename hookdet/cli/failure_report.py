"""What ``hookdet run`` prints when training raises something that is not a :class:`HookdetError`.

* **User code raised** (a frame of the trial, its model or its data is in the traceback): the
  traceback from the first such frame on — what the user's code did and everything it called —
  without hookdet's and pluggy's frames above it, then one ``hookdet:`` line naming the error.
* **A rank lost its peers** (a collective failed because another rank died or closed its
  connection): one line, no traceback; the launcher names the rank that died.
* **Anything else** is a hookdet bug, and its whole traceback is what a bug report needs.

Under the multi-process launcher each rank also leaves its one line for the launcher, which
prints one line per distinct failure naming the ranks (:mod:`hookdet.distributed.launcher`).
"""
from __future__ import annotations

import traceback
from typing import List, Optional

from hookdet.plugins.monitor import is_user_frame

#: Words in a collective's error when the other side of the connection went away.
_PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "connection closed", "Socket closed", "ECONNRESET", "EPIPE")


def user_traceback(error: BaseException) -> Optional[str]:
    """``error``'s traceback from the first frame of user code on; None when no frame is the
    user's (then the whole traceback is hookdet's to show)."""
    tb = error.__traceback__
    while tb is not None and not is_user_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is None:
        return None
    lines: List[str] = ["Traceback (most recent call last, hookdet's frames left out):\n"]
    lines += traceback.format_list(traceback.extract_tb(tb))
    lines += traceback.format_exception_only(type(error), error)
    return "".join(lines)


def peer_loss(error: BaseException) -> Optional[str]:
    """When ``error`` is a collective that failed because another rank went away, what the
    backend said of it (``Connection closed by peer``); else None."""
    import torch.distributed as dist

    text = str(error)
    backend_error = getattr(dist, "DistBackendError", ())
    if not (isinstance(error, backend_error) or (
        isinstance(error, RuntimeError) and ("gloo" in text.lower() or "nccl" in text.lower())
    )):
        return None
    return next((words for words in _PEER_LOSS if words.lower() in text.lower()), None)


def one_line(error: BaseException) -> str:
    """``Type: message``, on one line."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
