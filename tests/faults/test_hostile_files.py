"""Experiment files and paths that are not what they seem, through ``hookdet run`` in this process
(issue 27): each is refused in one line naming the file or field, within a second where nothing
needs training, and leaves no run directory behind.

- A FIFO (whose open would wait for a writer forever), ``/dev/zero`` (which never ends), a
  directory, and a file far over the size limit are refused from their ``fstat``, unread.
- A NUL (or other control) byte: the file, line and column, not PyYAML's ``ReaderError``.
- Brackets inside quoted strings, block scalars and comments are not nesting.
- A ``name`` of 10,000 characters trains (the default run directory takes its first 64), and a
  ``--run-dir`` with a name over 255 bytes is one line.
- An ``endpoint_url`` that is no URL is the field's problem, not boto3's ``ValueError``.
- ``--resume`` of a bare name that is no run, no directory and no checkpoint id: one line, and
  the run directory made for the attempt is gone.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from tests.faults.harness import write_config
from tests.faults.test_bad_input import hookdet, one_line


@pytest.mark.parametrize("kind", ["FIFO", "/dev/zero", "directory", "3 GB sparse file"])
def test_a_file_that_is_no_experiment_file_is_refused_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture, kind: str
) -> None:
    path = tmp_path / "exp.yaml"
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path = Path("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as handle:  # sparse: 3 GB long, nothing on disk
            handle.truncate(3 * 10**9)
    started = time.monotonic()
    assert hookdet(f"experiment file: {kind}", "run", str(path)) == 2
    assert time.monotonic() - started < 1.0
    expected = {
        "FIFO": "not a regular file (a FIFO)",
        "/dev/zero": "not a regular file (a character device)",
        "directory": "not a regular file (a directory)",
    }.get(kind, "the file is 3,000,000,000 bytes, over the 1,048,576")
    one_line(capsys, f"{path}: {expected}")


@pytest.mark.parametrize("character", ["\x00", "\x07"])
def test_a_control_byte_is_named_with_its_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture, character: str
) -> None:
    config = write_config(tmp_path / "exp.yaml")
    text = config.read_text()
    config.write_text(text + f"description: abc{character}def\n")
    line = text.count("\n") + 1
    assert hookdet("control byte in the file", "run", str(config)) == 2
    one_line(capsys, f"{config}:{line}:17: malformed YAML: character U+{ord(character):04X} is not allowed in YAML")


def test_brackets_in_strings_block_scalars_and_comments_are_not_nesting(tmp_path: Path) -> None:
    config = write_config(tmp_path / "exp.yaml")
    text = config.read_text()
    text += "description: '" + "[" * 150 + "'\n# " + "{" * 150 + "\ndata:\n  note: |\n    " + "[" * 200 + "\n"
    config.write_text(text)
    assert hookdet("150 brackets in a string", "run", str(config), "--run-dir", str(tmp_path / "run")) == 0
    assert yaml.safe_load(config.read_text())["description"] == "[" * 150


def test_a_very_long_name_trains_and_a_too_long_run_dir_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "exp.yaml", name="n" * 10_000)
    monkeypatch.chdir(tmp_path)
    assert hookdet("name of 10,000 characters", "run", str(config)) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("n" * 64 + "-") and not run_dir.name.startswith("n" * 65)
    capsys.readouterr()

    too_long = tmp_path / ("r" * 300)
    assert hookdet("--run-dir name of 300 bytes", "run", str(config), "--run-dir", str(too_long)) == 2
    one_line(capsys, f"{str(too_long)[:100]}... ({len(str(too_long))} characters): file name too long")


def test_an_endpoint_url_that_is_no_url_is_the_fields_problem(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path / "exp.yaml", checkpoint_storage={"type": "s3", "bucket": "b",
                                                                    "endpoint_url": "http://[::1"})
    assert hookdet("endpoint_url http://[::1", "run", str(config), "--run-dir", str(tmp_path / "run")) == 2
    one_line(capsys, f"{config}:", "checkpoint_storage.endpoint_url: endpoint_url is not a URL (Invalid IPv6 URL)")
    assert not (tmp_path / "run").exists()


def test_resume_of_a_name_that_is_nothing_is_one_line_and_leaves_no_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "exp.yaml")
    monkeypatch.chdir(tmp_path)
    assert hookdet("--resume no-such-run", "run", str(config), "--resume", "no-such-run") == 2
    one_line(capsys, f"cannot resume from 'no-such-run': no run directory or checkpoint directory of that "
             f"name in {tmp_path}, and no checkpoint with that id in this user's checkpoint index")
    assert not (tmp_path / "runs").exists()  # refused before anything was made
    assert hookdet("--resume runs/nothing", "run", str(config), "--resume", "runs/nothing") == 2
    one_line(capsys, f"cannot resume from runs/nothing: no such run directory or checkpoint directory (from {tmp_path})")

    # A run directory that was there before is left where it was.
    kept = tmp_path / "kept"
    kept.mkdir()
    assert hookdet("--resume no-such-run, --run-dir kept", "run", str(config), "--resume", "no-such-run",
                   "--run-dir", str(kept)) == 2
    assert kept.is_dir()


def test_resume_of_a_checkpoint_retention_deleted_says_which_rule_deleted_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default retention (latest 1, best 1) deletes a run's older checkpoints; resuming one of
    them by id says that run's retention deleted it, and by which rule, not "not found"."""
    import logging
    import re

    config = write_config(tmp_path / "exp.yaml")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="hookdet"):
        assert hookdet("train 12 batches", "run", str(config), "--run-dir", str(tmp_path / "run")) == 0
    deleted = re.findall(r"retention deleted checkpoint (\S+)", caplog.text)
    assert deleted, caplog.text
    capsys.readouterr()
    assert hookdet("--resume a deleted id", "run", str(config), "--resume", deleted[0]) == 2
    one_line(capsys, f"cannot resume from {deleted[0]!r}: run {tmp_path / 'run'} deleted that checkpoint by "
             "its retention (save_trial_latest: 1, save_trial_best: 1)")
