"""``core_context.checkpoint``: a Core API script's checkpoints, in the run's storage.

A Core API checkpoint holds whatever files the script writes (``store_path``) or names
(``upload``); hookdet moves and verifies them and the script loads them. It is a hookdet
checkpoint like a trial class's: built in the storage's staging place and published at once
(:meth:`~hookdet.checkpoints.storage.CheckpointStorage.store_path`), sealed by ``metadata.json``
written last with the size and checksum of every file (:mod:`hookdet.checkpoints.format`),
noted in the run directory while it is written and in the user's checkpoint index once it is
complete, so ``--resume``, ``hookdet checkpoints`` and the resolver find it by id or by run.

The script's metadata lives in ``metadata.json`` beside the seal's own keys; the seal lists
which keys are the script's (``user_metadata``) and :meth:`CheckpointContext.get_metadata`
returns exactly those. A script key that is one of the seal's is refused by name, and, as on a
cluster, the metadata must hold ``steps_completed``. Retention is the trial class's
(``save_trial_latest``, ``save_trial_best``, :mod:`hookdet.checkpoints.retention`); a
checkpoint's metric is the ``searcher.metric`` of the validation reported at its
``steps_completed``.

Sharded stores (``shard=True``, every rank calls): each rank writes into a directory of its
own, the ranks' file lists and metadata are merged on the chief, a file two ranks wrote (or a
metadata key they gave different values) refuses the whole checkpoint naming the ranks, and the
chief publishes the union. Files reach the chief through the distributed context's ``gather``,
so they need no shared file system.
"""
from __future__ import annotations

import contextlib
import enum
import logging
import os
import shutil
import tempfile
import uuid as uuid_module
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import user_index
from hookdet.checkpoints.resolver import locate
from hookdet.checkpoints.retention import checkpoints_to_delete
from hookdet.checkpoints.storage import METADATA_FILE, CheckpointNotFoundError, StorageError
from hookdet.runs.lock import noting_the_write
from hookdet.trial_api.cluster_info import get_cluster_info

logger = logging.getLogger("hookdet")

#: The metadata key listing which of ``metadata.json``'s keys are the script's.
USER_KEYS = "user_metadata"
#: Keys the seal writes into ``metadata.json`` (a script's metadata may not use them).
SEAL_KEYS = frozenset({
    "format_version", "files", "created", fmt.METADATA_DIGEST_KEY, "versions", "uuid", "run_id", "hparams",
    "experiment_config", "searcher_metric", "validation_metric", "num_ranks", "core_api", USER_KEYS,
})


class DownloadMode(enum.Enum):
    """How ranks on one machine share a download (Determined's names and values)."""

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


class CheckpointContext:
    """Determined's ``CheckpointContext`` over a hookdet run's storage (``core_context.checkpoint``)."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self._dist = run.distributed
        #: This run's checkpoints that retention tracks: ``(id, steps, metric)``, oldest first.
        self._saved: Optional[List[Tuple[str, int, Optional[float]]]] = None

    # ------------------------------------------------------------------ storing

    def store_path(self, metadata: Optional[Dict[str, Any]] = None, *,
                   shard: bool = False) -> contextlib.AbstractContextManager[Tuple[Path, str]]:
        """A directory to write the checkpoint's files into, and its storage id; the checkpoint
        is sealed and published when the block ends (nothing is, if it raises). Only the chief
        may call it with ``shard=False``; with ``shard=True`` every rank must."""
        if not shard and self._dist.rank != 0:
            raise RuntimeError("cannot call CheckpointContext.store_path(shard=False) from non-chief worker "
                               f"(rank={self._dist.rank})")
        return self._stored(_checked_metadata(metadata, "store_path", shard), shard)

    def upload(self, ckpt_dir: Union[str, os.PathLike, None], metadata: Optional[Dict[str, Any]] = None, *,
               shard: bool = False, selector: Optional[Callable[[str], bool]] = None) -> str:
        """Store the files of ``ckpt_dir`` (those ``selector`` accepts, by path relative to it)
        as a new checkpoint; its storage id. The directory's name is not kept."""
        if not shard:
            if self._dist.rank != 0:
                raise RuntimeError(f"cannot call .upload(shard=False) from non-chief worker (rank={self._dist.rank})")
            if ckpt_dir is None:
                raise RuntimeError("cannot call .upload(ckpt_dir=None, shard=False), which would result in doing "
                                   "nothing at all")
        if selector is not None and ckpt_dir is None:
            raise RuntimeError("ckpt_dir has to be provided if selector is not None")
        uploads = ckpt_dir is not None if not shard else self._lowest_rank_with(ckpt_dir)
        with self._stored(_checked_metadata(metadata, "upload", shard), shard) as (directory, storage_id):
            if uploads:
                _copy_files(Path(ckpt_dir), directory, selector)
        return storage_id

    def _lowest_rank_with(self, ckpt_dir: Union[str, os.PathLike, None]) -> bool:
        """Whether this rank uploads ``ckpt_dir``: it has one, and is the lowest of the ranks
        uploading the same directory (ranks of one machine sharing an output folder, as a Hugging
        Face Trainer's do), so a shared folder is no conflict, as in Determined (collective)."""
        import socket

        mine = None
        if ckpt_dir is not None:
            status = Path(ckpt_dir).stat()
            mine = (socket.gethostname(), status.st_dev, status.st_ino)
        gathered = self._dist.allgather(mine)
        return mine is not None and gathered.index(mine) == self._dist.rank

    @contextlib.contextmanager
    def _stored(self, user: Dict[str, Any], shard: bool) -> Iterator[Tuple[Path, str]]:
        chief = self._dist.rank == 0
        storage_id = str(uuid_module.uuid4()) if chief else None
        if shard:
            storage_id = self._dist.broadcast(storage_id)
        if not shard:
            with self._published(storage_id, user) as directory:
                yield directory, storage_id
            return
        own = Path(tempfile.mkdtemp(prefix=f"hookdet-shard-{self._dist.rank}-"))
        try:
            yield own, storage_id
            shards = self._dist.gather((_read_files(own), user))
        finally:
            shutil.rmtree(own, ignore_errors=True)
        problem = _shard_problem(shards) if chief else None
        problem = self._dist.broadcast(problem)
        if problem:
            raise RuntimeError(problem)
        if chief:
            merged = {key: value for _files, metadata in shards for key, value in metadata.items()}
            with self._published(storage_id, merged) as directory:
                for files, _metadata in shards:
                    _write_files(directory, files)
        self._dist.barrier()

    @contextlib.contextmanager
    def _published(self, storage_id: str, user: Dict[str, Any]) -> Iterator[Path]:
        """The storage's staging directory for ``storage_id``; sealed with ``user``'s metadata
        and published after the block, then indexed, tracked and retention applied."""
        run = self._run
        steps = int(user["steps_completed"])
        metric = _validation_metric_at(run.state, steps)
        with noting_the_write(run.run_dir, storage_id), run.storage.store_path(storage_id) as directory:
            directory = Path(directory)
            yield directory
            fmt.write_metadata(directory, dict(
                user, **fmt.base_metadata(
                    uuid=storage_id, run_id=run.run_id, hparams=run.hparams, experiment_config=run.config.to_dict(),
                    searcher_metric=run.config.searcher.metric, validation_metric=metric,
                    num_ranks=self._dist.size, core_api=True, **{USER_KEYS: sorted(user)},
                )))
        user_index.record(storage_id, run.storage.locator(), run.run_dir)
        run.state.latest_checkpoint = storage_id
        run.state.last_checkpoint_batch = steps
        logger.info("checkpoint %s saved at steps_completed=%d: %s", storage_id, steps,
                    run.storage.location(storage_id))
        self._tracked().append((storage_id, steps, metric))
        self.apply_retention(final=False)

    # ------------------------------------------------------------------ reading

    @contextlib.contextmanager
    def restore_path(self, storage_id: str, download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
                     *, selector: Optional[Callable[[str], bool]] = None) -> Iterator[Path]:
        """A local directory holding the checkpoint's files, verified against its seal: a
        storage id, a checkpoint directory or a run directory (its newest intact checkpoint).
        Read-only; a fetched copy is removed after the block."""
        DownloadMode(download_mode)
        where, found_id = self._located(storage_id)
        if found_id is None:
            fmt.verify(where)
            yield Path(where)
            return
        try:
            with where.restore_path(found_id) as directory:
                fmt.verify(Path(directory))
                yield Path(directory)
        except CheckpointNotFoundError:
            raise self._not_found(str(storage_id), where) from None
        except StorageError as error:
            raise fmt.CheckpointError(f"cannot read checkpoint {storage_id!r}: {error}") from error

    def download(self, storage_id: str, ckpt_dir: Union[str, os.PathLike],
                 download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                 selector: Optional[Callable[[str], bool]] = None) -> None:
        """Copy the checkpoint's files (those ``selector`` accepts) into ``ckpt_dir``, made if
        it does not exist."""
        with self.restore_path(storage_id, download_mode) as directory:
            Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
            _copy_files(directory, Path(ckpt_dir), selector)

    def get_metadata(self, storage_id: str) -> Dict[str, Any]:
        """The metadata the script stored with the checkpoint, exactly (none of the seal's)."""
        where, found_id = self._located(storage_id)
        try:
            metadata = fmt.read_metadata(where) if found_id is None else where.read_metadata(found_id)
        except CheckpointNotFoundError:
            raise self._not_found(str(storage_id), where) from None
        keys = metadata.get(USER_KEYS)
        if not isinstance(keys, list):  # a trial class's checkpoint: what is not the seal's
            keys = [key for key in metadata if key not in SEAL_KEYS and key not in ("trial_class",)]
        return {key: metadata[key] for key in keys if key in metadata}

    def delete(self, storage_id: str) -> None:
        """Delete a checkpoint of this run's storage (and forget it in the user's index)."""
        try:
            self._run.storage.delete(storage_id)
        except CheckpointNotFoundError:
            raise self._not_found(storage_id, self._run.storage) from None
        user_index.forget(storage_id, deleted_by="core_context.checkpoint.delete", run_dir=self._run.run_dir)
        if self._saved is not None:
            self._saved = [entry for entry in self._saved if entry[0] != storage_id]
        logger.info("deleted checkpoint %s", storage_id)

    def _located(self, storage_id: str) -> Tuple[Any, Optional[str]]:
        if not isinstance(storage_id, (str, os.PathLike)) or not str(storage_id):
            raise TypeError(f"a checkpoint's storage id is a string, not {storage_id!r}")
        return locate(str(storage_id), self._run.storage, "read")

    def _not_found(self, storage_id: str, storage: Any) -> fmt.CheckpointError:
        return fmt.CheckpointError(
            f"no checkpoint {storage_id!r}: it is not in {storage.describe()} (this run's storage), nor a "
            f"directory, nor in this user's checkpoint index ({user_index.index_dir()})"
        )

    # ------------------------------------------------------------------ retention

    def _tracked(self) -> List[Tuple[str, int, Optional[float]]]:
        """This run's checkpoints in its storage (read once: a resumed run keeps tracking the
        ones it wrote before)."""
        if self._saved is None:
            run = self._run
            self._saved = []
            for storage_id, metadata in run.storage.list():
                if metadata.get("run_id") == run.run_id and metadata.get("core_api"):
                    self._saved.append((storage_id, int(metadata.get("steps_completed") or 0),
                                        metadata.get("validation_metric")))
            self._saved.sort(key=lambda entry: entry[1])
        return self._saved

    def apply_retention(self, final: bool) -> None:
        """Delete the checkpoints retention no longer keeps (the chief; ``final`` when the
        script completed: the newest is then no longer protected)."""
        run = self._run
        spec = run.config.checkpoint_storage
        if not run.is_chief or (spec is None and get_cluster_info() is None):
            return  # run bare with no retention configured: every checkpoint is kept, as Determined does
        keep_latest = spec.save_trial_latest if spec is not None else 1
        keep_best = max(spec.save_trial_best, spec.save_experiment_best) if spec is not None else 1
        saved = self._tracked()
        for storage_id in checkpoints_to_delete(saved, keep_latest, keep_best, run.config.searcher.smaller_is_better,
                                                protect_newest=not final):
            try:
                run.storage.delete(storage_id)
            except CheckpointNotFoundError:
                pass
            except Exception as error:  # noqa: BLE001 - a failed delete never stops training; retried later
                logger.warning("could not delete checkpoint %s: %s", storage_id, error)
                continue
            user_index.forget(storage_id, deleted_by=f"retention (save_trial_latest: {keep_latest}, "
                                                     f"save_trial_best: {keep_best})", run_dir=run.run_dir)
            logger.info("retention deleted checkpoint %s", storage_id)
            self._saved = [entry for entry in self._tracked() if entry[0] != storage_id]


def _checked_metadata(metadata: Optional[Dict[str, Any]], method: str, shard: bool) -> Dict[str, Any]:
    """The script's metadata for a checkpoint, refused before anything is written when it
    lacks ``steps_completed`` (a shard's may: the ranks' merged metadata must hold it) or uses
    a key of the seal."""
    from hookdet.metrics.metric_values import check_metrics_serialisable

    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise TypeError(f"{method}: metadata must be a dict, not {type(metadata).__name__}")
    if "steps_completed" not in metadata and not shard:
        raise ValueError(_NO_STEPS.format(method=method))
    steps = metadata.get("steps_completed", 0)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"{method}: metadata's 'steps_completed' must be a whole number of batches, not {steps!r}")
    taken = sorted(SEAL_KEYS & set(metadata))
    if taken:
        raise ValueError(f"{method}: metadata key(s) {', '.join(map(repr, taken))} are hookdet's own (the "
                         "checkpoint's seal writes them into metadata.json); rename them")
    return check_metrics_serialisable(metadata, f"{method} metadata")


#: Determined's words for a checkpoint's metadata without ``steps_completed``.
_NO_STEPS = ("{method}: metadata for reported checkpoints, in the current implementation, requires a "
             "'steps_completed' item, which has not been provided")


def _validation_metric_at(state: Any, steps: int) -> Optional[float]:
    """The searcher metric of the validation reported at ``steps`` batches, if there was one."""
    for entry in reversed(state.validation_history):
        if entry["batches"] == steps:
            value = entry["metric"]
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return None


def _copy_files(source: Path, target: Path, selector: Optional[Callable[[str], bool]]) -> None:
    """Copy every file under ``source`` that ``selector`` accepts (by relative path) into ``target``."""
    if not source.is_dir():
        raise FileNotFoundError(f"checkpoint directory {source} does not exist")
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        if path.is_dir() or (selector is not None and not selector(relative)):
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


def _read_files(directory: Path) -> Dict[str, bytes]:
    """Every file under ``directory``, by relative path (a rank's shard, sent to the chief)."""
    return {path.relative_to(directory).as_posix(): path.read_bytes()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def _write_files(directory: Path, files: Dict[str, bytes]) -> None:
    for relative, content in files.items():
        destination = directory / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(content)


def _shard_problem(shards: List[Tuple[Dict[str, bytes], Dict[str, Any]]]) -> Optional[str]:
    """Why the ranks' shards cannot be merged (a file written by several ranks, a metadata key
    given different values, no ``steps_completed`` from any rank), naming the ranks; None when
    they can."""
    if not any("steps_completed" in metadata for _files, metadata in shards):
        return _NO_STEPS.format(method="store_path(shard=True)")
    writers: Dict[str, List[int]] = {}
    for rank, (files, _metadata) in enumerate(shards):
        for relative in files:
            writers.setdefault(relative, []).append(rank)
    problems = [f"{name} written by ranks {ranks}" for name, ranks in sorted(writers.items())
                if len(ranks) > 1 and name != METADATA_FILE]
    values: Dict[str, Dict[int, Any]] = {}
    for rank, (_files, metadata) in enumerate(shards):
        for key, value in metadata.items():
            values.setdefault(key, {})[rank] = value
    problems += [f"metadata {key!r} given different values by ranks {sorted(by_rank)}"
                 for key, by_rank in sorted(values.items()) if len({repr(v) for v in by_rank.values()}) > 1]
    if not problems:
        return None
    return "refusing to store a sharded checkpoint with conflicts: " + "; ".join(problems)
