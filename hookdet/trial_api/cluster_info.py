"""``hookdet.get_cluster_info()``: what Determined's ``det.get_cluster_info()`` tells a script.

On a Determined cluster a training script learns its hyperparameters, trial id and seed and the
checkpoint to continue from through ``det.get_cluster_info()``; run outside a cluster it gets
``None`` and takes its local branch. hookdet keeps that contract: a script run bare (``python3
train.py``, ``torchrun ... train.py``) gets ``None``; a script ``hookdet run`` starts gets a
:class:`ClusterInfo` describing the local run, read from the JSON file ``$HOOKDET_CLUSTER_INFO``
names (written into the run directory by :mod:`hookdet.cli.script_entrypoint`). ``hookdet run`` on a
``module:Class`` entrypoint sets the same information in-process (:func:`activated`).

The attribute names are Determined's (``info.trial.hparams``, ``info.trial.trial_id``,
``info.trial.trial_seed``, ``info.latest_checkpoint``, ``info.container_rank``, ...); values that
only a cluster has (master URL, session token) are local stand-ins. hookdet adds ``run_dir``, the
directory the run writes to, and ``test_mode`` (``hookdet run --test-mode``: a script's
``Trainer.fit`` then runs as with ``test_mode=True``). :func:`record_outcome` lets ``hookdet
run`` learn how the script's training ended (completed or preempted) so it can exit 75 after a
preemption.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from hookdet.launch import outcome

#: The environment variable naming the cluster-info JSON file of a script started by hookdet run.
CLUSTER_INFO_ENV = "HOOKDET_CLUSTER_INFO"

#: ``ClusterInfo.master_url`` of a local run: there is no master.
LOCAL_MASTER_URL = "local://hookdet"


class TrialInfo:
    """The trial a script trains (Determined's ``det.TrialInfo``, same constructor)."""

    def __init__(
        self,
        trial_id: int,
        experiment_id: int,
        trial_seed: int,
        hparams: Dict[str, Any],
        config: Dict[str, Any],
        steps_completed: int,
        trial_run_id: int,
        debug: bool,
        inter_node_network_interface: Optional[str],
    ) -> None:
        #: The trial's id (1 for a run of one trial).
        self.trial_id = trial_id
        #: The experiment's id (1 locally).
        self.experiment_id = experiment_id
        #: The trial's seed, derived from ``reproducibility.experiment_seed`` as Determined does.
        self.trial_seed = trial_seed
        #: The trial's hyperparameter values.
        self.hparams = hparams
        # Private in Determined too: the experiment config is not a stable API for scripts.
        self._config = config
        self._steps_completed = steps_completed
        self._trial_run_id = trial_run_id
        self._debug = debug
        self._inter_node_network_interface = inter_node_network_interface

    @property
    def experiment_config(self) -> Dict[str, Any]:
        """hookdet's extra: the experiment file as a dict (Determined keeps it private, as
        ``_config``, because its shape is not a stable API; hookdet's ``pytorch.init`` reads it)."""
        return self._config

    def to_dict(self) -> Dict[str, Any]:
        """The constructor's arguments, as JSON-serialisable values."""
        return {name.lstrip("_"): value for name, value in vars(self).items()}


class ClusterInfo:
    """The running task, as Determined's ``det.ClusterInfo`` describes it (a local trial here)."""

    def __init__(
        self,
        master_url: str,
        cluster_id: str,
        agent_id: str,
        slot_ids: List[int],
        task_id: str,
        allocation_id: str,
        session_token: str,
        task_type: str,
        master_cert_name: Optional[str] = None,
        master_cert_file: Optional[str] = None,
        latest_checkpoint: Optional[str] = None,
        trial_info: Optional[TrialInfo] = None,
        container_addrs: Optional[List[str]] = None,
        container_rank: int = 0,
        container_slot_counts: Optional[List[int]] = None,
        gpu_uuids: Optional[List[str]] = None,
        run_dir: Optional[str] = None,
        test_mode: bool = False,
    ) -> None:
        self.master_url = master_url
        self.cluster_id = cluster_id
        self.agent_id = agent_id
        #: The slots (processes) this container trains with.
        self.slot_ids = list(slot_ids)
        self.task_id = task_id
        self.allocation_id = allocation_id
        self.session_token = session_token
        #: ``"TRIAL"`` for a training run.
        self.task_type = task_type
        self.master_cert_name = master_cert_name
        self.master_cert_file = master_cert_file
        #: hookdet's extra: the run directory (metrics, checkpoints, TensorBoard files).
        self.run_dir = run_dir
        #: hookdet's extra: ``hookdet run --test-mode`` was given.
        self.test_mode = test_mode
        self._latest_checkpoint = latest_checkpoint
        self._trial_info = trial_info
        self._container_addrs = list(container_addrs or ["127.0.0.1"])
        self._container_rank = container_rank
        self._container_slot_counts = list(container_slot_counts or [len(self.slot_ids)])
        self._gpu_uuids = list(gpu_uuids or [])

    @property
    def latest_checkpoint(self) -> Optional[str]:
        """The checkpoint to continue from (``hookdet run --resume``'s), else None."""
        return self._latest_checkpoint if self.task_type == "TRIAL" else None

    @property
    def trial(self) -> TrialInfo:
        """The :class:`TrialInfo` of the trial; a RuntimeError for a task that is not a trial."""
        if self.task_type != "TRIAL" or self._trial_info is None:
            raise RuntimeError(f"the .trial property needs task_type 'TRIAL', not {self.task_type!r}")
        return self._trial_info

    @property
    def user_data(self) -> Dict[str, Any]:
        """The experiment file's ``data`` section."""
        return dict(self.trial.experiment_config.get("data") or {}) if self.task_type == "TRIAL" else {}

    @property
    def container_addrs(self) -> List[str]:
        """The address of every container (machine) of the run, by rank."""
        return list(self._container_addrs)

    @property
    def container_rank(self) -> int:
        """This container's rank (0 on one machine)."""
        return self._container_rank

    @property
    def container_slot_counts(self) -> List[int]:
        """The slots of every container, by rank."""
        return list(self._container_slot_counts)

    @property
    def gpu_uuids(self) -> List[str]:
        """The GPUs given to this container (empty: hookdet does not partition GPUs)."""
        return list(self._gpu_uuids)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-serialisable form; :meth:`from_dict` reads it back."""
        values = {name.lstrip("_"): value for name, value in vars(self).items()}
        values["trial_info"] = None if self._trial_info is None else self._trial_info.to_dict()
        return values

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "ClusterInfo":
        """The inverse of :meth:`to_dict`."""
        values = dict(values)
        trial = values.pop("trial_info", None)
        return cls(trial_info=None if trial is None else TrialInfo(**trial), **values)


def local_cluster_info(
    config: Any,
    *,
    slots: int,
    hparams: Optional[Dict[str, Any]] = None,
    trial_id: Optional[int] = None,
    latest_checkpoint: Optional[str] = None,
    run_dir: Optional[Path] = None,
    test_mode: bool = False,
    node: Tuple[int, int] = (0, 1),
) -> ClusterInfo:
    """The :class:`ClusterInfo` of a local run of the experiment ``config`` (an ExperimentConfig);
    its trial id is ``trial_id``, else the search's number for the trial, else 1. ``node`` is
    (this machine's rank, the number of machines) when the ``slots`` are split across several,
    as Determined's containers are."""
    from hookdet.config import current_trial_id

    trial_id = current_trial_id() if trial_id is None else trial_id
    task_id = f"{Path(run_dir).name if run_dir else 'hookdet'}.{trial_id}"
    trial = TrialInfo(
        trial_id=trial_id,
        experiment_id=1,
        trial_seed=config.trial_seed(trial_id),
        hparams=dict(config.hyperparameters if hparams is None else hparams),
        config=config.to_dict(),
        steps_completed=0,
        trial_run_id=1,
        debug=False,
        inter_node_network_interface=None,
    )
    return ClusterInfo(
        master_url=LOCAL_MASTER_URL,
        cluster_id="hookdet-local",
        agent_id=socket.gethostname(),
        slot_ids=list(range(slots // node[1])),
        container_rank=node[0],
        container_slot_counts=[slots // node[1]] * node[1],
        task_id=task_id,
        allocation_id=f"{task_id}.1",
        session_token="",
        task_type="TRIAL",
        latest_checkpoint=latest_checkpoint,
        trial_info=trial,
        run_dir=None if run_dir is None else str(Path(run_dir).resolve()),
        test_mode=test_mode,
    )


def write_cluster_info(info: ClusterInfo, path: Path) -> Path:
    """Write ``info`` where :func:`get_cluster_info` in a child process will read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info.to_dict(), indent=2, sort_keys=True))
    return path


_active: Optional[ClusterInfo] = None
_read: Dict[str, ClusterInfo] = {}


@contextlib.contextmanager
def activated(info: ClusterInfo) -> Iterator[ClusterInfo]:
    """Make :func:`get_cluster_info` return ``info`` in this process while the block runs."""
    global _active
    previous, _active = _active, info
    try:
        yield info
    finally:
        _active = previous


def get_cluster_info() -> Optional[ClusterInfo]:
    """The :class:`ClusterInfo` of the run ``hookdet run`` started this process for, or None
    when the process runs bare (Determined's ``det.get_cluster_info()``)."""
    if _active is not None:
        return _active
    path = os.environ.get(CLUSTER_INFO_ENV)
    if not path:
        return None
    if path not in _read:
        try:
            _read[path] = ClusterInfo.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError) as error:
            raise RuntimeError(f"${CLUSTER_INFO_ENV}={path}: unreadable cluster info: {error}") from error
    return _read[path]


def report_hookdet_errors_in_one_line() -> None:
    """In a script ``hookdet run`` started: an uncaught hookdet error (bad input, a checkpoint
    that does not fit) ends the script with the one line a trial class's run prints
    (``hookdet: error: ...``), not a traceback through hookdet's loop and pluggy. Other
    exceptions keep Python's traceback. Nothing changes for a script run bare."""
    if not os.environ.get(CLUSTER_INFO_ENV) or getattr(sys.excepthook, "hookdet_one_line", False):
        return
    previous = sys.excepthook

    def one_line(kind: type, error: BaseException, traceback: Any) -> None:
        from hookdet.errors import HookdetError

        if isinstance(error, HookdetError):
            print(f"hookdet: error: {error}", file=sys.stderr, flush=True)
        else:
            previous(kind, error, traceback)

    one_line.hookdet_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = one_line


def outcome_path(info: ClusterInfo, rank: int) -> Optional[Path]:
    """Where rank ``rank`` of a script run records how its training ended (None: not recorded):
    ``rank-<N>.json`` beside the cluster info, in the launch's records directory."""
    path = os.environ.get(CLUSTER_INFO_ENV)
    if _active is info or not path:
        return None
    return outcome.rank_path(Path(path).parent, rank)


def record_outcome(run: Any) -> None:
    """Under ``hookdet run``, the outcome record of a script's rank (:mod:`hookdet.launch.outcome`):
    how its training ended and the checkpoint it left, so the launcher can exit 75 when the
    script stopped for a signal; nothing when run bare. The script's exit status is not known
    here (it goes on): its launcher has it."""
    info = get_cluster_info()
    trained = outcome.training()
    if info is None or run.distributed is None or trained is None:
        return
    path = outcome_path(info, run.distributed.rank)
    if path is not None:
        outcome.write(path, outcome.Outcome(state=trained.state, rank=run.distributed.rank, pid=os.getpid(),
                                            checkpoint=trained.checkpoint, batches=trained.batches))
