"""``hookdet ui`` in a real headless Chromium, over real runs and a real search of the digits
example: every page loads with no console error and draws the traces its data implies, the list
sorts, filters and opens a search, what run files hold is shown as text (never run as HTML), and
an open run page shows a new validation of a live run within the 2-second bound.

With ``HOOKDET_UI_SCREENSHOTS=DIR`` the pages are also saved there as PNGs (docs/ui.md's pictures
come from this test: ``HOOKDET_UI_SCREENSHOTS=docs/images pytest -n 0 tests/test_ui_browser.py``).
"""
from __future__ import annotations

import json
import os
import shutil
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set

import pytest

from tests.support import hookdet_process
from tests.support.browser import browser, chromium_missing, console_errors, ui_server, wait_for, wait_ready
from tests.support.progress_trials import OddNamesTrial
from tests.support.shared import computed_once

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ODD_NAME = "<script>alert('name')</script>"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))]


def hookdet(*arguments: str, cwd: Path) -> hookdet_process.Hookdet:
    """``hookdet ARGUMENTS`` started; :func:`finished` waits for it."""
    return hookdet_process.start(*arguments, cwd=cwd, env=ENV)


def finished(process: hookdet_process.Hookdet) -> str:
    """What a started ``hookdet`` printed, once it ended well."""
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out[-2000:] + err[-3000:]
    return out


def run_dir_of(output: str) -> Path:
    (line,) = [line for line in output.splitlines() if line.strip().startswith("run directory:")]
    return Path(line.split(":", 1)[1].strip())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """The runs of :func:`train_the_site` (trained once for the session, only read) and a folder
    of this worker's where the live test adds its run; ``hookdet ui`` over both and a browser."""
    trained = computed_once(tmp_path_factory, "ui-site", train_the_site)
    live = tmp_path_factory.mktemp("site") / "runs"
    live.mkdir()
    with ui_server(str(trained["root"]), str(live)) as (url, _, _), browser() as driver:
        yield {"url": url.rstrip("/"), "driver": driver, "live": live, **trained}


def train_the_site(digits: Path) -> Dict[str, Path]:
    """The digits example trained and resumed with a change, its adaptive search (4 trials of at
    most 90 batches, to keep the suite quick), and a run whose names are HTML, in ``digits/runs``."""
    for path in (REPO / "examples" / "digits").iterdir():
        if path.is_file():
            shutil.copy(path, digits)
    # Independent runs side by side (each mostly waits on its own start-up), the resume after.
    started = [hookdet("run", "const.yaml", "--config", "searcher.max_length.epochs=2", cwd=digits),
               hookdet("run", "adaptive.yaml", "--config", "searcher.max_trials=4", "--config", "searcher.max_time=90",
                       cwd=digits)]
    (digits / "odd.yaml").write_text(textwrap.dedent(f"""
        name: "{ODD_NAME}"
        entrypoint: tests.support.progress_trials:OddNamesTrial
        hyperparameters: {{lr: 0.1, records: 8, global_batch_size: 2, note: "<b>bold</b>"}}
        searcher: {{name: single, metric: validation_loss, max_length: {{batches: 4}}}}
        """))
    odd = digits / "runs" / "<img src=x onerror=alert('dir')>"
    started.append(hookdet("run", "odd.yaml", "--model-dir", str(REPO), "--run-dir", str(odd), cwd=digits))
    first = run_dir_of(finished(started[0]))
    finished(hookdet("run", "const.yaml", "--resume", str(first), "--config", "searcher.max_length.epochs=3", cwd=digits))
    for process in started[1:]:
        finished(process)
    (search,) = [path for path in (digits / "runs").iterdir() if (path / "search.json").exists()]
    second = search / "trial-001"  # a run of the same trial, other hyperparameters: compared with the first
    return {"first": first, "second": second, "search": search, "odd": odd, "root": digits / "runs"}


def shot(driver: Any, name: str) -> None:
    """Save the page for docs/ui.md when asked to (``HOOKDET_UI_SCREENSHOTS``)."""
    folder = os.environ.get("HOOKDET_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        width, height = driver.get_window_size()["width"], driver.get_window_size()["height"]
        driver.set_window_size(width, max(700, min(3200, driver.execute_script("return document.body.scrollHeight") + 40)))
        time.sleep(1)  # charts follow the new width on their own resize handler
        driver.save_screenshot(str(Path(folder) / f"ui-{name}.png"))
        driver.set_window_size(width, height)


def open_page(site: Dict[str, Any], href: str) -> Any:
    driver = site["driver"]
    console_errors(driver)  # drop what earlier pages logged
    driver.get(href if href.startswith("http") else site["url"] + href)
    wait_ready(driver)
    return driver


def traces(driver: Any) -> Dict[str, int]:
    """Each Plotly chart on the page (by its element id) and how many traces it draws."""
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].map(d => [d.id, d.data.length]))")


def expected_run_charts(run_dir: Path) -> Dict[str, int]:
    """One chart per metric, one trace per group (training, validation) that reported it."""
    groups: Dict[str, Set[str]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        report = json.loads(line)
        for name in report["metrics"]:
            groups.setdefault(f"chart-{name}", set()).add(report["group"])
    return {chart: len(names) for chart, names in groups.items()}


def link_to(driver: Any, text: str) -> str:
    return driver.execute_script(
        "return [...document.querySelectorAll('a')].find(a => a.textContent === arguments[0]).href", text)


def test_every_page_loads_cleanly_and_draws_the_traces_its_data_implies(site: Dict[str, Any]) -> None:
    driver = open_page(site, "/")
    names = driver.execute_script("return [...document.querySelectorAll('#runs tbody tr')].map(r => r.cells[1].textContent)")
    assert sorted(names) == sorted([site["first"].name, site["search"].name, site["odd"].name])
    assert console_errors(driver) == []
    driver.find_element("css selector", "#runs button.toggle").click()  # the search's trials, for the picture
    shot(driver, "list")

    open_page(site, link_to(driver, site["first"].name))
    wait_for(lambda: traces(driver) == expected_run_charts(site["first"]))
    events = driver.execute_script("return [...document.querySelectorAll('#history tbody tr')].map(r => r.cells[0].textContent)")
    assert events == ["started", "completed", "resumed", "completed"]
    assert "searcher.max_length.epochs: 2 -> 3" in driver.find_element("id", "history").text
    assert driver.find_elements("css selector", "#checkpoints tbody tr td:last-child")[0].text == "yes"
    wait_for(lambda: "[rank=0]" in driver.find_element("id", "logs").text)
    assert console_errors(driver) == []
    shot(driver, "run")

    driver = open_page(site, "/")
    open_page(site, link_to(driver, site["search"].name))
    state = json.loads((site["search"] / "search-state.json").read_text())
    measured = sum(1 for trial in state["trials"].values() if trial["validations"])
    # importance is computed by a process of its own and drawn on a later poll than the curves
    charts = wait_for(lambda: (lambda found: found if found.get("curves") == measured and found.get("importance")
                               else None)(traces(driver)))
    webgl = driver.execute_script("return webgl")  # without it, parallel coordinates are lines in SVG, a trace a band
    lines = driver.execute_script("return document.getElementById('parallel').data.map(t => t.y.filter(v => v === null).length)")
    assert webgl or sum(lines) == measured  # a line per trial that has a value
    charts.pop("parallel")
    assert charts == {"curves": measured, "heatmap": 1, "scatter-dropout": 1,
                      "scatter-learning_rate": 1, "scatter-momentum": 1, "importance": 1}
    assert len(driver.find_elements("css selector", "#trials tbody tr")) == len(state["order"])
    rungs = driver.execute_script("return [...document.querySelectorAll('#rungs tbody tr')].map(r => r.cells[1].textContent)")
    assert rungs[0] == str(len(state["order"]))  # every trial reached the first rung
    shown_rungs = driver.execute_script("return [...document.querySelectorAll('#trials tbody tr')].map(r => r.cells[3].textContent)")
    assert shown_rungs == [str(state["trials"][rid]["rung"]) for rid in state["order"]]
    assert console_errors(driver) == []
    shot(driver, "search")

    driver = open_page(site, "/")
    driver.find_element("css selector", "#runs button.toggle").click()  # the search's trials
    for name in (site["first"].name, f"{site['search'].name}/{site['second'].name}"):
        driver.execute_script("[...document.querySelectorAll('#runs tbody tr')].find(r => r.cells[1].textContent === "
                              "arguments[0]).querySelector('input').click()", name)
    driver.find_element("id", "compare").click()
    wait_ready(driver)
    # One chart per metric, a trace per run and group.
    expected = {chart: 2 * groups for chart, groups in expected_run_charts(site["first"]).items()}
    assert wait_for(lambda: traces(driver) == expected or None)
    differing = [row.text for row in driver.find_elements("css selector", "#configs tr.differs th")]
    assert "≠ hyperparameters.learning_rate" in differing
    assert console_errors(driver) == []
    shot(driver, "compare")


def test_the_list_sorts_filters_and_opens_a_search(site: Dict[str, Any]) -> None:
    driver = open_page(site, "/")
    rows = "return [...document.querySelectorAll('#runs tbody tr')].map(r => r.cells[1].textContent)"
    driver.find_element("css selector", "#runs th[data-key=name]").click()
    names = driver.execute_script(rows)
    assert names == sorted(names)
    driver.find_element("css selector", "#runs th[data-key=name]").click()
    assert driver.execute_script(rows) == sorted(names, reverse=True)
    driver.find_element("id", "filter-name").send_keys("adaptive")
    assert driver.execute_script(rows) == [site["search"].name]
    driver.find_element("css selector", "#runs button.toggle").click()
    trials = driver.execute_script("return [...document.querySelectorAll('#runs tr.trial')].map(r => r.cells[3].textContent)")
    assert len(trials) == len(json.loads((site["search"] / "search-state.json").read_text())["order"])
    assert "stopped by the searcher" in trials


def test_what_run_files_hold_is_shown_as_text(site: Dict[str, Any]) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    driver = open_page(site, "/")
    assert site["odd"].name in driver.execute_script(
        "return [...document.querySelectorAll('#runs a')].map(a => a.textContent)")
    open_page(site, link_to(driver, site["odd"].name))
    wait_for(lambda: OddNamesTrial.LINE in driver.find_element("id", "logs").text)
    page_text = driver.find_element("tag name", "body").text
    for shown in (ODD_NAME, "<b>bold</b>", OddNamesTrial.LINE, site["odd"].name):
        assert shown in page_text, shown
    chart_titles = driver.execute_script("return [...document.querySelectorAll('.gtitle')].map(t => t.textContent)")
    assert OddNamesTrial.METRIC in chart_titles
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0
    assert driver.execute_script("return [...document.querySelectorAll('b')].filter(b => b.textContent === 'bold').length") == 0
    assert len(driver.find_elements("tag name", "script")) == 2  # plotly.min.js and ui.js, nothing else
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text
    assert console_errors(driver) == []


def test_an_open_run_page_shows_a_new_validation_within_two_seconds(site: Dict[str, Any]) -> None:
    experiment = site["live"].parent / "live.yaml"
    experiment.write_text(textwrap.dedent("""
        entrypoint: tests.support.progress_trials:SlowTrainingTrial
        hyperparameters: {lr: 0.1, records: 8, global_batch_size: 2, train_sleep_s: 0.05}
        searcher: {name: single, metric: validation_loss, max_length: {batches: 400}}
        min_validation_period: {batches: 10}
        """))
    run_dir = site["live"] / "live"
    process = hookdet("run", str(experiment), "--model-dir", str(REPO), "--run-dir", str(run_dir), cwd=site["live"].parent)
    try:
        metrics = run_dir / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and '"validation"' in metrics.read_text(), timeout=300)
        driver = open_page(site, f"/run/{_root_key(site['live'])}/live")
        points = "const d = document.getElementById('chart-validation_loss'); return d && d.data ? d.data[0].x.length : 0"
        lags: List[float] = []
        for _ in range(3):
            before = wait_for(lambda: driver.execute_script(points))
            wait_for(lambda: _validations(metrics) > before, timeout=120, every=0.01)
            written = time.monotonic()
            wait_for(lambda: driver.execute_script(points) > before, timeout=10, every=0.02)
            lags.append(time.monotonic() - written)
        assert max(lags) < 2.0, lags
        assert console_errors(driver) == []
    finally:
        process.kill()
        process.communicate()


def _validations(metrics: Path) -> int:
    return sum(1 for line in metrics.read_text().splitlines() if '"validation"' in line and line.endswith("}"))


def _root_key(root: Path) -> str:
    from hookdet.ui.catalog import root_key

    return root_key(root)


def test_in_the_browser_paths_out_of_a_root_are_refused_and_off_this_machine_the_token_is_needed(
        site: Dict[str, Any]) -> None:
    driver = site["driver"]
    key = _root_key(site["root"])
    outside = site["root"].parent / "outside"
    if not outside.exists():
        outside.mkdir()
        (outside / "config.json").write_text("{}")
        (site["root"] / "link-out").symlink_to(outside)
    for path in (f"/run/{key}/../outside", f"/run/{key}/%2e%2e/outside", f"/run/{key}/link-out"):
        driver.get(site["url"] + path)
        assert driver.find_element("tag name", "body").text.startswith("not found:"), path
    with ui_server(str(site["root"]), "--host", "0.0.0.0") as (url, _, _):
        bare = url.split("?")[0].replace("0.0.0.0", "127.0.0.1")
        driver.get(bare)
        assert "needs its access token" in driver.find_element("tag name", "body").text
        driver.get(url.replace("0.0.0.0", "127.0.0.1"))  # the printed URL: the token, then a cookie
        wait_ready(driver)
        assert "token" not in driver.current_url
        console_errors(driver)  # drop the refusals' own 404 and 403 lines
        driver.get(bare + "run/" + key + "/" + site["first"].name)  # the cookie carries it on
        wait_ready(driver)
        assert console_errors(driver) == []


def test_a_categorical_hyperparameter_holding_html_is_a_label_not_markup(site: Dict[str, Any]) -> None:
    """A search whose trials differ in a categorical hyperparameter that holds HTML (a copy of
    the trained search, its state edited: nothing trains): the scatter's tick labels show the
    text, with no link and no bold drawn from it."""
    copy = site["live"] / "html-search"
    if not copy.exists():
        shutil.copytree(site["search"], copy)
        state_file = copy / "search-state.json"
        state = json.loads(state_file.read_text())
        for number, trial in enumerate(state["trials"].values()):
            trial["hparams"]["note"] = f"<a href='https://example.com/{number}'>link {number}</a><b>bold</b>"
        state_file.write_text(json.dumps(state))
    driver = open_page(site, "/search/" + _root_key(site["live"]) + "/html-search")
    wait_for(lambda: driver.execute_script("return document.getElementById('scatter-note') !== null"
                                           " && document.getElementById('scatter-note').data !== undefined"))
    ticks = driver.execute_script(
        "return [...document.querySelectorAll('#scatter-note .xtick text')].map(t => t.textContent)")
    assert any("<a href='https://example.com/" in tick and "<b>bold</b>" in tick for tick in ticks), ticks
    assert driver.execute_script("return document.querySelectorAll('#scatter-note a[href*=\"example.com\"]').length") == 0
    assert driver.execute_script("return document.querySelectorAll('#scatter-note .xtick b, #scatter-note .xtick tspan[style*=\"bold\"]').length") == 0
    assert console_errors(driver) == []
    shot(driver, "search-html-categorical")


def test_a_damaged_run_is_a_row_that_says_so_and_the_list_stays_up(site: Dict[str, Any]) -> None:
    """A run whose ``run.json`` holds a field of the wrong type, beside the trained runs: the
    list in the browser shows it ``damaged`` with why, every other row as before, no error."""
    from tests.test_ui_server import make_run

    damaged = site["live"] / "damaged-record"
    if not damaged.exists():
        (make_run(damaged) / "run.json").write_text(json.dumps({"state": "completed", "batches_trained": "x"}))
    driver = open_page(site, "/")
    rows = "return [...document.querySelectorAll('#runs tbody tr')].map(r => [r.cells[1].textContent, r.cells[3].textContent, r.cells[4].textContent])"
    wait_for(lambda: any(row[0] == "damaged-record" for row in driver.execute_script(rows)))
    shown = {row[0]: row for row in driver.execute_script(rows)}
    assert shown["damaged-record"][1] == "damaged" and "invalid literal for int()" in shown["damaged-record"][2]
    assert site["first"].name in shown and shown[site["first"].name][1] == "completed"
    assert console_errors(driver) == []
    shot(driver, "list-damaged")


def test_a_search_copied_from_another_machine_shows_its_trials(site: Dict[str, Any]) -> None:
    """A copy of the trained search whose state names its trials by absolute paths of another
    machine (gone here): its page finds them in the copy, by name, and draws their curves."""
    copy = site["live"] / "from-elsewhere"
    if not copy.exists():
        shutil.copytree(site["search"], copy)
        state_file = copy / "search-state.json"
        state = json.loads(state_file.read_text())
        for trial in state["trials"].values():
            trial["dir"] = str(Path("/nowhere/on/this/machine") / Path(trial["dir"]).name)
        state_file.write_text(json.dumps(state))
    driver = open_page(site, "/search/" + _root_key(site["live"]) + "/from-elsewhere")
    trials = len(json.loads((copy / "search-state.json").read_text())["order"])
    wait_for(lambda: len(driver.execute_script("return [...document.querySelectorAll('#trials tbody tr')]")) == trials)
    wait_for(lambda: traces(driver).get("curves", 0) > 0)
    assert console_errors(driver) == []
    shot(driver, "search-from-elsewhere")


def test_a_core_api_runs_own_progress_and_status_are_shown(site: Dict[str, Any]) -> None:
    """A Core API script reports how far it is (``report_progress``) and what it does
    (``set_status``) into its ``run.json``: the list's progress cell and the run page show both."""
    from tests.test_ui_server import make_run

    core = site["live"] / "core-api-run"
    if not core.exists():
        record = json.loads((make_run(core) / "run.json").read_text())
        record.update(state="preempted", max_batches=None, progress=0.5, status="evaluating", core_api=True)
        (core / "run.json").write_text(json.dumps(record))
    driver = open_page(site, "/")
    cells = "return [...document.querySelectorAll('#runs tbody tr')].map(r => [r.cells[1].textContent, r.cells[4].textContent])"
    wait_for(lambda: any(row[0] == "core-api-run" for row in driver.execute_script(cells)))
    assert dict(driver.execute_script(cells))["core-api-run"] == "50% · evaluating"
    driver = open_page(site, link_to(driver, "core-api-run"))
    wait_for(lambda: "status" in driver.find_element("id", "summary").text)
    summary = driver.find_element("id", "summary").text
    assert "progress 50%" in summary and "status evaluating" in summary, summary
    assert console_errors(driver) == []
    shot(driver, "run-core-api")


def test_the_search_page_tells_what_is_true_now(site: Dict[str, Any]) -> None:
    """A copy of the trained search, one trial made to train now (its run.json running, by this
    live process; the search's state file says queued, as it does between decisions): the trials
    table says running with its progress and sorts by a column; the heat map leaves cells no trial
    fell in blank; the log hyperparameter is drawn on a log axis; Optuna's importance is drawn.
    A trial's run page: a NaN validation is said, not silently left out; a start with no end in
    its history is shown killed; its validations are a table; its logs filter by text and level
    and download whole; a metrics.jsonl replaced under the open page redraws its chart."""
    import socket
    import urllib.request

    from hookdet.runs.record import process_start

    copy = site["live"] / "truth-search"
    shutil.copytree(site["search"], copy)
    state_file = copy / "search-state.json"
    state = json.loads(state_file.read_text())
    first_id, second_id = state["order"][:2]
    state["trials"][first_id].update(state="queued", target=90)
    for trial in state["trials"].values():
        trial["dir"] = str(copy / Path(trial["dir"]).name)
    state_file.write_text(json.dumps(state))
    first = copy / Path(state["trials"][first_id]["dir"]).name
    record = json.loads((first / "run.json").read_text())
    record.update(state="running", pid=os.getpid(), pid_started=process_start(os.getpid()), host=socket.gethostname())
    (first / "run.json").write_text(json.dumps(record))

    driver = open_page(site, "/search/" + _root_key(site["live"]) + "/truth-search")
    rows = "return [...document.querySelectorAll('#trials tbody tr')].map(r => [...r.cells].map(c => c.textContent))"
    wait_for(lambda: len(driver.execute_script(rows)) == len(state["order"]))
    shown = {row[0]: row for row in driver.execute_script(rows)}
    number = state["trials"][first_id]["number"]
    assert shown[f"trial {number}"][1] == "running" and " / 90" in shown[f"trial {number}"][6], shown
    assert "running 1" in driver.find_element("id", "search-counts").text
    driver.execute_script("[...document.querySelectorAll('#trials th')].find(th => th.textContent.startsWith('best')).click()")
    bests = [row[4] for row in driver.execute_script(rows)]
    numbers = [float(value) for value in bests if value != "-"]
    assert numbers == sorted(numbers) and bests[: len(numbers)] == [value for value in bests if value != "-"]
    wait_for(lambda: traces(driver).get("importance") == 1)
    z = driver.execute_script("return document.getElementById('heatmap').data[0].z.flat()")
    assert None in z and all(value is None or value > 0 for value in z)  # empty cells blank, not 0
    assert driver.execute_script("return document.getElementById('scatter-learning_rate').layout.xaxis.type") == "log"
    searched = driver.execute_script("return document.getElementById('importance').data[0].y")
    assert sorted(searched) == ["dropout", "learning_rate", "momentum"]
    # At first the hyperparameter plots show the searcher's metric, not the first metric named.
    searcher_metric = json.loads((copy / "search.json").read_text())["metric"]
    assert driver.execute_script("return document.getElementById('plot-metric').value") == searcher_metric
    assert searcher_metric in driver.execute_script("return document.getElementById('scatter-dropout').layout.title.text")
    # The hyperparameter plots at a rung: only the trials that trained that far, each at that length.
    driver.execute_script("const a = document.getElementById('plot-at'); a.value = 'rung:1'; a.dispatchEvent(new Event('change'));")
    reached = sum(1 for trial in state["trials"].values() if (trial.get("rung") or 0) >= 1)
    wait_for(lambda: driver.execute_script("return document.getElementById('plotted').textContent")
             == f"{reached} of {len(state['order'])} trials have a value there")
    wait_for(lambda: driver.execute_script("return document.getElementById('scatter-dropout').data[0].x.length") == reached)
    driver.execute_script("const m = document.getElementById('plot-metric'); m.value = 'accuracy'; m.dispatchEvent(new Event('change'));")
    wait_for(lambda: "accuracy" in driver.execute_script("return document.getElementById('scatter-dropout').layout.title.text"))
    assert "accuracy" in driver.find_element("id", "importance-of").text  # the importance of what is plotted
    assert console_errors(driver) == []
    shot(driver, "search-truth")

    second = copy / Path(state["trials"][second_id]["dir"]).name
    lines = (second / "metrics.jsonl").read_text().splitlines()
    validations = [json.loads(line) for line in lines if json.loads(line)["group"] == "validation"]
    nan = dict(validations[-1], steps_completed=validations[-1]["steps_completed"] + 1,
               metrics={"validation_loss": float("nan"), "accuracy": 0.5})
    (second / "metrics.jsonl").write_text("\n".join(lines + [json.dumps(nan)]) + "\n")
    history = [json.loads(line) for line in (second / "history.jsonl").read_text().splitlines()]
    (second / "history.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in
                                                  [history[0], dict(history[0], event="resumed")] + history[1:]))
    driver = open_page(site, "/run/" + _root_key(site["live"]) + f"/truth-search/{second.name}")
    wait_for(lambda: "NaN or infinite" in driver.execute_script(
        "const d = document.getElementById('chart-validation_loss'); return d && d.layout ? d.layout.title.text : ''"))
    events = driver.execute_script("return [...document.querySelectorAll('#history tbody tr')].map(r => r.cells[0].textContent)")
    assert events[:3] == ["started", "killed", "resumed"], events
    wait_for(lambda: len(driver.find_elements("css selector", "#validations tbody tr")) == len(validations) + 1)
    wait_for(lambda: "[rank=0]" in driver.find_element("id", "logs").text)
    search_box = driver.find_element("id", "log-search")
    search_box.send_keys("no line holds this text")
    assert driver.find_element("id", "logs").text == ""
    search_box.clear()
    driver.execute_script("const s = document.getElementById('log-search'); s.value = ''; s.dispatchEvent(new Event('input'));"
                          "const l = document.getElementById('log-level'); l.value = 'INFO'; l.dispatchEvent(new Event('change'));")
    shown_lines = driver.find_element("id", "logs").text.splitlines()
    assert shown_lines and all(" INFO " in line for line in shown_lines)
    download = driver.find_element("id", "log-download").get_attribute("href")
    with urllib.request.urlopen(download, timeout=60) as answer:
        whole = answer.read().decode()
        assert answer.headers["Content-Disposition"].startswith("attachment;")
    assert whole.count("\n") >= len(shown_lines) and "[rank=0]" in whole
    assert console_errors(driver) == []
    shot(driver, "run-truth")

    # A resume rewrote the reports: the open chart shows the new file's points, not the old ones.
    replaced = [dict(report, metrics={"validation_loss": 42.0}) for report in validations]
    partial = second / "metrics.new"
    partial.write_text("".join(json.dumps(report) + "\n" for report in replaced))
    os.replace(partial, second / "metrics.jsonl")
    wait_for(lambda: driver.execute_script(
        "const d = document.getElementById('chart-validation_loss');"
        "return d.data.length === 1 && d.data[0].y.length > 0 && d.data[0].y.every(v => v === 42)"))
    assert console_errors(driver) == []
