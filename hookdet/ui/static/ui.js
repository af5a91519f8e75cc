// hookdet ui: what each page does in the browser. The pages come rendered from the server;
// this asks /api/... for what is new every second (saying what it has), keeps the tables
// current and hands data to Plotly, which draws every chart. Text from run files is only ever
// set as text (textContent), never parsed as HTML.
"use strict";

const POLL_MS = 700;
// Log lines a run page keeps (as the server keeps them: hookdet/ui/records.py LOG_LINES).
const LOG_LINES = 2000;
// Validations a run page keeps (as the server keeps them: hookdet/ui/records.py VALIDATIONS).
const VALIDATIONS = 2000;

// Plotly loads deferred (its 3.5 MB are parsed while the page's first question is answered): the
// charts wait for it. This script runs first (at the end of the body; Plotly's tag is deferred).
const plotlyTag = document.getElementById("plotly");
const plotlyReady = !plotlyTag || window.Plotly ? Promise.resolve()
  : new Promise((resolve) => plotlyTag.addEventListener("load", resolve, {once: true}));

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function link(href, text) {
  const a = el("a", text);
  a.href = href;
  return a;
}

// Plotly's labels take a little HTML: what comes from run files is escaped for them.
function plotText(value) {
  return String(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function number(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? String(value) : value.toPrecision(4);
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(s % 60).padStart(2, "0")}s` : `${s}s`;
}

// An answer's text, for a page that tells "nothing new" by comparing it with the last one
// before parsing it.
async function fetchText(url) {
  const response = await fetch(url, {credentials: "same-origin"});
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  return response.text();
}

async function fetchJSON(url) {
  return JSON.parse(await fetchText(url));
}

function poll(step) {
  const again = () => step().catch((error) => console.warn(String(error))).finally(() => setTimeout(again, POLL_MS));
  return step().then(() => { document.body.dataset.ready = "1"; }).finally(() => setTimeout(again, POLL_MS));
}

// ---------------------------------------------------------------- series kept by a page

// A page's copy of the server's series: {key: {epoch, x, y, tail}}; what it has goes back as
// `have`, and each answer brings only the points after it (all of them after a thinning).
class SeriesStore {
  constructor() { this.series = {}; }
  have() {
    const have = {};
    for (const [key, s] of Object.entries(this.series)) have[key] = [s.epoch, s.x.length];
    return encodeURIComponent(JSON.stringify(have));
  }
  merge(updates) {
    for (const [key, u] of Object.entries(updates)) {
      const s = this.series[key];
      if (!s || s.epoch !== u.epoch || u.from === 0) {
        this.series[key] = {epoch: u.epoch, x: u.x.slice(), y: u.y.slice(), tail: u.tail, meta: u};
      } else {
        s.x.push(...u.x); s.y.push(...u.y); s.tail = u.tail; s.meta = u;
      }
    }
  }
  points(key) {
    const s = this.series[key];
    return s.tail ? [s.x.concat([s.tail[0]]), s.y.concat([s.tail[1]])] : [s.x, s.y];
  }
}

function smooth(ys, weight) {
  if (!weight) return ys;
  const out = [];
  let last = null;
  for (const y of ys) { last = last === null ? y : last * weight + (1 - weight) * y; out.push(last); }
  return out;
}

function layout(title, logScale, xTitle) {
  return {title: {text: plotText(title), font: {size: 14}, x: 0.02, y: 0.98}, margin: {l: 56, r: 16, t: 64, b: 40}, hovermode: "x unified",
          showlegend: true,
          xaxis: {title: {text: plotText(xTitle || "batches")}}, yaxis: {type: logScale ? "log" : "linear"},
          legend: {orientation: "h", x: 0, y: 1, xanchor: "left", yanchor: "bottom"}};
}

function chartDiv(container, id) {
  let div = document.getElementById(id);
  if (!div) { div = el("div"); div.id = id; div.className = "chart"; container.appendChild(div); }
  return div;
}

// ---------------------------------------------------------------- the list

function listPage() {
  let rows = JSON.parse(document.getElementById("initial").textContent);
  const open = new Set(), chosen = new Set();
  let sortKey = "started", descending = true;
  const nameFilter = document.getElementById("filter-name"), stateFilter = document.getElementById("filter-state");
  const compare = document.getElementById("compare");

  function cells(row, isTrial, index) {
    const tr = el("tr", null, isTrial ? "trial" : row.kind);
    const first = el("td");
    if (row.kind === "search") {
      const button = el("button", open.has(row.url) ? "▾" : "▸", "toggle");
      button.title = "show its trials";
      button.onclick = () => { open.has(row.url) ? open.delete(row.url) : open.add(row.url); render(); };
      first.appendChild(button);
    } else {
      const box = el("input"); box.type = "checkbox"; box.checked = chosen.has(row.url);
      box.onchange = () => { box.checked ? chosen.add(row.url) : chosen.delete(row.url); compare.disabled = chosen.size < 2; };
      first.appendChild(box);
    }
    tr.appendChild(first);
    const name = el("td"); name.appendChild(link(row.url, row.name)); tr.appendChild(name);
    tr.appendChild(el("td", row.kind));
    tr.appendChild(el("td", row.state, "state state-" + String(row.state).split(" ")[0]));
    const progress = el("td");
    if (row.damaged) {
      progress.textContent = row.damaged;
    } else if (row.max_batches) {
      const bar = el("span", null, "progress"), fill = el("span");
      fill.style.width = `${Math.min(100, 100 * row.batches / row.max_batches)}%`;
      bar.appendChild(fill); progress.appendChild(bar);
      progress.appendChild(document.createTextNode(`${row.batches} / ${row.max_batches}`));
    } else if (row.progress !== null && row.progress !== undefined) {
      const bar = el("span", null, "progress"), fill = el("span");
      fill.style.width = `${Math.min(100, 100 * row.progress)}%`;
      bar.appendChild(fill); progress.appendChild(bar);
      progress.appendChild(document.createTextNode(`${Math.floor(100 * row.progress)}%` + (row.status ? ` · ${row.status}` : "")));
    } else if (row.kind === "search") {
      progress.textContent = Object.entries(row.counts || {}).map(([s, n]) => `${s} ${n}`).join(", ") || "no trials yet";
    } else {
      progress.textContent = String(row.batches);
    }
    tr.appendChild(progress);
    tr.appendChild(el("td", row.best === null || row.best === undefined ? "-" : `${row.metric}=${number(row.best)}`));
    tr.appendChild(el("td", String(row.started || "-").replace("T", " ").slice(0, 19)));
    tr.appendChild(el("td", duration(row.seconds)));
    return tr;
  }

  function shown(row) {
    const name = nameFilter.value.toLowerCase(), state = stateFilter.value;
    const matches = (r) => (!name || r.name.toLowerCase().includes(name)) && (!state || r.state === state);
    return matches(row) || (row.trials || []).some(matches);
  }

  function render() {
    const body = document.querySelector("#runs tbody");
    const sorted = rows.filter(shown).sort((a, b) => {
      const x = a[sortKey], y = b[sortKey];
      const order = x === y ? 0 : (x === null || x === undefined) ? 1 : (y === null || y === undefined) ? -1 : x < y ? -1 : 1;
      return descending ? -order : order;
    });
    body.replaceChildren();
    for (const row of sorted) {
      body.appendChild(cells(row, false));
      if (open.has(row.url)) for (const trial of row.trials || []) body.appendChild(cells(trial, true));
    }
    const states = new Set(rows.flatMap((r) => [r.state, ...(r.trials || []).map((t) => t.state)]));
    const known = new Set([...stateFilter.options].map((o) => o.value));
    for (const state of [...states].sort()) if (!known.has(state)) stateFilter.appendChild(new Option(state, state));
    document.getElementById("counts").textContent = `${sorted.length} of ${rows.length} shown`;
    for (const th of document.querySelectorAll("#runs th[data-key]")) {
      th.className = th.dataset.key === sortKey ? (descending ? "sorted-down" : "sorted-up") : "";
    }
  }

  for (const th of document.querySelectorAll("#runs th[data-key]")) {
    th.onclick = () => { descending = th.dataset.key === sortKey ? !descending : false; sortKey = th.dataset.key; render(); };
  }
  nameFilter.oninput = render; stateFilter.onchange = render;
  compare.onclick = () => {
    const query = [...chosen].map((url) => "run=" + encodeURIComponent(url.split("/").slice(2).join("/"))).join("&");
    window.location.href = "/compare?" + query;
  };
  render();
  document.body.dataset.ready = "1";
  const again = () => fetchJSON("/api/list").then((answer) => { rows = answer.rows; render(); })
    .catch((error) => console.warn(String(error))).finally(() => setTimeout(again, 2 * POLL_MS));
  setTimeout(again, 2 * POLL_MS);
}

// ---------------------------------------------------------------- a run

function runPage() {
  const summary = document.getElementById("summary"), api = summary.dataset.api;
  const store = new SeriesStore(), charts = document.getElementById("charts");
  const logScale = document.getElementById("log-scale"), smoothing = document.getElementById("smoothing");
  const logs = document.getElementById("logs");
  const logRank = document.getElementById("log-rank"), logLevel = document.getElementById("log-level");
  const logSearch = document.getElementById("log-search");
  let logCount = 0;

  function draw() {
    const weight = Number(smoothing.value);
    document.getElementById("smoothing-value").textContent = weight.toFixed(2);
    const byMetric = {};
    for (const key of Object.keys(store.series).sort()) {
      const [group, metric] = [key.slice(0, key.indexOf("/")), key.slice(key.indexOf("/") + 1)];
      (byMetric[metric] = byMetric[metric] || []).push([group, key]);
    }
    for (const [metric, keys] of Object.entries(byMetric)) {
      const traces = keys.map(([group, key]) => {
        const [x, y] = store.points(key);
        return {x, y: smooth(y, weight), name: group, mode: group === "validation" ? "lines+markers" : "lines"};
      });
      // NaN and infinite values are no point of a curve: the title says how many there were
      const missing = keys.map(([group, key]) => nonfinite[key]
        ? `${nonfinite[key]} ${group} value${nonfinite[key] === 1 ? "" : "s"} NaN or infinite` : "")
        .filter(Boolean).join(", ");
      Plotly.react(chartDiv(charts, "chart-" + metric), traces, layout(missing ? `${metric} (${missing}, not drawn)` : metric, logScale.checked));
    }
  }

  function showSummary(s) {
    summary.replaceChildren();
    const field = (label, value, className) => {
      const span = el("span", null, "field"); span.appendChild(el("b", label + " "));
      span.appendChild(el("span", value, className)); summary.appendChild(span);
    };
    field("state", s.state, "state state-" + s.state);
    field("batches", s.max_batches ? `${s.batches} / ${s.max_batches} (${Math.floor(100 * s.batches / s.max_batches)}%)` : s.batches);
    if (s.progress !== null && s.progress !== undefined) field("progress", `${Math.floor(100 * s.progress)}%`);
    if (s.status) field("status", s.status);
    field("best " + (s.metric || "metric"), number(s.best));
    field("started", String(s.started || "-").replace("T", " ").slice(0, 19));
    field("duration", duration(s.seconds));
  }

  // The lines kept on the page (the server's newest LOG_LINES), shown through the rank, level and text filters.
  let kept = [];
  const rankOf = (line) => (line.match(/\[rank=(\d+)\]/) || [])[1];
  const levelOf = (line) => (line.match(/\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b/) || [])[1];
  function showLogs() {
    const rank = logRank.value, level = logLevel.value, text = logSearch.value.toLowerCase();
    const shown = kept.filter((line) => (!rank || rankOf(line) === rank) && (!level || levelOf(line) === level) &&
                                        (!text || line.toLowerCase().includes(text)));
    const atBottom = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
    logs.textContent = shown.length ? shown.join("\n") + "\n" : "";
    document.getElementById("log-count").textContent =
      `${logCount} lines` + (shown.length !== kept.length ? `, ${shown.length} of the newest ${kept.length} shown` : "");
    if (atBottom) logs.scrollTop = logs.scrollHeight;
  }

  function addLogs(update) {
    if (update.reset) kept = [];
    if (!update.lines.length && !update.reset) return;
    kept = kept.concat(update.lines).slice(-LOG_LINES);
    logCount = update.count;
    const known = new Set([...logRank.options].map((o) => o.value));
    for (const rank of new Set(update.lines.map(rankOf))) if (rank !== undefined && !known.has(rank)) logRank.appendChild(new Option(`rank ${rank}`, rank));
    showLogs();
  }

  // The run's validations the page holds (the newest VALIDATIONS), updated with those after them.
  let validations = [], validationsHad = "";
  function validationsTable(update) {
    validationsHad = `${update.epoch}.${update.count}`;
    if (!update.reset && !update.rows.length) return;
    validations = (update.reset ? update.rows : validations.concat(update.rows)).slice(-VALIDATIONS);
    const names = [...new Set(validations.flatMap((v) => Object.keys(v.metrics)))].sort();
    const head = el("tr");
    for (const name of ["batch", ...names]) head.appendChild(el("th", name));
    const table = document.getElementById("validations");
    table.tHead.replaceChildren(head);
    table.tBodies[0].replaceChildren(...validations.slice().reverse().map((v) => {
      const tr = el("tr");
      tr.appendChild(el("td", String(v.batch)));
      for (const name of names) tr.appendChild(el("td", typeof v.metrics[name] === "number" ? number(v.metrics[name]) : (v.metrics[name] ?? "-")));
      return tr;
    }));
    document.getElementById("validation-count").textContent = `${validations.length}, newest first`;
  }

  logScale.onchange = draw; smoothing.oninput = draw;
  logRank.onchange = showLogs; logLevel.onchange = showLogs; logSearch.oninput = showLogs;
  let nonfinite = {};
  poll(async () => {
    const answer = await fetchJSON(`${api}?have=${store.have()}&log=${logCount}&validations=${validationsHad}`);
    await plotlyReady;
    showSummary(answer.summary);
    store.merge(answer.series);
    nonfinite = answer.nonfinite || {};
    draw();
    validationsTable(answer.validations);
    addLogs(answer.logs);
  });
}

// ---------------------------------------------------------------- a search

// Whether Plotly can draw WebGL here (its parallel coordinates need it; where it says it cannot, as
// in a browser without a GPU, headless Chromium among them, the chart is drawn as lines in SVG).
let webgl = (() => { try { return !!document.createElement("canvas").getContext("webgl"); } catch (e) { return false; } })();

// Parallel coordinates without WebGL: a line per trial across the axes, each axis scaled to its
// own range (0 its smallest value, 1 its largest), coloured by the metric (the last axis) in 8
// bands, a trace per band (a gap between trials' lines), so hundreds of trials draw as 8 traces.
function parallelLines(dimensions, rows) {
  const scaled = dimensions.map((d) => {
    const low = Math.min(...d.values), high = Math.max(...d.values), width = high - low || 1;
    return d.values.map((v) => (v - low) / width);
  });
  const metric = dimensions[dimensions.length - 1].values, low = Math.min(...metric), high = Math.max(...metric);
  const bands = 8, traces = [];
  for (let band = 0; band < bands; band++) {
    const x = [], y = [], text = [];
    rows.forEach((r, i) => {
      if (Math.min(bands - 1, Math.floor(bands * (metric[i] - low) / (high - low || 1))) !== band) return;
      dimensions.forEach((d, j) => { x.push(j); y.push(scaled[j][i]); text.push(`trial ${r.number}: ${d.label} ${number(d.values[i])}`); });
      x.push(null); y.push(null); text.push("");
    });
    if (x.length) traces.push({type: "scatter", mode: "lines", x, y, text, hoverinfo: "text", connectgaps: false,
                               line: {color: `hsl(${Math.round(260 * (1 - band / (bands - 1)))}, 70%, 45%)`}});
  }
  return traces;
}

function parallelAxes(dimensions) {
  return {showlegend: false, hovermode: "closest",
          xaxis: {tickmode: "array", tickvals: dimensions.map((_, j) => j), ticktext: dimensions.map((d) => d.label)},
          yaxis: {title: {text: "0 lowest, 1 highest"}, range: [-0.05, 1.05]}};
}

// The mean metric of the trials in each of 8 x 8 cells of two hyperparameters (log-spaced for a
// log one); a cell no trial fell in is null, which Plotly leaves blank (a 0 would read as a value).
function heatGrid(rows, x, y, logged, bins = 8) {
  const edges = (name) => {
    const scale = logged.has(name) ? Math.log10 : (v) => v, values = rows.map((r) => scale(r.hparams[name]));
    const low = Math.min(...values), high = Math.max(...values), width = (high - low) / bins || 1;
    const cell = (v) => Math.min(bins - 1, Math.floor((scale(v) - low) / width));
    const centres = [...Array(bins).keys()].map((i) => low + (i + 0.5) * width);
    return {cell, centres: logged.has(name) ? centres.map((c) => 10 ** c) : centres};
  };
  const ex = edges(x), ey = edges(y);
  const sums = [...Array(bins)].map(() => Array(bins).fill(0)), counts = [...Array(bins)].map(() => Array(bins).fill(0));
  for (const r of rows) {
    const i = ey.cell(r.hparams[y]), j = ex.cell(r.hparams[x]);
    sums[i][j] += r.best; counts[i][j] += 1;
  }
  return {x: ex.centres, y: ey.centres, z: sums.map((line, i) => line.map((total, j) => counts[i][j] ? total / counts[i][j] : null))};
}

function searchPage() {
  const summary = document.getElementById("summary"), api = summary.dataset.api, store = new SeriesStore();
  const logScale = document.getElementById("log-scale");
  const heatX = document.getElementById("heat-x"), heatY = document.getElementById("heat-y");
  let last = null;

  let sortKey = "number", descending = false, folded = false;
  function trialsTable(answer) {
    const table = document.getElementById("trials");
    if (!folded && answer.trials.length > 50) document.getElementById("trials-section").open = false;  // once: the charts first
    folded = true;
    const head = el("tr");
    const columns = ["number", "state", "bracket", "rung", "best", "last", "batches", ...answer.hparams];
    for (const column of columns) {
      const th = el("th", column === "number" ? "trial" : column);
      th.dataset.key = column;
      th.className = column === sortKey ? (descending ? "sorted-down" : "sorted-up") : "";
      th.onclick = () => { descending = column === sortKey ? !descending : false; sortKey = column; trialsTable(answer); };
      head.appendChild(th);
    }
    table.tHead.replaceChildren(head);
    const value = (row, key) => key in row ? row[key] : row.hparams[key];
    const rows = answer.trials.slice().sort((a, b) => {
      const x = value(a, sortKey), y = value(b, sortKey);
      const order = x === y ? 0 : (x === null || x === undefined) ? 1 : (y === null || y === undefined) ? -1 : x < y ? -1 : 1;
      return descending ? -order : order;
    });
    const body = table.tBodies[0];
    body.replaceChildren();
    for (const row of rows) {
      const tr = el("tr"), first = el("td");
      first.appendChild(link(row.url, `trial ${row.number}`)); tr.appendChild(first);
      tr.appendChild(el("td", row.damaged ? `damaged: ${row.damaged}` : row.state, "state state-" + row.state.split(" ")[0]));
      for (const key of ["bracket", "rung", "best", "last"]) tr.appendChild(el("td", number(row[key])));
      tr.appendChild(el("td", row.target ? `${row.batches} / ${row.target}` : number(row.batches)));
      for (const name of answer.hparams) tr.appendChild(el("td", number(row.hparams[name])));
      if (row.nonfinite) tr.cells[4].textContent += ` (${row.nonfinite} not finite)`;
      body.appendChild(tr);
    }
  }

  function rungsTable(rungs) {
    const body = document.querySelector("#rungs tbody");
    body.replaceChildren();
    for (const r of rungs) {
      const tr = el("tr");
      for (const key of ["rung", "reached", "continued", "stopped"]) tr.appendChild(el("td", r[key]));
      body.appendChild(tr);
    }
  }

  function bestTrial(answer) {
    const measured = answer.trials.filter((row) => row.best !== null);
    const line = document.getElementById("best-trial");
    line.replaceChildren();
    if (!measured.length) { line.textContent = "no trial has reported the metric yet"; return; }
    const pick = measured.reduce((a, b) => (answer.smaller ? b.best < a.best : b.best > a.best) ? b : a);
    line.appendChild(document.createTextNode("best: "));
    line.appendChild(link(pick.url, `trial ${pick.number}`));
    line.appendChild(document.createTextNode(` with ${number(pick.best)}`));
    const counts = answer.summary.counts || {};
    document.getElementById("search-counts").textContent =
      `${answer.trials.length} trials: ` + Object.entries(counts).map(([s, n]) => `${s} ${n}`).join(", ");
  }

  // Which value of each trial the hyperparameter plots show: a metric, at its best, last, at a rung
  // or once it had trained N batches (a trial that never got there is left out, not compared).
  function choices(answer) {
    const known = new Set([...plotMetric.options].map((o) => o.value));
    for (const name of answer.chosen.metrics) if (!known.has(name)) plotMetric.appendChild(new Option(name, name));
    if (!known.size) plotMetric.value = answer.chosen.metric;  // at first the searcher's metric, not the first named
    const points = answer.chosen.rungs.map((units, k) => [`rung:${k}`, `at rung ${k} (${units} batches)`]);
    const have = new Set([...plotAt.options].map((o) => o.value));
    for (const [value, label] of points) if (!have.has(value)) plotAt.insertBefore(new Option(label, value), plotAt.querySelector("[value=custom]"));
  }

  function hparamCharts(answer) {
    choices(answer);
    const rows = answer.trials.filter((row) => row.value !== null && row.value !== undefined)
      .map((row) => Object.assign({}, row, {best: row.value}));
    const metric = `${answer.chosen.metric} (${plotAt.selectedOptions[0] ? plotAt.selectedOptions[0].textContent : "best"})`;
    document.getElementById("plotted").textContent = `${rows.length} of ${answer.trials.length} trials have a value there`;
    const numeric = answer.hparams.filter((name) => rows.every((row) => typeof row.hparams[name] === "number"));
    const logged = new Set(answer.log_hparams || []);
    // a log hyperparameter's axis in parallel coordinates (which draws linear axes only): its log10
    const dimension = (label, values) => logged.has(label)
      ? {label: plotText(`log10 ${label}`), values: values.map(Math.log10)} : {label: plotText(label), values};
    const dimensions = [...numeric.map((name) => dimension(name, rows.map((r) => r.hparams[name]))),
                        {label: plotText(metric), values: rows.map((r) => r.best)}];
    const title = {title: {text: "parallel coordinates", font: {size: 14}}, margin: {l: 60, r: 40, t: 60, b: 30}};
    const chartOf = document.getElementById("parallel");
    if (webgl) {
      const parallel = [{type: "parcoords", line: {color: rows.map((r) => r.best), colorscale: "Viridis", showscale: true}, dimensions}];
      Plotly.react(chartOf, parallel, title);
      if (chartOf.querySelector(".no-webgl")) { webgl = false; Plotly.purge(chartOf); }  // Plotly could not draw it
    }
    if (!webgl) Plotly.react(chartOf, parallelLines(dimensions, rows), Object.assign(title, parallelAxes(dimensions)));
    const scatters = document.getElementById("scatters");
    for (const name of answer.hparams) {
      const values = rows.map((r) => r.hparams[name]);  // a categorical value is a tick label: escaped
      const trace = {x: values.map((v) => typeof v === "string" ? plotText(v) : v), y: rows.map((r) => r.best), mode: "markers", type: "scatter",
                     text: rows.map((r) => `trial ${r.number}`), name: plotText(name)};
      const chart = layout(`${metric} by ${name}`, false, name);
      if (logged.has(name)) chart.xaxis.type = "log";
      Plotly.react(chartDiv(scatters, "scatter-" + name), [trace], chart);
    }
    for (const select of [heatX, heatY]) {
      const known = new Set([...select.options].map((o) => o.value));
      for (const name of numeric) if (!known.has(name)) select.appendChild(new Option(name, name));
    }
    if (!heatY.dataset.touched && heatY.options.length > 1 && heatY.selectedIndex === 0) heatY.selectedIndex = 1;
    const x = heatX.value, y = heatY.value;
    const heat = x && y ? [Object.assign({type: "heatmap", colorscale: "Viridis", hoverongaps: false},
                                         heatGrid(rows, x, y, logged))] : [];
    const chart = layout(`${metric} (mean) by ${x} and ${y}`, false, x);
    chart.yaxis.title = {text: plotText(y)};
    if (logged.has(x)) chart.xaxis.type = "log";
    if (logged.has(y)) chart.yaxis.type = "log";
    Plotly.react(document.getElementById("heatmap"), heat, chart);
    const importance = answer.importance || {}, values = importance.values || {};
    const names = Object.keys(values).sort((a, b) => values[a] - values[b]);
    document.getElementById("importance-note").textContent = importance.note || "";
    document.getElementById("importance-of").textContent = `Optuna's, of each hyperparameter for ${metric}`;
    const bars = layout("importance", false, "importance (sums to 1)");
    bars.yaxis = {type: "category", automargin: true};
    Plotly.react(document.getElementById("importance"),
                 names.length ? [{type: "bar", orientation: "h", x: names.map((n) => values[n]), y: names.map(plotText)}] : [],
                 Object.assign(bars, {showlegend: false, hovermode: "closest"}));
  }

  // Up to 20 trials: a curve each, with a legend. More: every trial's curve in one grey trace (a gap
  // between trials; hover names the trial), and the 5 best trials drawn over it in colour, so a
  // search of hundreds draws as 6 traces.
  function draw(answer) {
    const keys = Object.keys(store.series), curves = document.getElementById("curves");
    let traces;
    if (keys.length <= 20) {
      traces = keys.map((key) => { const [x, y] = store.points(key); return {x, y, name: plotText(key), mode: "lines+markers"}; });
    } else {
      const best = answer.trials.filter((row) => row.best !== null)
        .sort((a, b) => answer.smaller ? a.best - b.best : b.best - a.best).slice(0, 5).map((row) => `trial ${row.number}`);
      const x = [], y = [], text = [];
      for (const key of keys) {
        const [xs, ys] = store.points(key);
        for (let i = 0; i < xs.length; i++) { x.push(xs[i]); y.push(ys[i]); text.push(key); }
        x.push(null); y.push(null); text.push("");
      }
      traces = [{x, y, text, name: `all ${keys.length} trials`, mode: "lines", hoverinfo: "text+x+y",
                 line: {color: "rgba(110, 120, 135, 0.35)", width: 1}},
                ...best.filter((key) => store.series[key]).map((key) => {
                  const [xs, ys] = store.points(key); return {x: xs, y: ys, name: plotText(`${key} (best 5)`), mode: "lines"};
                })];
    }
    Plotly.react(curves, traces, Object.assign(layout(answer.metric, logScale.checked),
                                               keys.length > 20 ? {hovermode: "closest"} : {}));
    curves.dataset.trials = String(keys.length);  // how many trials' curves are drawn
  }

  const plotMetric = document.getElementById("plot-metric"), plotAt = document.getElementById("plot-at");
  const plotBatches = document.getElementById("plot-batches");
  plotAt.onchange = () => {
    plotBatches.hidden = plotAt.value !== "custom" && !plotAt.value.startsWith("batch:");
    if (plotAt.value !== "custom") lastText = "";  // the next answer (within a poll) is drawn
  };
  plotBatches.onchange = () => {
    const n = Math.max(1, Math.floor(Number(plotBatches.value) || 1));
    let option = [...plotAt.options].find((o) => o.value === `batch:${n}`);
    if (!option) { option = new Option(`once it trained ${n} batches`, `batch:${n}`); plotAt.appendChild(option); }
    plotAt.value = option.value; lastText = "";
  };
  plotMetric.onchange = () => { lastText = ""; };
  logScale.onchange = () => last && draw(last);
  for (const select of [heatX, heatY]) select.onchange = () => { select.dataset.touched = "1"; if (last) hparamCharts(last); };
  let lastText = "";
  poll(async () => {
    const at = plotAt.value === "custom" ? "best" : plotAt.value;  // until the batches are given
    const chosen = `&metric=${encodeURIComponent(plotMetric.value)}&at=${encodeURIComponent(at)}`;
    const text = await fetchText(`${api}?have=${store.have()}${chosen}`);
    await plotlyReady;
    if (text === lastText) return;  // nothing new: nothing to draw again
    lastText = text;
    const answer = JSON.parse(text);
    last = answer;
    store.merge(answer.curves);
    draw(answer); trialsTable(answer); rungsTable(answer.rungs); bestTrial(answer);
    setTimeout(() => hparamCharts(answer), 0);  // the charts further down after the first screen is drawn
  });
}

// ---------------------------------------------------------------- compare

function comparePage() {
  const api = document.getElementById("summary").dataset.api, store = new SeriesStore();
  const charts = document.getElementById("charts"), logScale = document.getElementById("log-scale");

  function draw() {
    const byMetric = {};
    for (const [key, s] of Object.entries(store.series)) (byMetric[s.meta.metric] = byMetric[s.meta.metric] || []).push(key);
    for (const [metric, keys] of Object.entries(byMetric)) {
      const traces = keys.sort().map((key) => {
        const [x, y] = store.points(key);
        const meta = store.series[key].meta;
        return {x, y, name: plotText(`${meta.run} (${meta.group})`), mode: meta.group === "validation" ? "lines+markers" : "lines"};
      });
      Plotly.react(chartDiv(charts, "chart-" + metric), traces, layout(metric, logScale.checked));
    }
  }

  logScale.onchange = draw;
  poll(async () => {
    const answer = await fetchJSON(`${api}&have=${store.have()}`);
    await plotlyReady;
    store.merge(answer.series);
    draw();
  });
}

const PAGES = {list: listPage, run: runPage, search: searchPage, compare: comparePage};
PAGES[document.body.dataset.page]();
