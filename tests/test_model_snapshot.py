"""A search's snapshot of its model directory (``hookdet/search/model_snapshot.py``): what it
holds and leaves out, and its size limit. That every segment runs it, resume included, is shown
by ``tests/test_warm_segments.py`` (an edit mid-search reaches no trial; the SIGKILL test's
resumed trial runs in it)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from hookdet.errors import UsageError
from hookdet.search import model_snapshot


def files_in(folder: Path) -> set:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file() or path.is_symlink()}


def test_the_snapshot_holds_the_code_and_leaves_out_what_detignore_version_control_and_runs_name(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "pkg").mkdir(parents=True)
    (model / "train.py").write_text("print('train')\n")
    (model / "pkg" / "layers.py").write_text("X = 1\n")
    (model / "pkg" / "__pycache__").mkdir()
    (model / "pkg" / "__pycache__" / "layers.cpython-311.pyc").write_bytes(b"\0")
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref\n")
    (model / "data").mkdir()
    (model / "data" / "big.npz").write_bytes(b"\0" * 10)
    (model / "weights.ckpt").write_bytes(b"\0")
    (model / "notes" / "data").mkdir(parents=True)
    (model / "notes" / "data" / "keep.txt").write_text("a file named like the folder pattern\n")
    (model / ".detignore").write_text("# data and outputs\n/data/\n*.ckpt\n")
    (model / "runs" / "earlier").mkdir(parents=True)
    (model / "runs" / "earlier" / "run.json").write_text("{}\n")
    (model / "runs" / "earlier" / "metrics.jsonl").write_text("\n")
    elsewhere = tmp_path / "datasets"
    elsewhere.mkdir()
    (elsewhere / "images.bin").write_bytes(b"\0" * 10)
    (model / "images").symlink_to(elsewhere)
    search_dir = model / "runs" / "search"  # a search started from inside the model directory
    search_dir.mkdir()

    copy = model_snapshot.snapshot(model, search_dir)

    assert copy == search_dir.resolve() / "model" and model_snapshot.snapshot_of(search_dir) == copy
    assert files_in(copy) == {"train.py", "pkg/layers.py", ".detignore", "notes/data/keep.txt", "images"}
    assert (copy / "images").is_symlink() and Path(os.readlink(copy / "images")) == elsewhere.resolve()
    assert (copy / "train.py").read_text() == "print('train')\n"
    (model / "train.py").write_text("print('edited')\n")
    assert (copy / "train.py").read_text() == "print('train')\n"  # a copy, not a link


def test_a_model_directory_over_the_limit_is_refused_naming_detignore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "train.py").write_text("print('train')\n")
    (model / "data.bin").write_bytes(b"\0" * 4096)
    monkeypatch.setattr(model_snapshot, "LIMIT_BYTES", 1024)
    with pytest.raises(UsageError, match=r"over the 0 MiB limit; list data and outputs in .*\.detignore"):
        model_snapshot.snapshot(model, tmp_path / "search")
    assert model_snapshot.snapshot_of(tmp_path / "search") is None
    assert model_snapshot.snapshot_of(tmp_path / "no-search") is None
