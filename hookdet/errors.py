"""Errors a trial raises to tell the run something (Determined's ``det.InvalidHP``)."""


class InvalidHP(Exception):
    """Raised by a trial (in ``__init__``, ``train_batch`` or ``evaluate_batch``) whose
    hyperparameters cannot work. ``hookdet run`` exits with :data:`INVALID_HP_EXIT_CODE`; a
    random or ASHA search discards the trial and samples a replacement, a grid search does not
    (its point is simply skipped), as Determined does."""


#: ``hookdet run``'s exit status when the trial raised :class:`InvalidHP`.
INVALID_HP_EXIT_CODE = 76
