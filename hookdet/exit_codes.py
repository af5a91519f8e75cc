"""Exit statuses ``hookdet run`` gives besides 0 (completed) and 2 (bad input)."""

#: The run was preempted (SIGTERM, SIGINT): it checkpointed and stopped; resume it. 75 is
#: ``EX_TEMPFAIL``: try again later.
PREEMPTED_EXIT_CODE = 75
