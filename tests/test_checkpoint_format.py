"""The checkpoint directory format: writing, sealing, verifying, refusing, finding.

Real files in a temporary directory; corruption is done the way it happens (a flipped byte, a
truncated file, a missing metadata file, an edited metadata value).
"""
from __future__ import annotations

import collections
import hashlib
import io
import json
import random
import shutil
import zipfile
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest
import torch
import xxhash

from hookdet.checkpoints import format as fmt
from hookdet.checkpoints import lookup as lookup
from hookdet.trial_api import rng


def make_checkpoint(directory: Path, steps: int, state: Any = None, extra: Dict[str, bytes] = None) -> Path:
    """A sealed checkpoint directory as the checkpoint plugin writes one."""
    directory.mkdir(parents=True)
    state = state if state is not None else {"models_state_dict": [{"w": torch.full((3,), float(steps))}]}
    entry = fmt.write_state(directory, state)
    for name, content in (extra or {}).items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
    fmt.write_metadata(
        directory, fmt.base_metadata(uuid=directory.name, steps_completed=steps), {fmt.STATE_FILE: entry}
    )
    return directory


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def slice_digests(content: bytes, chunk_bytes: int) -> list:
    slices = [content[i : i + chunk_bytes] for i in range(0, len(content), chunk_bytes)] or [b""]
    return [hashlib.sha256(piece).hexdigest() for piece in slices]


def test_checksum_computed_while_writing_is_the_files_xxh3_128(tmp_path: Path) -> None:
    """Large records and small ones (the pickle, the version records) all count."""
    state = {
        "big": torch.arange(2_000_000, dtype=torch.float32),
        "small": [torch.ones(3), 1, "x", None, 2.5],
    }
    entry = fmt.write_state(tmp_path, state)
    content = (tmp_path / fmt.STATE_FILE).read_bytes()
    assert entry == {"size": len(content), "xxh3_128": xxhash.xxh3_128(content).hexdigest()}
    assert fmt.xxh3_of(tmp_path / fmt.STATE_FILE) == entry["xxh3_128"]


def test_an_empty_file_has_the_empty_checksum(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert fmt.manifest_entry(tmp_path / "empty") == {"size": 0, "xxh3_128": xxhash.xxh3_128(b"").hexdigest()}


def write_format_3_checkpoint(directory: Path, state: Any, chunk_bytes: int) -> Path:
    """A checkpoint exactly as format 3 wrote it: a sha256 per slice, metadata_sha256."""
    directory.mkdir(parents=True)
    torch.save(state, directory / fmt.STATE_FILE)
    content = (directory / fmt.STATE_FILE).read_bytes()
    metadata = {
        "uuid": directory.name, "steps_completed": 3, "format_version": 3, "created": 1.0,
        "files": {fmt.STATE_FILE: {"size": len(content), "sha256": slice_digests(content, chunk_bytes)}},
    }
    canonical = json.dumps(metadata, sort_keys=True, separators=(",", ":"), allow_nan=True)
    metadata["metadata_sha256"] = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    (directory / fmt.METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True))
    return directory


def test_a_format_3_sha256_checkpoint_still_verifies_loads_and_refuses_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints written before XXH3 (sha256 per 64 MiB slice; small slices here so records
    straddle them) load exactly, and a flipped byte is still found."""
    monkeypatch.setattr(fmt, "CHUNK_BYTES", 1 << 20)
    state = {"w": torch.randn(1_500_000), "v": torch.arange(10)}
    directory = write_format_3_checkpoint(tmp_path / "old", state, 1 << 20)
    assert len(fmt.read_metadata(directory)["files"][fmt.STATE_FILE]["sha256"]) > 1
    assert fmt.verify(directory)["format_version"] == 3
    loaded = fmt.load_state(directory)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["v"], torch.arange(10))
    flip_byte(directory / fmt.STATE_FILE, (directory / fmt.STATE_FILE).stat().st_size - 1000)
    with pytest.raises(fmt.CheckpointError, match="fails its sha256 check"):
        fmt.load_state(directory)


def test_state_file_is_a_valid_zip_that_torch_loads(tmp_path: Path) -> None:
    """Written through a Python file object, the file is still the standard torch zip format:
    every member's zip CRC checks out and plain ``torch.load`` reads it."""
    fmt.write_state(tmp_path, {"x": torch.arange(300_000.0)})
    with zipfile.ZipFile(tmp_path / fmt.STATE_FILE) as archive:
        assert archive.testzip() is None
    loaded = torch.load(tmp_path / fmt.STATE_FILE, weights_only=True)
    assert torch.equal(loaded["x"], torch.arange(300_000.0))


def test_manifest_covers_every_file_and_reuses_the_known_hash(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "c", 7, extra={"code/model.py": b"print(1)\n"})
    metadata = json.loads((directory / fmt.METADATA_FILE).read_text())
    assert set(metadata["files"]) == {fmt.STATE_FILE, "code/model.py"}
    for relative, entry in metadata["files"].items():
        assert entry == fmt.manifest_entry(directory / relative)
    assert metadata["format_version"] == fmt.FORMAT_VERSION
    assert metadata["steps_completed"] == 7 and metadata["versions"]["torch"] == torch.__version__
    assert fmt.verify(directory)["uuid"] == "c"


def test_a_known_entry_whose_size_changed_is_rehashed(tmp_path: Path) -> None:
    """A plugin that rewrote the state file in on_checkpoint_write_end gets a true manifest."""
    tmp_path.mkdir(exist_ok=True)
    entry = fmt.write_state(tmp_path, {"x": torch.zeros(4)})
    torch.save({"x": torch.ones(400)}, tmp_path / fmt.STATE_FILE)
    metadata = fmt.write_metadata(tmp_path, {"steps_completed": 1}, {fmt.STATE_FILE: entry})
    assert metadata["files"][fmt.STATE_FILE] == fmt.manifest_entry(tmp_path / fmt.STATE_FILE)
    assert torch.equal(fmt.load_state(tmp_path)["x"], torch.ones(400))


# ---------------------------------------------------------------------------------------------
# What may be saved
# ---------------------------------------------------------------------------------------------


def test_plain_values_and_tensors_pass_and_load_weights_only(tmp_path: Path) -> None:
    state = {
        "tensor": torch.randn(2, 2),
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "ordered": collections.OrderedDict(a=torch.zeros(1)),
        "nested": [1, 2.5, "s", None, True, (1, 2), {3, 4}, b"raw", bytearray(b"x"), 1j],
        "torch_values": [torch.float16, torch.device("cpu"), torch.Size([2, 3]), torch.strided],
        1: "int key",
        (1, 2): "tuple key",
    }
    fmt.check_weights_only(state)
    fmt.write_state(tmp_path, state)
    loaded = torch.load(tmp_path / fmt.STATE_FILE, weights_only=True)
    assert loaded["nested"] == state["nested"] and loaded[(1, 2)] == "tuple key"


@pytest.mark.parametrize(
    "value,culprit",
    [
        (np.zeros(3), "numpy.ndarray"),
        (np.float64(1.0), "numpy.float64"),
        (collections.namedtuple("Point", "x y")(1, 2), "Point"),
        (collections.defaultdict(list), "defaultdict"),
        (frozenset([1]), "frozenset"),
        (object(), "builtins.object"),
    ],
)
def test_anything_needing_unpickling_is_refused_naming_where_it_is(tmp_path: Path, value: Any, culprit: str) -> None:
    state = {"callbacks": {"timer": {"ok": 1, "bad": [0, value]}}}
    with pytest.raises(fmt.CheckpointError) as raised:
        fmt.write_state(tmp_path, state)
    message = str(raised.value)
    assert "checkpoint['callbacks']['timer']['bad'][1]" in message and culprit in message
    assert "weights_only" in message
    assert not (tmp_path / fmt.STATE_FILE).exists()  # refused before anything was written


def test_a_dict_key_of_an_odd_type_is_refused() -> None:
    with pytest.raises(fmt.CheckpointError, match=r"checkpoint\['plugins'\] has a key of type PosixPath"):
        fmt.check_weights_only({"plugins": {Path("x"): 1}})


# ---------------------------------------------------------------------------------------------
# Refusing what is not intact
# ---------------------------------------------------------------------------------------------


def test_intact_checkpoint_loads_exactly(tmp_path: Path) -> None:
    state = {"models_state_dict": [{"w": torch.randn(64, 64)}], "rng_state": [rng.capture_rng_state()]}
    directory = make_checkpoint(tmp_path / "c", 3, state=state)
    loaded = fmt.load_state(directory)
    assert torch.equal(loaded["models_state_dict"][0]["w"], state["models_state_dict"][0]["w"])
    # Loaded tensors own their memory: deleting the directory does not affect them.
    shutil.rmtree(directory)
    assert torch.equal(loaded["models_state_dict"][0]["w"], state["models_state_dict"][0]["w"])


@pytest.mark.parametrize("offset", [0, 100, -1])
def test_a_flipped_byte_in_the_state_file_is_refused(tmp_path: Path, offset: int) -> None:
    directory = make_checkpoint(tmp_path / "c", 3)
    path = directory / fmt.STATE_FILE
    flip_byte(path, offset if offset >= 0 else path.stat().st_size + offset)
    with pytest.raises(fmt.CheckpointError, match="state_dict.pth fails its xxh3_128 check"):
        fmt.load_state(directory)
    with pytest.raises(fmt.CheckpointError, match="fails its xxh3_128 check"):
        fmt.verify(directory)


def test_a_truncated_state_file_is_refused(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "c", 3)
    path = directory / fmt.STATE_FILE
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(fmt.CheckpointError, match=r"truncated"):
        fmt.load_state(directory)


def test_a_missing_metadata_file_means_no_checkpoint(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "c", 3)
    (directory / fmt.METADATA_FILE).unlink()
    with pytest.raises(fmt.CheckpointError, match="not a complete checkpoint: it has no metadata.json"):
        fmt.load_state(directory)


def test_an_edited_metadata_value_is_refused(tmp_path: Path) -> None:
    """The metadata carries its own digest: changing steps_completed is caught."""
    directory = make_checkpoint(tmp_path / "c", 3)
    path = directory / fmt.METADATA_FILE
    path.write_text(path.read_text().replace('"steps_completed": 3', '"steps_completed": 4'))
    with pytest.raises(fmt.CheckpointError, match="does not match its own digest"):
        fmt.read_metadata(directory)


def test_a_corrupt_extra_file_is_refused(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "c", 3, extra={"notes/plugin.json": b'{"a": 1}'})
    (directory / "notes/plugin.json").write_bytes(b'{"a": 2}')
    with pytest.raises(fmt.CheckpointError, match="notes/plugin.json fails its xxh3_128 check"):
        fmt.load_state(directory)


def test_a_state_file_needing_unpickling_does_not_load_even_with_a_valid_manifest(tmp_path: Path) -> None:
    """Someone wrote a pickle of an arbitrary object and resealed the manifest: the load uses
    weights_only=True, so it is refused rather than executed."""
    directory = make_checkpoint(tmp_path / "c", 3)
    buffer = io.BytesIO()
    torch.save({"evil": random.Random(1)}, buffer)  # a class weights_only will not rebuild
    (directory / fmt.STATE_FILE).write_bytes(buffer.getvalue())
    fmt.write_metadata(directory, fmt.base_metadata(uuid="c", steps_completed=3))
    fmt.verify(directory)  # the files match the manifest...
    with pytest.raises(fmt.CheckpointError, match="refused: .*GLOBAL random.Random") as refused:
        fmt.load_state(directory)  # ...but nothing is unpickled beyond tensors and plain values
    assert "weights_only" not in str(refused.value)  # never advice to run the file's code


# ---------------------------------------------------------------------------------------------
# Finding checkpoints
# ---------------------------------------------------------------------------------------------


def test_run_directory_resolves_to_the_newest_intact_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "run" / "checkpoints"
    make_checkpoint(root / "a", 2)
    make_checkpoint(root / "b", 4)
    newest = make_checkpoint(root / "c", 6)
    (root / ".tmp-d-1234").mkdir()  # an interrupted write: invisible
    (root / ".tmp-d-1234" / fmt.STATE_FILE).write_bytes(b"partial")
    (root / "e").mkdir()  # a directory without metadata: incomplete, skipped
    assert lookup.resolve_checkpoint_dir(tmp_path / "run") == newest
    assert lookup.resolve_checkpoint_dir(root) == newest
    flip_byte(newest / fmt.STATE_FILE, 50)
    assert lookup.resolve_checkpoint_dir(tmp_path / "run") == root / "b"
    assert "skipping checkpoint that fails verification" in caplog.text and str(newest) in caplog.text
    assert [path.name for path, _ in lookup.find_checkpoints(root)] == ["a", "b", "c"]


def test_an_unfinished_checkpoint_named_directly_is_refused_naming_the_newest_intact(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    make_checkpoint(root / "a", 2)
    make_checkpoint(root / "b", 4)
    broken = make_checkpoint(root / "c", 6)
    (broken / fmt.METADATA_FILE).unlink()
    with pytest.raises(fmt.CheckpointError) as raised:
        lookup.resolve_checkpoint_dir(broken)
    message = str(raised.value)
    assert "no metadata.json" in message and f"the newest intact checkpoint is {root / 'b'} (batch 4)" in message


def test_nothing_intact_or_nothing_at_all_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "run" / "checkpoints"
    only = make_checkpoint(root / "a", 2)
    flip_byte(only / fmt.STATE_FILE, 10)
    with pytest.raises(fmt.CheckpointError, match="no intact checkpoint under .*incomplete or fails verification"):
        lookup.resolve_checkpoint_dir(tmp_path / "run")
    (tmp_path / "empty" / "tensorboard").mkdir(parents=True)
    with pytest.raises(fmt.CheckpointError, match="holds no checkpoint"):
        lookup.resolve_checkpoint_dir(tmp_path / "empty")
    with pytest.raises(fmt.CheckpointError, match="does not exist"):
        lookup.resolve_checkpoint_dir(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------
# RNG state
# ---------------------------------------------------------------------------------------------


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path: Path) -> None:
    random.gauss(0, 1)  # leave a cached gaussian in Python's generator
    np.random.standard_normal()
    state = rng.capture_rng_state()
    expected = (random.random(), random.gauss(0, 1), np.random.standard_normal(), torch.rand(3))
    fmt.write_state(tmp_path, {"rng": state})
    for _ in range(5):  # move every generator on
        random.random(), np.random.rand(), torch.rand(2)
    rng.restore_rng_state(torch.load(tmp_path / fmt.STATE_FILE, weights_only=True)["rng"])
    again = (random.random(), random.gauss(0, 1), np.random.standard_normal(), torch.rand(3))
    assert expected[:3] == again[:3] and torch.equal(expected[3], again[3])
