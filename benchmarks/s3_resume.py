"""What a resume from S3 fetches, against a bare boto3 download of the same objects.

One command::

    .venv/bin/python benchmarks/s3_resume.py [--sizes 300MB,1GB] [--repeats 5] [--json OUT]

starts moto's S3 server in this process on 127.0.0.1 (the one the tests use), writes one real
hookdet checkpoint per size into it (the MLP and Adam of ``checkpoint_io.py``: 300MB is 25.0 M
parameters, 1GB 83.2 M), and times, ``--repeats`` rounds each, taking turns:

* ``hookdet_fetch``: what ``--resume RUN_DIR`` asks of the storage before it loads a byte of
  state, on a fresh storage object as a resuming process has: find the run's checkpoints (list,
  one ``metadata.json`` GET each), read the chosen one's metadata (kept from the listing), and
  download it (``restore_path``; its ``metadata.json`` written from what was read) — the
  checkpoint plugin's own calls;
* ``boto3_download``: ``download_file`` of the same objects, keys known in advance.

It also counts, with moto's request recorder, the GETs of each object during one
``hookdet_fetch``. The report: medians (and fastest), their ratio (goal at most 1.1), the GETs
per file, and the 1-minute load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("MOTO_RECORDER_FILEPATH", os.path.join(tempfile.mkdtemp(prefix="s3-resume-"), "recording"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.checkpoint_io import LAYERS, WIDTHS  # noqa: E402
from hookdet.checkpoints import format as fmt  # noqa: E402
from hookdet.checkpoints.s3 import S3Storage  # noqa: E402
from hookdet.checkpoints.resolver import checkpoints_of_run  # noqa: E402

RUN_ID = "benchmark-run"


def start_server() -> str:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return f"http://{host}:{port}"


def storage_for(endpoint: str) -> S3Storage:
    return S3Storage(bucket="bench", prefix="runs/x", endpoint_url=endpoint, access_key="a",
                     secret_key="b", region="us-east-1")


def write_checkpoint(storage: S3Storage, size: str) -> str:
    """A hookdet checkpoint of the MLP and Adam at ``size``, stored under a new id."""
    width = WIDTHS[size]
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(LAYERS)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).pow(2).mean().backward()
    optimizer.step()
    state = {"models_state_dict": [model.state_dict()], "optimizers_state_dict": [optimizer.state_dict()]}
    storage_id = f"ckpt-{size}"
    with storage.store_path(storage_id) as directory:
        entry = fmt.write_state(Path(directory), state)
        metadata = fmt.base_metadata(uuid=storage_id, steps_completed=1, run_id=RUN_ID)
        fmt.write_metadata(Path(directory), metadata, known_files={fmt.STATE_FILE: entry})
    return storage_id


def hookdet_fetch(endpoint: str, storage_id: str) -> None:
    """The storage calls of a resume, on a storage made for it as a resuming process makes one:
    find the run's newest checkpoint, its metadata, its files."""
    storage = storage_for(endpoint)
    found = checkpoints_of_run(storage, RUN_ID)
    assert any(name == storage_id for name, _ in found)
    storage.read_metadata(storage_id)
    with storage.restore_path(storage_id) as directory:
        assert (Path(directory) / fmt.STATE_FILE).is_file()


def boto3_download(storage: S3Storage, keys: List[str], into: Path) -> None:
    for key in keys:
        storage.client.download_file(storage.bucket, key, str(into / key.rsplit("/", 1)[-1]))


def gets_per_file(endpoint: str, storage: S3Storage, storage_id: str) -> Dict[str, int]:
    import requests

    requests.post(f"{endpoint}/moto-api/recorder/reset-recording", timeout=10)
    requests.post(f"{endpoint}/moto-api/recorder/start-recording", timeout=10)
    hookdet_fetch(endpoint, storage_id)
    requests.post(f"{endpoint}/moto-api/recorder/stop-recording", timeout=10)
    lines = requests.get(f"{endpoint}/moto-api/recorder/download-recording", timeout=60).text.splitlines()
    counts: Dict[str, int] = {}
    for entry in map(json.loads, lines):
        if entry["method"] == "GET" and storage_id in entry["url"]:
            name = entry["url"].split("?")[0].rsplit("/", 1)[-1]
            counts[name] = counts.get(name, 0) + 1
    return counts


def measure(endpoint: str, size: str, repeats: int) -> Dict[str, Any]:
    storage = storage_for(endpoint)
    storage_id = write_checkpoint(storage, size)
    keys = [key for key in storage.list_keys(storage.checkpoint_key_prefix(storage_id))]
    state_bytes = storage.client.head_object(Bucket=storage.bucket, Key=next(k for k in keys if k.endswith(fmt.STATE_FILE)))["ContentLength"]
    load_before = os.getloadavg()[0]
    times: Dict[str, List[float]] = {"hookdet_fetch": [], "boto3_download": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as into:
            start = time.perf_counter()
            boto3_download(storage, keys, Path(into))
            times["boto3_download"].append(time.perf_counter() - start)
        start = time.perf_counter()
        hookdet_fetch(endpoint, storage_id)
        times["hookdet_fetch"].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "size": size,
        "state_bytes": state_bytes,
        "repeats": repeats,
        "loadavg_1min_before_after": [load_before, os.getloadavg()[0]],
        "median_seconds": medians,
        "min_seconds": {name: min(values) for name, values in times.items()},
        "ratio_hookdet_vs_boto3": medians["hookdet_fetch"] / medians["boto3_download"],
        "gets_per_file_in_one_fetch": gets_per_file(endpoint, storage, storage_id),
    }


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="300MB,1GB", help=f"comma-separated, of {', '.join(WIDTHS)}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    endpoint = start_server()
    storage_for(endpoint).client.create_bucket(Bucket="bench")
    results = [measure(endpoint, size, args.repeats) for size in args.sizes.split(",")]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
