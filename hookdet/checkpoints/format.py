"""The checkpoint directory: how it is written, verified and read.

A checkpoint is a directory holding ``state_dict.pth`` (Determined's file name and keys) and any
files plugins or callbacks add, plus ``metadata.json``, written last, with a manifest (size and
checksum of every other file) and a sha256 digest of the metadata itself. A directory without
``metadata.json``, or whose files or metadata disagree with their checksums, is not a
checkpoint: nothing in it is ever loaded.

``state_dict.pth`` loads with ``torch.load(weights_only=True)``: it holds tensors and plain
Python values only, and :func:`check_weights_only` refuses anything else *before* a byte is
written, naming where the offending value sits.

Why XXH3-128. The manifest exists to catch damage: torn or truncated writes, flipped bits, a
file from another checkpoint. A fast non-cryptographic 128-bit checksum (xxHash's XXH3-128, from
the ``xxhash`` package) does that at memory speed (about 25 GB/s on one core here), where sha256
ran at about 1 GB/s. A cryptographic digest would not make a hostile checkpoint harmless anyway
— whoever can rewrite a file can rewrite an unsigned manifest too; refusing to unpickle anything
but tensors (``weights_only``) is what does that. Checkpoints of format 3 and older (a sha256 per
64 MiB slice) still verify and load.

Speed. The state file is checksummed as ``torch.save`` writes it, so sealing never reads it
back. Loading maps the file (``mmap``): the checksum runs over the mapped page cache, with no
copy, and ``torch.load(mmap=True, weights_only=True)`` then builds tensors on the same pages, so
the bytes are neither copied nor read twice before they are known intact. Tensors loaded so stay
backed by the file, copy-on-write: applying them (``load_state_dict``) copies what it copies, and
a tensor kept as loaded (an optimizer's state on CPU) gets private pages on its first write.
``benchmarks/checkpoint_io.py`` measures both against a bare ``torch.save``/``torch.load``.
torch is imported only where a state is checked, written or loaded (``runs`` starts ~1 s sooner).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import mmap
import platform
import os
import pickle
import re
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import xxhash

from hookdet.checkpoints import determined_format
from hookdet.checkpoints.storage import (METADATA_FILE, STATE_FILE, MalformedMetadataError, is_inside, parse_metadata,
                                         read_small_file)
from hookdet.errors import PluginError

logger = logging.getLogger("hookdet")

#: 4: an XXH3-128 of every file (``xxh3_128``), plus the metadata's own sha256 (``metadata_sha256``).
#: 3: a sha256 per 64 MiB slice of every file (still verified on load).
FORMAT_VERSION = 4
#: The manifest key of a file's checksum in the current format.
CHECKSUM_KEY = "xxh3_128"
METADATA_DIGEST_KEY = "metadata_sha256"

_READ_CHUNK = 1 << 22

#: Format 3's manifest held one sha256 per slice of this many bytes.
CHUNK_BYTES = 1 << 26


class CheckpointError(PluginError):
    """A checkpoint is missing, corrupt, incomplete or belongs to another trial.

    The message is the whole diagnosis (which checkpoint, what is wrong, what to use instead).
    It is a :class:`~hookdet.plugins.manager.PluginError` so that, raised from the checkpoint
    plugin's hooks, it reaches the user as it is rather than wrapped in "plugin failed in hook".
    """


class CheckpointMismatchError(CheckpointError, RuntimeError):
    """A checkpoint does not fit the trial resuming it (another shape, another number of models,
    optimizers or schedulers). Also a ``RuntimeError``: Determined raises one there (torch's
    ``load_state_dict`` does), so code catching that still does."""


# ---------------------------------------------------------------------------------------------
# What a checkpoint may hold
# ---------------------------------------------------------------------------------------------

_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray)


def check_weights_only(obj: Any, where: str = "checkpoint") -> None:
    """Raise CheckpointError unless ``obj`` loads with ``torch.load(weights_only=True)``.

    Allowed: tensors and parameters, ``None``/bool/int/float/complex/str/bytes, torch dtypes,
    devices, layouts and ``torch.Size``; lists, tuples, sets, dicts and OrderedDicts of those.
    Anything else (a NumPy array, a namedtuple, a user object) would need unpickling arbitrary
    code to load, so the message names the path to it (``callbacks['timer']['start']``) and
    how to fix it. Checked before writing so a bad value costs no half-written checkpoint.
    """
    import torch

    torch_leaves = (torch.dtype, torch.device, torch.layout)
    stack: List[Tuple[Any, str]] = [(obj, where)]
    while stack:
        value, path = stack.pop()
        kind = type(value)
        if kind in _PLAIN_LEAVES or isinstance(value, torch_leaves):
            continue
        if isinstance(value, torch.Tensor):
            if kind not in (torch.Tensor, torch.nn.Parameter):
                raise CheckpointError(
                    f"{path} is a {kind.__module__}.{kind.__qualname__} (a tensor subclass); "
                    "checkpoints hold plain tensors only: store value.as_subclass(torch.Tensor)"
                )
            continue
        if kind is torch.Size:
            continue
        if kind in (list, tuple, set):
            stack.extend((item, f"{path}[{index}]") for index, item in enumerate(value))
            continue
        if kind is dict or kind.__module__ == "collections" and kind.__qualname__ == "OrderedDict":
            for key, item in value.items():
                if type(key) not in _PLAIN_LEAVES and type(key) is not tuple:
                    raise CheckpointError(
                        f"{path} has a key of type {type(key).__qualname__} ({key!r}); "
                        "checkpoint dict keys must be str, int, float, bool, None or tuples"
                    )
                stack.append((item, f"{path}[{key!r}]"))
            continue
        raise CheckpointError(
            f"{path} is a {kind.__module__}.{kind.__qualname__}, which "
            "torch.load(weights_only=True) cannot load: checkpoints hold only tensors and plain "
            "Python values (convert NumPy arrays with torch.from_numpy or .tolist(), objects "
            "to dicts)"
        )


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def checksums_of(path: Path, chunk_bytes: Optional[int] = None) -> List[str]:
    """The sha256 (hex) of each ``chunk_bytes`` slice (default :data:`CHUNK_BYTES`) of a file,
    in order: format 3's manifest, still verified when an older checkpoint is loaded.

    The slices are hashed in parallel, one thread per core (hashlib releases the GIL), so
    verifying a large checkpoint takes a fraction of one sequential pass. An empty file has one
    (empty) slice.
    """
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    size = os.path.getsize(path)
    count = max(1, -(-size // chunk_bytes))

    def checksum_slice(index: int) -> str:
        digest, remaining = hashlib.sha256(), min(chunk_bytes, size - index * chunk_bytes)
        buffer = bytearray(min(_READ_CHUNK, max(remaining, 1)))
        view = memoryview(buffer)
        with open(path, "rb", buffering=0) as handle:
            handle.seek(index * chunk_bytes)
            while remaining > 0:
                got = handle.readinto(view[: min(len(buffer), remaining)])
                if not got:
                    break  # shorter than its size said: the size check reports it
                digest.update(view[:got])
                remaining -= got
        return digest.hexdigest()

    if count == 1:
        return [checksum_slice(0)]
    workers = min(count, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="hookdet-sha256") as pool:
        return list(pool.map(checksum_slice, range(count)))


def xxh3_of(path: Path) -> str:
    """The XXH3-128 (hex) of a file, read through a memory map (no copy out of the page cache)."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size:
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                digest.update(mapped)
    return digest.hexdigest()


def manifest_entry(path: Path) -> Dict[str, Any]:
    """The manifest entry of a file: its size and its XXH3-128."""
    return {"size": Path(path).stat().st_size, CHECKSUM_KEY: xxh3_of(path)}


class _ChecksummingWriter:
    """A write-only file object that checksums what passes through it on its way to the file.

    ``torch.save`` hands each record to ``write`` as a memoryview; checksumming it there means
    sealing the checkpoint never has to read the file back.
    """

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._digest = xxhash.xxh3_128()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self._handle.write(view)
        self._digest.update(view)
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._handle.flush()

    def entry(self) -> Dict[str, Any]:
        """The manifest entry of what was written."""
        return {"size": self.size, CHECKSUM_KEY: self._digest.hexdigest()}


def write_state(directory: Path, state: Dict[str, Any]) -> Dict[str, Any]:
    """Write ``state`` as ``state_dict.pth`` in ``directory``; return its manifest entry.

    The checksum is computed while writing, so sealing the checkpoint never re-reads the file.
    """
    import torch

    check_weights_only(state, "checkpoint")
    path = Path(directory) / STATE_FILE
    with open(path, "wb") as handle:
        writer = _ChecksummingWriter(handle)
        torch.save(state, writer)
    return writer.entry()


def _json_normal(metadata: Dict[str, Any]) -> Dict[str, Any]:
    """``metadata`` as it reads back from JSON (non-JSON values become strings)."""
    return json.loads(json.dumps(metadata, default=str))


def metadata_digest(metadata: Dict[str, Any]) -> str:
    """The sha256 of ``metadata`` (without its own digest) in a canonical JSON form."""
    body = {key: value for key, value in metadata.items() if key != METADATA_DIGEST_KEY}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def write_metadata(
    directory: Path,
    metadata: Dict[str, Any],
    known_files: Optional[Dict[str, Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """Seal ``directory``: add the manifest of every file to ``metadata`` and write it last.

    ``known_files`` maps relative paths to manifest entries already computed (the state file's,
    from :func:`write_state`); an entry is trusted only if the file still has that size. Every
    other file (added by ``on_checkpoint_write_end``) is hashed here.
    """
    directory = Path(directory)
    known_files = known_files or {}
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory).as_posix()
        if relative == METADATA_FILE:
            continue
        size = path.stat().st_size
        entry = known_files.get(relative)
        if entry is not None and entry["size"] == size:
            files[relative] = dict(entry)
        else:
            files[relative] = manifest_entry(path)
    sealed = _json_normal(
        dict(metadata, format_version=FORMAT_VERSION, files=files, created=time.time())
    )
    sealed[METADATA_DIGEST_KEY] = metadata_digest(sealed)
    # Durability (fsync, atomic publication) is the storage's job: it publishes the directory.
    (directory / METADATA_FILE).write_text(json.dumps(sealed, indent=2, sort_keys=True), encoding="utf-8")
    return sealed


def file_stats(directory: Path) -> Dict[str, Tuple[int, int]]:
    """``(size, mtime_ns)`` of every file under ``directory``, by path relative to it."""
    directory = Path(directory)
    stats = {}
    for path in directory.rglob("*"):
        if path.is_file():
            stat = path.stat()
            stats[path.relative_to(directory).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return stats


def reseal(directory: Path, before: Dict[str, Tuple[int, int]]) -> bool:
    """Bring the manifest of the sealed checkpoint ``directory`` up to date with its files.

    ``before`` is :func:`file_stats` taken when it was sealed; files added or changed since
    (by ``on_checkpoint_write_end``, which runs on the published checkpoint) are checksummed
    and flushed, files removed leave the manifest, and ``metadata.json`` is replaced atomically
    (written beside it, flushed, renamed over it), so a crash at any moment leaves a checkpoint
    that verifies. Returns whether anything changed.
    """
    directory = Path(directory)
    now = file_stats(directory)
    now.pop(METADATA_FILE, None)
    before = {relative: stat for relative, stat in before.items() if relative != METADATA_FILE}
    if now == before:
        return False
    metadata = read_metadata(directory)
    files = {relative: entry for relative, entry in metadata["files"].items() if relative in now}
    for relative, stat in now.items():
        if relative.startswith(".") or (relative in files and before.get(relative) == stat):
            continue
        path = directory / relative
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        files[relative] = manifest_entry(path)
    sealed = {key: value for key, value in metadata.items() if key != METADATA_DIGEST_KEY}
    sealed = _json_normal(dict(sealed, files=files))
    sealed[METADATA_DIGEST_KEY] = metadata_digest(sealed)
    staged = directory / f".{METADATA_FILE}.new"
    with open(staged, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(sealed, indent=2, sort_keys=True))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staged, directory / METADATA_FILE)
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return True


def base_metadata(**fields: Any) -> Dict[str, Any]:
    """Metadata common to every checkpoint: library versions and the given fields."""
    import torch

    import hookdet

    return dict(
        fields,
        versions={
            "hookdet": hookdet.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    )


# ---------------------------------------------------------------------------------------------
# Reading and verifying
# ---------------------------------------------------------------------------------------------


def read_metadata(directory: Path) -> Dict[str, Any]:
    """``metadata.json`` of ``directory``, checked against its own digest.

    CheckpointError when it is missing (the checkpoint was never completely written), not JSON,
    not hookdet's, or altered since it was written.
    """
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a complete checkpoint: it has no {METADATA_FILE} "
            "(its write was interrupted, or the file was removed)"
        )
    if not is_inside(path, directory):
        raise CheckpointError(f"checkpoint {directory}: {METADATA_FILE} leads out of the checkpoint (to "
                              f"{path.resolve()}, through a symlink); refused")
    try:
        metadata = parse_metadata(read_small_file(path), str(path))
    except OSError as error:
        raise CheckpointError(f"checkpoint {directory} is corrupt: {path} is unreadable: {error}") from error
    except MalformedMetadataError as error:
        raise CheckpointError(f"checkpoint {directory} is corrupt: {error}") from None
    if determined_format.written_by_determined(metadata):
        return _determined(determined_format.read_metadata, directory)
    problem = _manifest_problem(metadata)
    if problem is not None:
        raise CheckpointError(f"checkpoint {directory} is corrupt: {path} is not hookdet checkpoint metadata ({problem})")
    recorded = metadata.get(METADATA_DIGEST_KEY)
    if recorded is None and metadata.get("format_version", 0) >= 2:
        raise CheckpointError(f"checkpoint {directory} is corrupt: {path} lacks its digest")
    if recorded is not None and recorded != metadata_digest(metadata):
        raise CheckpointError(
            f"checkpoint {directory} is corrupt: {path} does not match its own digest "
            "(it was altered after it was written)"
        )
    return metadata


def _determined(read: Any, directory: Path, *args: Any) -> Any:
    """``read(directory, *args)`` of :mod:`.determined_format`, its refusals as CheckpointError."""
    try:
        return read(directory, *args)
    except (determined_format.DeterminedCheckpointError, MalformedMetadataError, OSError) as error:
        raise CheckpointError(f"Determined checkpoint {directory}: {error}") from None


def _manifest_problem(metadata: Dict[str, Any]) -> Optional[str]:
    """What makes ``metadata`` not a hookdet checkpoint's, or None: every value verification and
    lookup read has the type they expect, so a hand-edited file is refused, never a crash."""
    files = metadata.get("files")
    if not isinstance(files, dict):
        return "no file manifest"
    for relative, entry in files.items():
        if not isinstance(entry, dict) or type(entry.get("size")) is not int:
            return f"manifest entry {relative!r} has no size"
        checksum = entry.get(CHECKSUM_KEY, entry.get("sha256"))
        if not isinstance(checksum, (str, list)):
            return f"manifest entry {relative!r} has no checksum"
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            return f"manifest entry {relative!r} points outside the checkpoint"
    for key, kind in (("steps_completed", int), ("format_version", int), (METADATA_DIGEST_KEY, str)):
        if key in metadata and type(metadata[key]) is not kind:
            return f"{key} is a {type(metadata[key]).__name__}, not a {kind.__name__}"
    return None


def _check_size(directory: Path, relative: str, expected: Dict[str, Any]) -> Path:
    path = Path(directory) / relative
    if not is_inside(path, directory):
        raise CheckpointError(f"checkpoint {directory}: {relative} leads out of the checkpoint (to "
                              f"{path.resolve()}, through a symlink); refused")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {directory} is corrupt: {relative} is missing")
    size = path.stat().st_size
    if size != expected["size"]:
        raise CheckpointError(
            f"checkpoint {directory} is corrupt: {relative} has {size} bytes, "
            f"the manifest says {expected['size']} (truncated?)"
        )
    return path


def _check_file(directory: Path, relative: str, expected: Dict[str, Any]) -> None:
    path = _check_size(directory, relative, expected)
    if CHECKSUM_KEY in expected:
        algorithm, intact = CHECKSUM_KEY, xxh3_of(path) == expected[CHECKSUM_KEY]
    else:  # format 3 and older
        algorithm, intact = "sha256", checksums_of(path) == expected.get("sha256")
    if not intact:
        raise CheckpointError(f"checkpoint {directory} is corrupt: {relative} fails its {algorithm} check")


def verify(directory: Path, sizes_only: bool = False) -> Dict[str, Any]:
    """Check the metadata and every file against the manifest; return the metadata.

    Raises CheckpointError naming the first mismatch; ``sizes_only``: reads no file's contents.
    """
    directory = Path(directory)
    metadata = read_metadata(directory)
    for relative, expected in metadata.get("files", {}).items():  # Determined's have no manifest
        (_check_size if sizes_only else _check_file)(directory, relative, expected)
    return metadata


def load_state(directory: Path, map_location: Any = "cpu", **torch_load_kwargs: Any) -> Dict[str, Any]:
    """Verify ``directory`` and load its ``state_dict.pth`` with ``weights_only=True``.

    Every file is checked against the manifest first, so a corrupt file is never deserialised,
    let alone returned. ``torch_load_kwargs`` go to ``torch.load`` (``weights_only`` stays True
    and ``mmap`` is True unless given: the tensors are built on the mapped file, which the check
    has just brought into the page cache, instead of being copied out of it).
    """
    directory = Path(directory)
    metadata = read_metadata(directory)
    if "determined_version" in metadata:
        return _determined(determined_format.load_state, directory, map_location)
    expected = metadata["files"].get(STATE_FILE)
    if expected is None:
        raise CheckpointError(f"checkpoint {directory} has no {STATE_FILE} in its manifest")
    for relative, entry in metadata["files"].items():  # before a single byte is deserialised
        _check_file(directory, relative, entry)
    if not zipfile.is_zipfile(directory / STATE_FILE):
        raise CheckpointError(
            f"checkpoint {directory}: {STATE_FILE} refused: it is not in torch's zip format, which "
            "is all hookdet writes (torch's older pickle format, or not torch's at all); hookdet "
            "never loads such a file"
        )
    import torch

    torch_load_kwargs.setdefault("weights_only", True)
    torch_load_kwargs.setdefault("mmap", True)
    try:
        state = torch.load(directory / STATE_FILE, map_location=map_location, **torch_load_kwargs)
    except pickle.UnpicklingError as error:
        # torch's text suggests weights_only=False, i.e. running the file's code: never say that.
        found = re.search(r"(?i)(unsupported GLOBAL [\w.]+|Unsupported global: GLOBAL [\w.]+|Unsupported operand \d+)", str(error))
        raise CheckpointError(
            f"checkpoint {directory}: {STATE_FILE} refused: it holds more than tensors and plain "
            f"values ({found.group(1) if found else 'an object that would run code when loaded'}); "
            "hookdet never loads such a file"
        ) from None
    except Exception as error:
        raise CheckpointError(f"checkpoint {directory}: {STATE_FILE} does not load: {error}") from error
    if not isinstance(state, dict):
        raise CheckpointError(
            f"checkpoint {directory}: {STATE_FILE} holds a {type(state).__name__}, not a state dict"
        )
    return state
