"""Checkpoint storage backends against a real filesystem and a real S3-compatible server.

The behaviour every backend promises (round trip, atomic publish, listing, deletion) runs
once per backend through the ``storage`` fixture; backend-specific details follow.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

from hookdet.checkpoints.local import LocalStorage
from hookdet.checkpoints.registry import make_storage
from hookdet.checkpoints.storage import (
    METADATA_FILE,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CheckpointStorage,
    IncompleteCheckpointError,
    StorageError,
)
from hookdet.config import ConfigError, parse_experiment_config
from hookdet.checkpoints.azure import AzureStorage
from hookdet.checkpoints.gcs import GCSStorage
from hookdet.checkpoints.object_store import ObjectStorage
from hookdet.checkpoints.registry import storage_class
from hookdet.checkpoints.s3 import S3Storage
from tests.support.s3_fixture import s3_admin_client, s3_server  # noqa: F401  (s3_server: a fixture)
from tests.support.storage_servers import azure_server, flatfs_installed, gcs_server  # noqa: F401  (fixtures)

CHECKPOINT_FILES = {
    METADATA_FILE: json.dumps({"steps_completed": 12}).encode(),
    "state_dict.pth": bytes(range(256)) * 40,
    "code/model_def.py": b"print('hello')\n",
    "callbacks/deep/nested/state.json": b"{}",
}


def write_checkpoint(directory: Path, files: dict[str, bytes] = CHECKPOINT_FILES) -> None:
    for relative_name, content in files.items():
        target = directory / relative_name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def read_tree(directory: Path) -> dict[str, bytes]:
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in directory.rglob("*")
        if path.is_file()
    }


def store(
    storage: CheckpointStorage, storage_id: str, files: dict[str, bytes] = CHECKPOINT_FILES
) -> None:
    with storage.store_path(storage_id) as directory:
        write_checkpoint(directory, files)


class Backend:
    """A storage under test plus a raw view of what it left behind, bypassing its API."""

    def __init__(self, storage: CheckpointStorage, leftovers: Callable[[], list[str]]) -> None:
        self.storage = storage
        self.leftovers = leftovers


def s3_keys(server: dict[str, str]) -> list[str]:
    response = s3_admin_client(server["endpoint_url"]).list_objects_v2(Bucket=server["bucket"])
    return sorted(item["Key"] for item in response.get("Contents", ()))


@pytest.fixture
def local_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point Python's default temp directory at an empty folder, to spot staging litter."""
    temp_dir = tmp_path / "system-tmp"
    temp_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_dir))
    return temp_dir


def s3_storage_for(server: dict[str, str], prefix: str = "experiments/7") -> S3Storage:
    return S3Storage(
        bucket=server["bucket"],
        prefix=prefix,
        endpoint_url=server["endpoint_url"],
        access_key=server["access_key"],
        secret_key=server["secret_key"],
        region=server["region"],
    )


@pytest.fixture(params=["local", "s3", "gcs", "azure", "flatfs"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, local_temp_dir: Path) -> Backend:
    """Every storage type hookdet has, each against its real server, and one from another
    package (``tests/fixtures/hookdet-flatfs``), found by its type name as a run finds it."""
    if request.param == "local":
        root = tmp_path / "ckpts"
        return Backend(
            LocalStorage(root),
            lambda: sorted(p.name for p in root.iterdir()) if root.exists() else [],
        )
    if request.param == "flatfs":
        request.getfixturevalue("flatfs_installed")
        root = tmp_path / "flat"
        return Backend(
            storage_class("flatfs")(root=str(root)),
            lambda: sorted(p.name for p in root.iterdir()) if root.exists() else [],
        )
    if request.param == "s3":
        server = request.getfixturevalue("s3_server")
        storage: ObjectStorage = s3_storage_for(server)
    elif request.param == "gcs":
        server = request.getfixturevalue("gcs_server")
        storage = GCSStorage(bucket=server["bucket"], prefix="experiments/7")
    else:
        server = request.getfixturevalue("azure_server")
        storage = AzureStorage(container=f"{server['container']}/experiments/7",
                               connection_string=server["connection_string"])
    return Backend(storage, lambda: storage.list_keys("") + sorted(p.name for p in local_temp_dir.iterdir()))


# ------------------------------------------------------------------ behaviour of every backend


def test_round_trip_keeps_nested_files_byte_for_byte(backend: Backend) -> None:
    store(backend.storage, "uuid-1")

    assert backend.storage.list_ids() == ["uuid-1"]
    with backend.storage.restore_path("uuid-1") as restored:
        assert read_tree(restored) == CHECKPOINT_FILES


def test_exception_inside_store_path_publishes_nothing_and_leaves_no_litter(
    backend: Backend,
) -> None:
    with pytest.raises(RuntimeError, match="disk on fire"):
        with backend.storage.store_path("uuid-1") as directory:
            write_checkpoint(directory)
            raise RuntimeError("disk on fire")

    assert backend.storage.list_ids() == []
    assert backend.leftovers() == []
    with pytest.raises(CheckpointNotFoundError):
        with backend.storage.restore_path("uuid-1"):
            pass


def test_store_without_metadata_is_refused_and_discarded(backend: Backend) -> None:
    files_without_metadata = {k: v for k, v in CHECKPOINT_FILES.items() if k != METADATA_FILE}

    with pytest.raises(IncompleteCheckpointError, match="uuid-1.*metadata.json"):
        store(backend.storage, "uuid-1", files_without_metadata)

    assert backend.storage.list_ids() == []
    assert backend.leftovers() == []


def test_restore_of_missing_id_names_id_and_storage(backend: Backend) -> None:
    store(backend.storage, "present")

    with pytest.raises(CheckpointNotFoundError) as caught:
        with backend.storage.restore_path("absent"):
            pass

    assert "'absent'" in str(caught.value)
    assert backend.storage.describe() in str(caught.value)
    assert caught.value.storage_id == "absent"


def test_storing_over_an_existing_checkpoint_is_refused_and_keeps_the_original(
    backend: Backend,
) -> None:
    store(backend.storage, "uuid-1")

    with pytest.raises(CheckpointExistsError, match="uuid-1"):
        store(backend.storage, "uuid-1", {METADATA_FILE: b"{}"})

    with backend.storage.restore_path("uuid-1") as restored:
        assert read_tree(restored) == CHECKPOINT_FILES


def test_delete_removes_only_that_checkpoint(backend: Backend) -> None:
    store(backend.storage, "keep")
    store(backend.storage, "drop")
    assert backend.storage.list_ids() == ["drop", "keep"]

    backend.storage.delete("drop")

    assert backend.storage.list_ids() == ["keep"]
    assert not any("drop" in leftover for leftover in backend.leftovers())
    with pytest.raises(CheckpointNotFoundError, match="drop"):
        with backend.storage.restore_path("drop"):
            pass
    with pytest.raises(CheckpointNotFoundError, match="drop"):
        backend.storage.delete("drop")
    with backend.storage.restore_path("keep") as restored:
        assert read_tree(restored) == CHECKPOINT_FILES


@pytest.mark.parametrize("bad_id", ["", "../escape", "a/b", ".tmp-sneaky", "..", "a\\b"])
def test_ids_that_are_not_one_plain_name_are_rejected(backend: Backend, bad_id: str) -> None:
    with pytest.raises(ValueError, match="invalid checkpoint storage id"):
        with backend.storage.store_path(bad_id):
            pass
    assert backend.leftovers() == []


# ------------------------------------------------------------------ local directory specifics


def test_local_list_ids_ignores_incomplete_and_temporary_dirs(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    store(storage, "complete")
    write_checkpoint(tmp_path / "half-written", {"state_dict.pth": b"x"})
    write_checkpoint(tmp_path / ".tmp-crashed-1a2b3c4d")
    (tmp_path / "stray-file.txt").write_text("not a checkpoint")

    assert storage.list_ids() == ["complete"]
    with pytest.raises(CheckpointNotFoundError, match="half-written.*no metadata.json"):
        with storage.restore_path("half-written"):
            pass


def test_local_delete_also_clears_an_incomplete_checkpoint(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    write_checkpoint(tmp_path / "half-written", {"state_dict.pth": b"x"})

    storage.delete("half-written")

    assert list(tmp_path.iterdir()) == []


def test_local_restore_yields_the_stored_directory_itself(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "ckpts")
    store(storage, "uuid-1")

    with storage.restore_path("uuid-1") as restored:
        assert restored == tmp_path / "ckpts" / "uuid-1"
    assert storage.location("uuid-1") == str(tmp_path / "ckpts" / "uuid-1")
    assert storage.describe() == f"local directory {tmp_path / 'ckpts'}"


def test_local_checkpoint_gets_ordinary_directory_permissions(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    store(storage, "uuid-1")
    ordinary_dir = tmp_path / "made-by-mkdir"
    ordinary_dir.mkdir()

    assert (tmp_path / "uuid-1").stat().st_mode == ordinary_dir.stat().st_mode


def test_local_listing_of_a_root_not_yet_created_is_empty(tmp_path: Path) -> None:
    assert LocalStorage(tmp_path / "not" / "yet").list_ids() == []


# ------------------------------------------------------------------ S3 specifics


def record_put_object_keys(storage: S3Storage) -> list[str]:
    """Observe, through botocore's own event system, the key of every object uploaded."""
    uploaded: list[str] = []
    storage.client.meta.events.register(
        "before-parameter-build.s3.PutObject", lambda params, **_: uploaded.append(params["Key"])
    )
    return uploaded


def test_s3_objects_sit_under_prefix_and_id_with_metadata_uploaded_last(
    s3_server: dict[str, str],
) -> None:
    storage = s3_storage_for(s3_server, prefix="/team/exp-3/")
    uploaded = record_put_object_keys(storage)

    store(storage, "uuid-1")

    expected_keys = sorted(f"team/exp-3/uuid-1/{name}" for name in CHECKPOINT_FILES)
    assert s3_keys(s3_server) == expected_keys
    assert sorted(uploaded) == expected_keys
    assert uploaded[-1] == f"team/exp-3/uuid-1/{METADATA_FILE}"
    assert storage.location("uuid-1") == f"s3://{s3_server['bucket']}/team/exp-3/uuid-1/"
    assert storage.describe() == (
        f"s3://{s3_server['bucket']}/team/exp-3 (endpoint {s3_server['endpoint_url']})"
    )


def test_s3_without_prefix_stores_at_bucket_root(s3_server: dict[str, str]) -> None:
    storage = s3_storage_for(s3_server, prefix="")
    store(storage, "uuid-1", {METADATA_FILE: b"{}", "a/b.bin": b"1"})

    assert s3_keys(s3_server) == ["uuid-1/a/b.bin", f"uuid-1/{METADATA_FILE}"]
    assert storage.list_ids() == ["uuid-1"]


def test_s3_failed_upload_removes_what_it_sent(
    s3_server: dict[str, str], local_temp_dir: Path
) -> None:
    storage = s3_storage_for(s3_server)
    calls: list[str] = []

    def fail_on_second_upload(params: dict[str, Any], **_: Any) -> None:
        calls.append(params["Key"])
        if len(calls) == 2:
            raise ConnectionError("network cable unplugged")

    storage.client.meta.events.register(
        "before-parameter-build.s3.PutObject", fail_on_second_upload
    )

    with pytest.raises(ConnectionError, match="unplugged"):
        store(storage, "uuid-1")

    assert s3_keys(s3_server) == []
    assert list(local_temp_dir.iterdir()) == []
    assert storage.list_ids() == []


def test_s3_list_ids_ignores_uploads_without_metadata(s3_server: dict[str, str]) -> None:
    storage = s3_storage_for(s3_server)
    store(storage, "complete")
    client = s3_admin_client(s3_server["endpoint_url"])
    client.put_object(Bucket=s3_server["bucket"], Key="experiments/7/half/state.pth", Body=b"x")
    client.put_object(Bucket=s3_server["bucket"], Key="elsewhere/other/metadata.json", Body=b"{}")

    assert storage.list_ids() == ["complete"]
    with pytest.raises(CheckpointNotFoundError, match="half.*lack metadata.json"):
        with storage.restore_path("half"):
            pass


def test_s3_store_replaces_leftovers_of_an_unfinished_upload(s3_server: dict[str, str]) -> None:
    storage = s3_storage_for(s3_server)
    storage.client.put_object(
        Bucket=s3_server["bucket"], Key="experiments/7/uuid-1/stale.bin", Body=b"old"
    )

    store(storage, "uuid-1")

    with storage.restore_path("uuid-1") as restored:
        assert read_tree(restored) == CHECKPOINT_FILES


def test_s3_delete_clears_an_incomplete_upload(s3_server: dict[str, str]) -> None:
    storage = s3_storage_for(s3_server)
    storage.client.put_object(
        Bucket=s3_server["bucket"], Key="experiments/7/half/state.pth", Body=b"x"
    )

    storage.delete("half")

    assert s3_keys(s3_server) == []


def test_s3_restore_download_is_removed_on_exit(
    s3_server: dict[str, str], local_temp_dir: Path
) -> None:
    storage = s3_storage_for(s3_server)
    store(storage, "uuid-1")

    with storage.restore_path("uuid-1") as restored:
        assert restored.parent == local_temp_dir
        assert (restored / METADATA_FILE).is_file()

    assert not restored.exists()
    assert list(local_temp_dir.iterdir()) == []


def test_s3_missing_bucket_gives_one_storage_error_naming_it(s3_server: dict[str, str]) -> None:
    storage = S3Storage(bucket="no-such-bucket-here", endpoint_url=s3_server["endpoint_url"])

    with pytest.raises(StorageError, match="s3://no-such-bucket-here.*NoSuchBucket"):
        storage.list_ids()


def test_s3_prefix_with_dot_dot_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"prefix 'a/\.\./b'"):
        S3Storage(bucket="bucket", prefix="a/../b")


def test_s3_without_boto3_explains_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)

    with pytest.raises(ImportError, match=r"pip install hookdet\[s3\]"):
        S3Storage(bucket="bucket")


# ------------------------------------------------------------------ make_storage


def storage_config(spec: Any) -> Any:
    """The ``checkpoint_storage`` block as the experiment file's loader validates it."""
    return parse_experiment_config({"checkpoint_storage": spec}).checkpoint_storage


def test_make_storage_defaults_to_checkpoints_in_the_run_dir(tmp_path: Path) -> None:
    for config in (None, storage_config({"save_trial_best": 2, "save_trial_latest": 3})):
        storage = make_storage(config, tmp_path / "run-1")

        assert isinstance(storage, LocalStorage)
        assert storage.root == tmp_path / "run-1" / "checkpoints"


@pytest.mark.parametrize(
    ("storage_path", "expected_subdir"),
    [(None, ""), ("ckpts/exp", "ckpts/exp"), ("{host}/abs/inside", "abs/inside"), ("a/../b", "b")],
)
def test_make_storage_shared_fs_joins_storage_path_to_host_path(
    tmp_path: Path, storage_path: str | None, expected_subdir: str
) -> None:
    spec: dict[str, Any] = {"type": "shared_fs", "host_path": str(tmp_path), "save_trial_best": 1}
    if storage_path is not None:
        spec["storage_path"] = storage_path.format(host=tmp_path)

    storage = make_storage(storage_config(spec), tmp_path / "run")

    assert isinstance(storage, LocalStorage)
    assert storage.root == tmp_path / expected_subdir


@pytest.mark.parametrize("storage_path", ["../outside", "/somewhere/else"])
def test_shared_fs_storage_path_outside_host_path_is_refused(
    tmp_path: Path, storage_path: str
) -> None:
    spec = {"type": "shared_fs", "host_path": str(tmp_path / "host"), "storage_path": storage_path}

    with pytest.raises(
        ConfigError, match="checkpoint_storage.storage_path: must be a subdirectory of host_path"
    ):
        storage_config(spec)


def test_shared_fs_needs_an_absolute_host_path() -> None:
    with pytest.raises(
        ConfigError, match="checkpoint_storage.host_path: must be an absolute path; got 'relative/dir'"
    ):
        storage_config({"type": "shared_fs", "host_path": "relative/dir"})


def test_make_storage_directory_uses_container_path(tmp_path: Path) -> None:
    storage = make_storage(
        storage_config({"type": "directory", "container_path": str(tmp_path / "c")}), tmp_path / "run"
    )

    assert isinstance(storage, LocalStorage)
    assert storage.root == tmp_path / "c"


def test_make_storage_s3_works_against_the_server(
    s3_server: dict[str, str], tmp_path: Path
) -> None:
    spec = {
        "type": "s3",
        "bucket": s3_server["bucket"],
        "prefix": "via-config",
        "endpoint_url": s3_server["endpoint_url"],
        "access_key": s3_server["access_key"],
        "secret_key": s3_server["secret_key"],
        "save_trial_latest": 2,
    }

    storage = make_storage(storage_config(spec), tmp_path)
    store(storage, "uuid-1")

    assert isinstance(storage, S3Storage)
    assert storage.list_ids() == ["uuid-1"]
    assert f"via-config/uuid-1/{METADATA_FILE}" in s3_keys(s3_server)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "gsc", "bucket": "b"}, "type 'gsc' is not a storage hookdet has; use one of shared_fs, directory, s3, gcs, azure"),
        ({"host_path": "/x"}, "checkpoint_storage.type is required: one of shared_fs, directory, s3, gcs, azure"),
        ({"type": "azure", "container": "c"}, "checkpoint_storage.connection_string: give connection_string or account_url"),
        ({"type": "s3", "bucket": "b", "bukket": "c"}, "unknown field 'checkpoint_storage.bukket'"),
        ({"type": "s3"}, "checkpoint_storage.bucket is required"),
        ({"type": "directory"}, "checkpoint_storage.container_path is required"),
        ({"type": "shared_fs", "host_path": 5}, "checkpoint_storage.host_path: expected a string; got 5"),
        ({"type": "s3", "bucket": "b", "prefix": "../up"}, "checkpoint_storage.prefix: prefix must not contain '..'"),
        (["shared_fs"], "checkpoint_storage: expected a mapping"),
    ],
)
def test_a_bad_storage_block_gets_one_clear_error_from_the_one_validator(spec: Any, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        storage_config(spec)
    assert message in str(raised.value)
