"""The ``hookdet`` command line, top layer.

``commands`` (``hookdet run``, ``plugins``, ``export``, ``runs``/``show``/``compare``/``plot``),
``script_entrypoint`` (a Trainer-API script as ``entrypoint``) and ``failure_report`` (what a
failed run prints). ``hookdet search`` lives in :mod:`hookdet.search.cli`.
"""
