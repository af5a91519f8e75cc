"""``hookdet ui`` as a user starts it, over HTTP: it prints its URL, stops on Ctrl-C, serves only
what lies inside its roots, changes nothing on disk, off 127.0.0.1 wants its token, answers no
other site, and shows secrets hidden.

Every test starts the real command (``tests/support/browser.ui_server``: uvicorn in a process of
its own) and speaks HTTP to it with the standard library.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from hookdet.ui.catalog import root_key
from tests.support.browser import ui_server


def make_run(directory: Path, state: str = "completed", batches: int = 4) -> Path:
    """A run directory as hookdet writes one: its record, its experiment, its reports."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"name": directory.name, "hyperparameters": {"lr": 0.1},
                                                       "searcher": {"metric": "validation_loss"}}))
    (directory / "run.json").write_text(json.dumps({"state": state, "started": "2026-11-27T10:00:00+00:00",
                                                    "ended": "2026-11-27T10:01:00+00:00",
                                                    "batches_trained": batches, "max_batches": batches}))
    lines = [{"group": "training", "steps_completed": b, "metrics": {"loss": 1.0 / b}, "time": 0.0}
             for b in range(1, batches + 1)]
    lines.append({"group": "validation", "steps_completed": batches, "metrics": {"validation_loss": 0.5}, "time": 0.0})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return directory


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def get(url: str, method: str = "GET", cookie: Optional[str] = None,
        host: Optional[str] = None) -> Tuple[int, Dict[str, str], bytes]:
    """(status, headers, body) of one request (its ``Host`` header ``host`` when given),
    redirects not followed."""
    headers = {**({"Cookie": cookie} if cookie else {}), **({"Host": host} if host else {})}
    request = urllib.request.Request(url, method=method, headers=headers)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def snapshot(root: Path) -> Dict[str, Tuple[int, int]]:
    """Every path under ``root`` with its size and modification time (symlinks not followed)."""
    found = {}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            status = os.lstat(os.path.join(directory, name))
            found[os.path.join(directory, name)] = (status.st_size, status.st_mtime_ns)
    return found


def test_it_prints_its_url_serves_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    make_run(tmp_path / "runs" / "first")
    with ui_server(str(tmp_path / "runs")) as (url, process, lines):
        assert url.startswith("http://127.0.0.1:") and "?token" not in url
        status, headers, body = get(url)
        assert status == 200 and b"/run/" in body and headers["content-type"].startswith("text/html")
        process.send_signal(signal.SIGINT)
        rest = process.communicate(timeout=20)[0]
    assert process.returncode == 0
    assert rest.strip().splitlines()[-1] == "hookdet ui: stopped" and "Traceback" not in rest


def test_paths_from_urls_are_resolved_inside_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(root / "mine")
    make_run(root / "odd #1? 50% done")
    outside = make_run(tmp_path / "outside")
    (root / "link-out").symlink_to(outside)  # a run directory that is a symlink out of the root
    key = root_key(root)
    with ui_server(str(root)) as (url, _, _):
        base = url.rstrip("/")
        status, _, listing = get(f"{base}/")
        assert status == 200 and b"link-out" not in listing and b"/mine" in listing  # not listed either
        assert get(f"{base}/run/{key}/mine")[0] == 200
        (odd,) = [row["url"] for row in json.loads(get(f"{base}/api/list")[2])["rows"] if "odd" in row["url"]]
        status, _, page = get(base + odd)  # a name with #, ? and % opens from its link
        assert status == 200 and b"odd #1? 50% done" in page, (odd, status)
        assert get(f"{base}/api/run/{key}/mine")[0] == 200
        refused = [f"/run/{key}/../outside", f"/run/{key}/%2e%2e/outside", f"/run/{key}/..%2foutside",
                   f"/api/run/{key}/%2E%2E%2Foutside", f"/run/{key}/link-out", f"/api/run/{key}/link-out",
                   f"/run/{key}/{tmp_path}/outside", "/run/00000000/mine", f"/search/{key}/mine",
                   "/static/..%2f..%2fapp.py", "/static/app.py", f"/compare?run={key}/../outside&run={key}/mine"]
        for path in refused:
            status, _, body = get(base + path)
            assert status == 404, (path, status, body[:200])
            assert b"validation_loss" not in body


def test_no_request_changes_anything_on_disk(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(root / "a", state="running")
    make_run(root / "b")
    key = root_key(root)
    before = snapshot(root)
    with ui_server(str(root)) as (url, _, _):
        base = url.rstrip("/")
        pages = ["/", "/api/list", f"/run/{key}/a", f"/api/run/{key}/a?log=0", f"/run/{key}/b",
                 f"/compare?run={key}/a&run={key}/b", f"/api/compare?run={key}/a&run={key}/b"]
        for page in pages:
            assert get(base + page)[0] == 200, page
            for method in ("POST", "PUT", "DELETE"):
                assert get(base + page, method=method)[0] == 405, (method, page)
    assert snapshot(root) == before


def test_off_this_machine_every_request_needs_the_printed_token(tmp_path: Path) -> None:
    make_run(tmp_path / "runs" / "first")
    with ui_server(str(tmp_path / "runs"), "--host", "0.0.0.0") as (url, _, lines):
        (token,) = re.findall(r"token=([\w-]+)", url)
        assert "0.0.0.0" not in url  # a wildcard is printed as an address another machine can open
        assert any("every request needs this token" in line and token in line for line in lines)
        base = url.split("?")[0].replace("0.0.0.0", "127.0.0.1").rstrip("/")
        for path in ("/", "/api/list", "/static/ui.js"):
            assert get(base + path)[0] == 403, path
        assert get(base + "/?token=not-" + token)[0] == 403
        status, headers, _ = get(f"{base}/?token={token}")
        assert status == 303 and headers["location"].endswith("/") and "token" not in headers["location"]
        cookie = headers["set-cookie"].split(";")[0]
        assert get(base + "/", cookie=cookie)[0] == 200
        assert get(base + "/api/list", cookie=cookie)[0] == 200
        assert get(base + "/", cookie=cookie.split("=")[0] + "=wrong")[0] == 403


def test_other_sites_cannot_read_it_and_secrets_are_shown_hidden(tmp_path: Path) -> None:
    """A request naming another host (a page the user visits, reaching 127.0.0.1 through DNS
    rebinding) is refused with nothing of the runs in it; every answer carries the headers that
    keep other pages out (CSP, no frames, no type sniffing); an S3 secret key and a password in
    an experiment are hidden on the run and compare pages, a hyperparameter named like a token is not."""
    run = make_run(tmp_path / "runs" / "first")
    config = json.loads((run / "config.json").read_text())
    config["checkpoint_storage"] = {"type": "s3", "bucket": "b", "secret_key": "s3-SECRET-value"}
    config["hyperparameters"].update(max_tokens=77, tokenizer="wordpiece")
    config["data"] = {"url": "https://example.com", "password": "db-SECRET-value"}
    (run / "config.json").write_text(json.dumps(config))
    key = root_key(tmp_path / "runs")
    with ui_server(str(tmp_path / "runs")) as (url, _, _):
        base = url.rstrip("/")
        port = base.rsplit(":", 1)[1]
        for host in ("evil.example.com", f"evil.example.com:{port}", f"127.0.0.1.evil.example.com:{port}"):
            status, _, body = get(base + "/api/list", host=host)
            assert status == 403 and b"first" not in body, (host, status, body[:200])
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert get(base + "/api/list", host=host)[0] == 200, host
        for path in ("/", "/api/list", "/static/ui.js", f"/run/{key}/first"):
            status, headers, _ = get(base + path)
            assert status == 200, path
            assert "frame-ancestors 'none'" in headers["content-security-policy"] and "script-src 'self'" in \
                headers["content-security-policy"], path
            assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff", path
        for path in (f"/run/{key}/first", f"/compare?run={key}/first&run={key}/first"):
            status, _, body = get(base + path)
            assert status == 200 and b"SECRET" not in body and b"********" in body, path
            assert b"wordpiece" in body and b"77" in body, path


def damage(root: Path) -> None:
    """Under ``root``: a good run, a run whose ``run.json`` has a field of the wrong type, a
    search whose ``search.json`` is not JSON, a run whose ``config.json`` is torn."""
    make_run(root / "good")
    (make_run(root / "odd-record") / "run.json").write_text(json.dumps({"state": "completed", "batches_trained": "x"}))
    (root / "torn-search").mkdir()
    (root / "torn-search" / "search.json").write_text("{not json")
    (make_run(root / "torn-config") / "config.json").write_text('{"name": ')


def listed(base: str) -> Dict[str, Dict[str, object]]:
    """The list's rows by name, after checking the list page and its JSON both answer."""
    assert get(base + "/")[0] == 200
    status, _, body = get(base + "/api/list")
    assert status == 200, body[:300]
    return {row["name"]: row for row in json.loads(body)["rows"]}


def test_one_damaged_file_marks_its_run_and_everything_else_is_served(tmp_path: Path) -> None:
    """A record file of the wrong type or not JSON marks that run or search ``damaged`` on the
    list, with why; the rest is listed and opens; the damaged run's page is one line (422); a
    path with a NUL byte is a 404 and a bad query a 400, never a 500."""
    root = tmp_path / "runs"
    damage(root)
    key = root_key(root)
    with ui_server(str(root)) as (url, _, _):
        base = url.rstrip("/")
        rows = listed(base)
        assert set(rows) == {"good", "odd-record", "torn-search", "torn-config"}
        assert rows["good"]["state"] == "completed" and "damaged" not in rows["good"]
        assert rows["odd-record"]["state"] == "damaged" and "invalid literal for int()" in rows["odd-record"]["damaged"]
        assert rows["torn-search"]["state"] == "damaged" and "search.json: unreadable" in rows["torn-search"]["damaged"]
        assert get(base + rows["good"]["url"])[0] == 200 and get(base + rows["torn-config"]["url"])[0] == 200
        status, _, body = get(base + rows["odd-record"]["url"])
        assert status == 422 and body.startswith(b"damaged: ") and b"\n" not in body.strip(), body[:300]
        assert get(f"{base}/run/{key}/good%00")[0] == 404
        status, _, body = get(f"{base}/api/run/{key}/good?log=abc")
        assert status == 400 and b"log='abc'" in body


def test_without_the_ui_extra_one_line_names_it(tmp_path: Path) -> None:
    code = "import sys; sys.modules['plotly'] = None; from hookdet.cli.commands import main; sys.exit(main(['ui']))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "hookdet: error: ui: the web view needs the 'ui' extra (plotly missing): pip install 'hookdet[ui]'"]


def test_a_static_file_is_served_while_a_run_is_being_read(tmp_path: Path, monkeypatch) -> None:
    """Reading a run's files happens off the event loop: while one request is still reading (held
    here on an event), a static file is answered. In this process, on uvicorn as ``hookdet ui``
    runs it."""
    import socket
    import threading

    import uvicorn

    from hookdet.ui import pages
    from hookdet.ui.app import build_app
    from hookdet.ui.catalog import Catalog

    make_run(tmp_path / "runs" / "one")
    release, reading = threading.Event(), threading.Event()
    original = pages.run_updates

    def held(*args: object, **kwargs: object) -> object:
        reading.set()
        assert release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(pages, "run_updates", held)
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(Catalog([tmp_path / "runs"])), log_level="warning"))
    serving = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    serving.start()
    base = f"http://127.0.0.1:{port}"
    answered: Dict[str, int] = {}
    try:
        slow = threading.Thread(target=lambda: answered.update(
            run=get(f"{base}/api/run/{root_key(tmp_path / 'runs')}/one")[0]))
        slow.start()
        assert reading.wait(60)
        status, _, body = get(f"{base}/static/ui.css")
        assert status == 200 and body and slow.is_alive()  # answered while the run was being read
        release.set()
        slow.join(60)
        assert answered == {"run": 200}
    finally:
        release.set()
        server.should_exit = True
        serving.join(30)


#: How a record file can be damaged: each makes the file's text from what it held.
DAMAGES = {
    "torn": lambda text: text[: max(1, len(text) // 2)],
    "empty": lambda text: "",
    "not-json": lambda text: "\x00\xff<html>not json at all\n" * 3,
    "wrong-type": lambda text: "\n".join(['[1, 2, 3]', '"a string"', '42', 'null']) + "\n",
    "huge": lambda text: text + ("\n" if text.endswith("}") else "") + '{"pad": "' + "x" * (24 * 2**20) + '"}\n',
}


def make_search(directory: Path) -> Path:
    """A search directory as the searcher leaves one: ``search.json``, ``search-state.json``, a trial."""
    trial = make_run(directory / "trial-001")
    directory.joinpath("search.json").write_text(json.dumps({
        "searcher": "adaptive_asha", "metric": "validation_loss", "smaller_is_better": True,
        "storage": "sqlite:///search.db", "experiment": {"name": directory.name}}))
    directory.joinpath("search-state.json").write_text(json.dumps({"order": ["r1"], "trials": {"r1": {
        "number": 1, "request_id": "r1", "seed": 1, "bracket": 0, "rung": 0, "state": "completed", "restarts": 0,
        "batches": 4, "target": 4, "validations": [[4, 0.5]], "dir": str(trial), "hparams": {"lr": 0.1}}}}))
    return directory


@pytest.mark.slow
def test_every_record_file_damaged_every_way_leaves_the_view_up(tmp_path: Path) -> None:
    """Each file a run or search keeps (run.json, config.json, history.jsonl, metrics.jsonl,
    metrics-summary.json, a rank's log; search.json, search-state.json), torn, empty, not JSON,
    of the wrong type and huge (24 MiB), each in a directory of its own: the list answers with
    every one of them, as it is or marked damaged with why, and every page and its updates
    answer 200 or one 422 line, never a 500."""
    root = tmp_path / "runs"
    make_run(root / "good")
    for name in ("run.json", "config.json", "history.jsonl", "metrics.jsonl", "metrics-summary.json", "logs/rank-0.log"):
        for how, damaged in DAMAGES.items():
            run_dir = make_run(root / f"{name.replace('/', '-')}-{how}")
            path = run_dir / name
            path.parent.mkdir(exist_ok=True)
            if name == "history.jsonl":
                path.write_text(json.dumps({"event": "started", "time": "2026-11-27T10:00:00+00:00"}) + "\n")
            if name == "metrics-summary.json":
                from hookdet.runs.metrics import summarize, write_summary

                write_summary(run_dir, summarize(run_dir))
            if name == "logs/rank-0.log":
                path.write_text("[2026-11-27T10:00:00+00:00] [rank=0] [stdout] a line\n")
            path.write_text(damaged(path.read_text()))
    for name in ("search.json", "search-state.json"):
        for how, damaged in DAMAGES.items():
            path = make_search(root / f"search-{name}-{how}") / name
            path.write_text(damaged(path.read_text()))
    (make_search(root / "search-trial-damaged") / "trial-001" / "run.json").write_text("{torn")
    names = {path.name for path in root.iterdir()}
    with ui_server(str(root)) as (url, _, _):
        base = url.rstrip("/")
        rows = listed(base)
        assert names <= set(rows), sorted(names - set(rows))
        assert rows["good"]["state"] == "completed"
        assert rows["run.json-torn"]["state"] == "damaged" and "run.json: unreadable" in rows["run.json-torn"]["damaged"]
        assert "more than a run's record ever holds" in rows["run.json-huge"]["damaged"]
        assert rows["metrics-summary.json-torn"]["best"] == 0.5  # a damaged summary is read past, not believed
        with_a_damaged_trial = rows["search-trial-damaged"]
        assert with_a_damaged_trial["state"] != "damaged" and [t["state"] for t in with_a_damaged_trial["trials"]] == [
            "damaged"]
        for name, row in rows.items():
            if row["state"] == "damaged":
                assert row["damaged"], name
            page = get(base + row["url"])
            assert page[0] in (200, 422), (name, page[0], page[2][:300])
            api = get(base + row["url"].replace("/run/", "/api/run/", 1).replace("/search/", "/api/search/", 1))
            assert api[0] in (200, 422), (name, api[0], api[2][:300])
