// One job, live: history is loaded downsampled up to a cursor, then the job stream continues from it.
/* global Plotly */
import { alertItem, deviceLabel } from "./alert-list.js";
import { describe, downloadLink, get, live, optional, post } from "./api.js";
import { config, defaultSmoothing, Ema, empty, framed, GiB, layout, loadPlotly, mode, onZoom, plain, plotlyReady, range, throttled } from "./charts.js";
import { $, bytes, duration, h, nav, nonfiniteText, num, phaseText, progressBar, verdictBadge, when } from "./fmt.js";
import { mayAct, onMe } from "./identity.js";
import { actionsFiles, actionsFor, actionsMe, setupActions } from "./job-actions.js";
import { AXES, fromSteps, fromTime, mapping, TITLES, toSteps, toTime, usable, xOf } from "./job-axis.js";
import { showResults } from "./job-results.js";
import { refuse } from "./refusal.js";

const indicator = nav("");
const jobId = Number(location.pathname.split("/").filter(Boolean).pop());
const MAX_POINTS = 2000;
// About one point a pixel across the chart (the server keeps each bucket's min and max, so every spike
// is still drawn): a narrower chart reads, sends and draws fewer.
function pointsFor(id) {
  const px = document.getElementById(id).clientWidth * (window.devicePixelRatio || 1);
  return Math.max(200, Math.min(MAX_POINTS, Math.round(px) || MAX_POINTS));
}
const state = {
  job: null,
  metrics: {}, // name -> {step: [], t: [], y: []}
  seriesNames: [],
  metricsLast: 0, // newest metric id held (history or stream)
  axis: "step", // every chart's x axis: step, time or tokens (job-axis.js)
  lossZoom: null, // in steps, whatever the axis
  smoothChosen: false, // the user moved the smoothing slider: the default no longer follows the run
  mem: new Map(), // device key ("node/gpu", devKey) -> {t: [], y: [], name}
  memTotal: new Map(), // device key -> total bytes
  memLast: 0,
  memZoom: null, // in unix seconds
  memAvailable: true,
  alerts: [],
  logLines: 0,
  arrivals: [], // [step, epoch ms] when each streamed loss point was drawn (bench/ui_latency.py reads them)
  unshown: [], // steps of streamed loss points not drawn yet
};
window.tunedeck = state; // for the browser tests and for curious users

function series(name) {
  // bad: the points where the metric was inf or NaN (null in JSON), kept apart from y
  return (state.metrics[name] ||= { step: [], t: [], y: [], bad: { step: [], t: [], value: [] } });
}

// ------------------------------------------------------------------ header
function showJob(j) {
  const was = state.job && state.job.status;
  state.job = j;
  document.title = `tunedeck · ${j.name}`;
  $("#title").textContent = `#${j.id} ${j.name}`;
  $("#status").replaceChildren(verdictBadge(j));
  showPhase(j);
  $("#owner").textContent = j.owner ? `by ${j.owner}` : "";
  const p = j.progress || {};
  $("#bar").replaceChildren(progressBar(p, true));
  $("#steps").textContent = p.total_steps ? `${p.current_steps ?? 0} / ${p.total_steps} steps` : "";
  $("#eta").textContent = j.status === "running" ? duration(p.eta_seconds) : "–";
  const each = j.nodes > 1 ? ` on each of ${j.nodes} nodes` : "";
  $("#gpus").textContent = j.gpus ? `${j.gpus}${j.devices ? ` (${j.devices.join(",")})` : ""}${each}` : `CPU${each}`;
  $("#priority").textContent = String(j.priority || 0);
  $("#started").textContent = when(j.started_at);
  $("#finished").textContent = when(j.finished_at);
  summary();
  const ended = ["succeeded", "failed", "cancelled"].includes(j.status);
  showActions(j, ended);
  const waits = j.status === "queued" && j.waiting_for;
  const priority = j.priority ? ` (priority ${j.priority})` : "";
  $("#waiting").replaceChildren(...(waits ? [h("div", { class: "notice", text: `Queued, #${j.queue_position} in line${priority}: ${j.waiting_for}` })] : []));
  // `error` also carries the cause of a stop or a clean exit: red only for failures.
  $("#error").replaceChildren(
    ...(j.stopped ? [h("div", { class: "notice", id: "stopped", text: j.stopped })] : []),
    ...(j.error ? [h("div", { class: j.status === "failed" ? "error" : "notice", text: j.error })] : []),
    ...(j.auto_resume ? [autoResume(j.auto_resume)] : []));
  $("#compare").href = `/compare?jobs=${j.id}`;
  $("#again").href = `/new?from=${j.id}`;
  $("#parent").hidden = !j.parent_id;
  if (j.parent_id) { $("#parent").href = `/jobs/${j.parent_id}`; $("#parent").textContent = `from #${j.parent_id}`; }
  actionsFor(j);
  if (was && was !== j.status && ended) loadFiles();
  scheduleAlerts();
}
setupActions(showJob);

// What the trainer is doing (and for how long) while it runs; where a failed or stopped run was when it ended.
function showPhase(j) {
  const el = $("#phase");
  const shown = j.phase && j.status !== "succeeded" && j.status !== "queued";
  el.hidden = !shown;
  el.dataset.phase = shown ? j.phase : "";
  el.textContent = !shown ? "" : j.status === "running" ? `· ${phaseText(j)}` : `· ended while ${phaseText(j)}`;
}
// Its duration moves on between the stream's updates.
setInterval(() => { if (state.job && state.job.status === "running") showPhase(state.job); }, 5000);

// Stop only for whom the server lets stop this job (its owner, an admin, anyone in open mode); hidden
// until the page knows who is asking.
function showActions(j, ended) {
  const stop = $("#stop");
  stop.hidden = !mayAct(state.me, j.owner);
  stop.disabled = ended || stop.dataset.sent === "1";
  if (ended) stop.textContent = j.status === "cancelled" ? "Stopped" : "Stop";
}

$("#stop").addEventListener("click", async () => {
  const stop = $("#stop");
  const j = state.job || { id: jobId, name: "" };
  if (!window.confirm(`Stop job #${j.id} ${j.name}? It stops after the current step and saves its adapter.`)) return;
  stop.disabled = true;
  stop.dataset.sent = "1";
  stop.textContent = "Stopping…";
  try {
    showJob(await post(`/api/jobs/${jobId}/cancel`));
  } catch (e) {
    refuse($("#refusals"), "Stop failed", e);
    stop.dataset.sent = "";
    stop.disabled = false;
    stop.textContent = "Stop";
  }
});

$("#report").addEventListener("click", async () => {
  try {
    const html = await get(`/api/jobs/${jobId}/report`);
    const a = h("a", { href: URL.createObjectURL(new Blob([html], { type: "text/html" })), download: `tunedeck-job-${jobId}.html` });
    document.body.append(a);
    a.click();
    a.remove();
  } catch (e) {
    refuse($("#refusals"), "Report failed", e);
  }
});

// A time-limited run: the next attempt the server made (a link), or why there is none.
function autoResume(said) {
  const next = /^resumed as job (\d+)$/.exec(said);
  if (!next) return h("div", { class: "notice", id: "auto-resume", text: said === "pending" ? "Resuming from its checkpoint…" : said });
  return h("div", { class: "notice", id: "auto-resume" }, "Resumed from its checkpoint as ", h("a", { href: `/jobs/${next[1]}`, text: `#${next[1]}` }));
}

// ------------------------------------------------------------------ metric charts
async function loadSeries(range, until) {
  const params = { max_points: pointsFor("loss-chart"), until };
  // A resumed run: its curves continue those of the runs it resumed (each point names its attempt).
  if (state.job && state.job.parent_id) params.lineage = 1;
  if (range) { params.x0 = Math.floor(range[0]); params.x1 = Math.ceil(range[1]); }
  const data = await get(`/api/jobs/${jobId}/series`, params);
  await plotlyReady;
  state.seriesNames = Object.keys(data.series); // the server's list: streamed rows carry the same names
  for (const [name, s] of Object.entries(data.series)) {
    state.metrics[name] = { step: s.step, t: s.t, y: s.y, n: s.n, bad: s.nonfinite_points || { step: [], t: [], value: [] },
      ...(s.job ? { job: s.job } : {}) };
  }
  if (data.lineage) state.lineage = data.lineage.length > 1 ? data.lineage : null;
  if (!range) state.metricsLast = Math.max(state.metricsLast, data.last_id || 0);
  state.lossDownsampled = data.downsampled;
  drawMetrics();
  // The memory chart shows LLaMA-Factory's RECORD_VRAM peaks, and on a step or tokens axis its samples
  // are placed by these points: drawn again then.
  if (state.memLoaded && (state.axis !== "time" || series("vram_reserved").y.some((y) => y > 0))) drawMemory();
}

function addMetrics(rows) {
  let added = false;
  for (const r of rows) {
    if (r.id <= state.metricsLast) continue; // already in the loaded history
    state.metricsLast = r.id;
    if (r.loss !== null) state.unshown.push(r.step);
    for (const name of state.seriesNames) {
      const bad = r.nonfinite && r.nonfinite[name];
      if (bad && r.step !== null) {
        const b = series(name).bad;
        b.step.push(r.step); b.t.push(r.t); b.value.push(bad);
      }
      if (r[name] === null || r[name] === undefined || r.step === null) continue;
      const s = series(name);
      s.step.push(r.step); s.t.push(r.t); s.y.push(r[name]);
      if (s.job) s.job.push(jobId);
      s.n = (s.n || 0) + 1;
    }
    added = true;
  }
  if (added && !state.lossZoom) liveMetrics();
}

// Streamed loss points are drawn now: note when, for the latency bench.
function shown() {
  const now = performance.timeOrigin + performance.now();
  for (const step of state.unshown) state.arrivals.push([step, now]);
  state.unshown = [];
  if (state.arrivals.length > 5000) state.arrivals.splice(0, 1000);
}

// Words for a chart with no points, from what the job is doing.
function noData(what) {
  const status = state.job && state.job.status;
  if (status === "queued") return `No ${what} yet: the job is queued and has not started.`;
  if (status === "running") return `No ${what} yet: waiting for the first logged step.`;
  if (status === "failed") return `No ${what}: the job failed before logging any (its log below says why).`;
  if (status === "cancelled") return `No ${what}: the job was stopped before logging any.`;
  return `This run logged no ${what}.`;
}

const SEVERITY_COLOR = { critical: "#c4321a", error: "#c4321a", warning: "#d08a00", info: "#2f6fed" };

// The logged step at or after unix time t: where a time-stamped alert goes on a step axis.
function stepAt(t) {
  const s = ["loss", "eval_loss", "lr"].map((n) => state.metrics[n]).find((m) => m && m.t.length);
  if (!s) return null;
  const i = s.t.findIndex((x) => x >= t);
  return s.step[i >= 0 ? i : s.step.length - 1];
}

// The axis of the charts drawn now, and its map: a chart of samples falls back to time when the run
// logged nothing to put them on a step with.
let axisMap = mapping({});
function axisNow() { axisMap = mapping(state.metrics); return axisMap; }
const axisFor = (samples) => usable(state.axis, axisMap, samples);
// Says so when a chart cannot take the axis asked for.
function axisNote() {
  const why = [];
  if (state.axis === "tokens" && !axisMap.tokens) why.push("this run logged no token counts (total_tokens): its curves are by step");
  if (state.axis !== "time" && state.mem.size && axisFor(true) === "time") why.push("memory by time (fewer than two logged steps to place its samples between)");
  else if (state.axis !== "time" && state.mem.size) why.push("memory samples placed by the logged steps' times");
  $("#xaxis-note").textContent = why.join("; ");
}

// Each alert where it happened, on `axis`: its first and its newest occurrence, and the span between
// them when it recurred (the alert keeps how many times, not each time). Every chart shows every alert.
function alertPlaces(axis) {
  const out = [];
  for (const a of state.alerts) {
    const first = a.first_t ?? a.t, last = a.last_t ?? a.t;
    let x0, x1;
    if (axis !== "time" && (a.gpu === null || a.gpu === undefined)) {
      // A training alert: at its step (or the logged step at or after it), as the loss shows it.
      const s1 = a.step ?? stepAt(last);
      if (s1 === null || s1 === undefined) continue;
      const s0 = first < last ? stepAt(first) ?? s1 : s1;
      [x0, x1] = [s0, s1].map((step) => xOf(axis, axisMap, { step }));
    } else {
      [x0, x1] = [first, last].map((t) => xOf(axis, axisMap, { t }));
      if (x1 === null) continue;
    }
    // Recurring problems get their span shaded; an info finding (memory settled) is a marker, and so
    // is a periodic one (from its first spike to its newest is the whole run: a band would say nothing).
    out.push({ a, x0, x1, span: a.count > 1 && first < last && a.severity !== "info" && !UNSPANNED.has(a.kind) });
  }
  return out;
}

const UNSPANNED = new Set(["vram_periodic_spikes"]);

function alertShapes(axis) {
  return alertPlaces(axis).flatMap(({ a, x0, x1, span }) => {
    const color = SEVERITY_COLOR[a.severity] || "#d08a00";
    const name = plain(span ? `${a.kind} ×${a.count}` : a.kind);
    const line = (x) => ({ type: "line", xref: "x", yref: "paper", y0: 0, y1: 1, x0: x, x1: x, line: { color, width: 1, dash: "dot" }, name });
    if (!span) return [line(x1)];
    return [{ type: "rect", xref: "x", yref: "paper", y0: 0, y1: 1, x0, x1, fillcolor: "rgba(208,138,0,0.07)",
      line: { width: 0 }, layer: "below", name }, line(x0), line(x1)];
  });
}

function alertMarkers(axis) {
  const x = [], text = [];
  for (const { a, x0, x1, span } of alertPlaces(axis)) {
    const what = plain(`${a.kind}: ${a.message}`);
    if (span) {
      x.push(x0, x1);
      text.push(`first of ${a.count} · ${what}`, `newest of ${a.count} · ${what}`);
    } else {
      x.push(x1);
      text.push(a.count > 1 ? `×${a.count} · ${what}` : what);
    }
  }
  return {
    name: "alerts", mode: "markers", type: "scatter", yaxis: "y", marker: { symbol: "triangle-down", size: 10, color: "#d08a00" },
    x, y: x.map(() => null), text, hoverinfo: "text",
  };
}

// A resumed run's attempts: a named line where each resumed (at its checkpoint's step), and markers
// along the top whose hover names the attempt.
function resumeShapes(axis) {
  return (state.lineage || []).filter((a) => a.resumed_at !== null).map((a) => {
    const x = xOf(axis, axisMap, { step: a.resumed_at });
    return { type: "line", xref: "x", yref: "paper", y0: 0, y1: 1, x0: x, x1: x, line: { color: "#667085", width: 1.5, dash: "dash" },
      name: plain(`#${a.job_id} resumed at step ${a.resumed_at}`) };
  });
}
function resumeMarkers(axis, y) {
  const shown = (state.lineage || []).filter((a) => a.resumed_at !== null);
  return { name: "resumes", mode: "markers", type: "scatter", marker: { symbol: "triangle-right", size: 10, color: "#667085" },
    x: shown.map((a) => xOf(axis, axisMap, { step: a.resumed_at })), y: shown.map(() => y),
    text: shown.map((a) => plain(`#${a.job_id} ${a.name}: resumed from checkpoint-${a.resumed_at}`)), hoverinfo: "text" };
}
// Which attempt a point is from, for the hover of a resumed run's curves.
const attemptOf = (s) => (state.lineage && s.job ? { text: s.job.map((j) => `#${j}`) } : {});
const attemptHover = (s) => (state.lineage && s.job ? " · %{text}" : "");

// The x axis of a chart on `axis`: its title, and its type fixed (a switch from steps to dates must not
// keep the old type, nor the old zoom: uirevision follows the axis).
function xaxisOf(axis) {
  return { title: { text: TITLES[axis] }, automargin: true, type: axis === "time" ? "date" : "linear" };
}
// A metric's points on `axis`.
function xsOf(s, axis) {
  if (axis === "step") return s.step.slice();
  return s.step.map((step, i) => xOf(axis, axisMap, { step, t: s.t[i] }));
}

let revision = 0; // Plotly.react redraws arrays grown in place only when this changes

// What each chart holds of its series (points, y range, smoothing state), so live points are appended to
// it instead of redrawing the whole chart.
const drawn = {};

function lineChart(el, s, { name, color, unit, digits = 4, exp = false }) {
  drawn[el] = null;
  if (!s || !s.y.length) return empty(el, noData(name));
  const axis = axisFor(false), yrange = range([s.y]);
  drawn[el] = { n: s.y.length, range: yrange };
  // The run's alerts as on every chart, their markers along the top.
  const am = alertMarkers(axis);
  am.y = am.x.map(() => (yrange ? yrange[1] : null));
  // Copies: the series grow in place as points stream in, and live points are appended to the chart's own.
  const resumes = state.lineage ? [resumeMarkers(axis, yrange ? yrange[0] : null)] : [];
  return Plotly.react(el, [{ name, x: xsOf(s, axis), y: s.y.slice(), mode: mode(s.y), line: { color }, marker: { color, size: 6 },
    ...attemptOf(s), hovertemplate: `%{y:.${digits}~g}${unit ? ` ${unit}` : ""}${attemptHover(s)}` }, ...(am.x.length ? [am] : []), ...resumes],
  layout("", { datarevision: revision, uirevision: axis, xaxis: xaxisOf(axis), shapes: [...alertShapes(axis), ...resumeShapes(axis)],
    yaxis: { range: yrange, automargin: true, ...(exp ? { exponentformat: "e" } : {}), ...(unit ? { title: { text: unit } } : {}) },
    showlegend: false }), config);
}

const LR = { name: "learning rate", color: "#7a3ee8", digits: 3, exp: true };
const TP = { name: "throughput", color: "#1a7f37", unit: "tokens/s" };
const GRAD = { name: "grad_norm", color: "#a1306b" };

function drawMetrics() {
  revision++;
  axisNow();
  const axis = axisFor(false);
  const loss = series("loss"), evl = series("eval_loss"), lr = series("lr"), tp = series("throughput");
  // From the run's length at each full draw (not a zoomed window's), until the user picks one.
  if (!state.smoothChosen && !state.lossZoom) showSmoothing(defaultSmoothing(loss.y.length));
  const w = Number($("#smooth").value);
  const logy = $("#logy").checked;
  const lossX = xsOf(loss, axis);
  const markersY = (xs) => xs.map((x) => {
    const i = lossX.findIndex((s) => +s >= +x);
    return i >= 0 ? loss.y[i] : loss.y[loss.y.length - 1] ?? null;
  });
  const am = alertMarkers(axis);
  am.y = markersY(am.x);
  const resumed = resumeMarkers(axis, null); // on the loss line, where each attempt took over
  resumed.y = markersY(resumed.x);
  const bad = [loss, evl].flatMap((s, k) => s.bad.step.map((x, i) => [xOf(axis, axisMap, { step: x, t: s.bad.t[i] }), `${k ? "eval loss" : "loss"} ${s.bad.value[i]}`]));
  const nonfinite = {
    name: "inf / NaN", mode: "markers", type: "scatter", marker: { symbol: "x", size: 9, color: "#c4321a" },
    x: bad.map((b) => b[0]), y: markersY(bad.map((b) => b[0])), text: bad.map((b) => b[1]), hoverinfo: "x+text",
  };
  drawn["loss-chart"] = null;
  if (!loss.y.length && !evl.y.length) {
    const from = Math.min(...loss.bad.step, ...evl.bad.step);
    empty("loss-chart", bad.length ? `Every logged loss was inf or NaN (${bad.length} points, from step ${from}).` : noData("loss"));
  } else {
    const hover = "%{y:.4~g}";
    const smooth = new Ema(w), yrange = range([loss.y, evl.y], { log: logy });
    const smoothed = loss.y.map((y) => smooth.next(y));
    drawn["loss-chart"] = { loss: loss.y.length, evl: evl.y.length, bad: bad.length, smooth, range: yrange, logy,
      lastStep: loss.step[loss.step.length - 1] ?? -Infinity };
    Plotly.react("loss-chart", [
      { name: "loss", x: lossX, y: loss.y.slice(), mode: mode(loss.y), line: { color: "rgba(47,111,237,0.5)", width: 1.25 },
        marker: { color: "rgba(47,111,237,0.6)", size: 6 }, ...attemptOf(loss), hovertemplate: hover + attemptHover(loss) },
      { name: `loss (smoothed ${w.toFixed(2)})`, x: lossX.slice(), y: smoothed, mode: mode(loss.y), line: { color: "#2f6fed", width: 2 },
        marker: { color: "#2f6fed", size: 7 }, hovertemplate: hover },
      { name: "eval loss", x: xsOf(evl, axis), y: evl.y.slice(), mode: "lines+markers", line: { color: "#e4572e", width: 2 }, marker: { size: 6 }, hovertemplate: hover },
      am,
      nonfinite,
      ...(state.lineage ? [resumed] : []),
    ], layout("", { datarevision: revision, uirevision: axis, xaxis: xaxisOf(axis),
      yaxis: { type: logy ? "log" : "linear", range: yrange, automargin: true },
      shapes: [...alertShapes(axis), ...resumeShapes(axis)] }), config);
  }
  lineChart("lr-chart", lr, LR);
  lineChart("tp-chart", tp, TP);
  const grad = state.metrics.grad_norm;
  $("#grad-card").hidden = !(grad && grad.y.length); // older runs and stores without grad_norm: no card
  if (grad && grad.y.length) lineChart("grad-chart", grad, GRAD);
  lossCount();
  shown();
  summary();
  axisNote();
}
const redrawMetrics = throttled(drawMetrics);

function lossCount() {
  const loss = series("loss");
  $("#loss-n").textContent = `${loss.n ?? loss.y.length} points${state.lossDownsampled ? " (downsampled for display)" : ""}${state.lossZoom ? ", zoomed" : ""}`;
}

// A live chart's y range moves only when a point would fall outside it, and then with room to spare:
// each relayout is another redraw. A y zoom of the user's own stays.
function followRange(el, d, arrays, log = false) {
  const tight = range(arrays, { log });
  if (!tight || (d.range && tight[0] >= d.range[0] && tight[1] <= d.range[1])) return;
  const now = document.getElementById(el).layout.yaxis.range;
  if (d.range && now && (now[0] !== d.range[0] || now[1] !== d.range[1])) d.userRange = true;
  if (d.userRange) return;
  d.range = range(arrays, { log, pad: 0.2 });
  Plotly.relayout(el, { "yaxis.range": d.range });
}

// Appends the new points of a line chart's series; a chart that had fewer than two points (a marker,
// or words) is drawn afresh.
function appendLine(el, s, opts) {
  const d = drawn[el];
  if (!d || d.n < 2 || s.y.length < d.n) return lineChart(el, s, opts);
  if (s.y.length === d.n) return;
  Plotly.extendTraces(el, { x: [s.step.slice(d.n)], y: [s.y.slice(d.n)] }, [0]);
  d.n = s.y.length;
  followRange(el, d, [s.y]);
}

// A live update: new points are appended to the charts as they are. Anything that changes a chart's
// make-up (its first lines, inf/NaN markers, alert markers past the drawn steps) redraws it all.
function appendMetrics() {
  if (state.lossZoom) return;
  // A time or tokens x moves with the map; a lineage's hover names each point's attempt: drawn afresh.
  if (axisFor(false) !== "step" || state.axis !== "step" || state.lineage) return drawMetrics();
  const loss = series("loss"), evl = series("eval_loss");
  const d = drawn["loss-chart"];
  const bad = loss.bad.step.length + evl.bad.step.length;
  const alertsAhead = alertMarkers("step").x.some((x) => x >= d?.lastStep);
  if (!d || d.loss < 2 || d.bad !== bad || d.logy !== $("#logy").checked || loss.y.length < d.loss || evl.y.length < d.evl || alertsAhead) {
    return drawMetrics();
  }
  const traces = [], xs = [], ys = [];
  if (loss.y.length > d.loss) {
    const y = loss.y.slice(d.loss), x = loss.step.slice(d.loss);
    traces.push(0, 1); xs.push(x, x.slice()); ys.push(y, y.map((v) => d.smooth.next(v)));
  }
  if (evl.y.length > d.evl) { traces.push(2); xs.push(evl.step.slice(d.evl)); ys.push(evl.y.slice(d.evl)); }
  if (traces.length) {
    Plotly.extendTraces("loss-chart", { x: xs, y: ys }, traces);
    d.loss = loss.y.length; d.evl = evl.y.length; d.lastStep = loss.step[loss.step.length - 1];
    followRange("loss-chart", d, [loss.y, evl.y], d.logy);
  }
  shown(); // the loss chart is the one watched for new points: the others follow in this frame
  appendLine("lr-chart", series("lr"), LR);
  appendLine("tp-chart", series("throughput"), TP);
  const grad = state.metrics.grad_norm;
  if (grad && grad.y.length) { $("#grad-card").hidden = false; appendLine("grad-chart", grad, GRAD); }
  lossCount();
  summary();
}
const liveMetrics = framed(appendMetrics);

function showSmoothing(w) {
  $("#smooth").value = w;
  $("#smooth-v").textContent = Number($("#smooth").value).toFixed(2);
}
$("#smooth").addEventListener("input", () => { state.smoothChosen = true; showSmoothing($("#smooth").value); drawMetrics(); keepView(); });
$("#logy").addEventListener("change", () => { drawMetrics(); keepView(); });

// ------------------------------------------------------------------ the view in the address
// The x axis, smoothing, log scale and each chart's zoom live in the URL (replaceState: no history entry
// per drag), so a reload or a shared link shows what was seen:
// `x=time&smooth=0.8&logy=1&steps=100..400&time=T0..T1` (zooms in steps and unix seconds, whatever the axis).
const view = new URLSearchParams(location.search);
const span = (text) => {
  const m = /^(-?[\d.e+-]+)\.\.(-?[\d.e+-]+)$/.exec(text || "");
  return m && Number.isFinite(+m[1]) && Number.isFinite(+m[2]) && +m[1] < +m[2] ? [+m[1], +m[2]] : null;
};
if (view.has("smooth") && Number.isFinite(+view.get("smooth"))) { state.smoothChosen = true; showSmoothing(+view.get("smooth")); }
if (view.get("logy") === "1") $("#logy").checked = true;
if (AXES.includes(view.get("x"))) { state.axis = view.get("x"); $("#xaxis").value = state.axis; }
$("#xaxis").addEventListener("change", () => {
  state.axis = $("#xaxis").value;
  keepView();
  drawMetrics();
  drawMemory();
  applyZoom(); // a new axis starts unzoomed (uirevision): the kept windows again, on it
});

function keepView() {
  const q = new URLSearchParams(location.search);
  const put = (k, v) => (v === null || v === undefined ? q.delete(k) : q.set(k, v));
  put("x", state.axis !== "step" ? state.axis : null);
  put("smooth", state.smoothChosen ? Number($("#smooth").value).toFixed(2) : null);
  put("logy", $("#logy").checked ? "1" : null);
  put("steps", state.lossZoom ? state.lossZoom.map((x) => +(+x).toFixed(2)).join("..") : null);
  put("time", state.memZoom ? state.memZoom.map((x) => +(+x).toFixed(3)).join("..") : null);
  const text = q.toString();
  history.replaceState(null, "", location.pathname + (text ? `?${text}` : "") + location.hash);
}

function restoreZoom() {
  const steps = span(view.get("steps")), time = span(view.get("time"));
  zoomTo(steps, time);
}

// The loss chart's window (steps) and the memory chart's (unix seconds) on the charts' axes.
function zoomTo(steps, time) {
  const loss = document.getElementById("loss-chart"), mem = document.getElementById("mem-chart");
  if (steps && loss.layout) Plotly.relayout(loss, { "xaxis.range": steps.map((x) => fromSteps(axisFor(false), axisMap, x)) });
  if (time && mem.layout) Plotly.relayout(mem, { "xaxis.range": time.map((x) => fromTime(axisFor(true), axisMap, x)) });
}
function applyZoom() { zoomTo(state.lossZoom, state.memZoom); }

// ------------------------------------------------------------------ memory chart
// Per-sample readings beside the memory, as the samples name them (series key -> sample field).
const READINGS = { util: "util", temp: "temp_c", junction: "temp_junction_c", hbm: "temp_hbm_c", power: "power_w",
  tpower: "throttle_power", tthermal: "throttle_thermal", thbm: "throttle_hbm", xread: "xgmi_read_bytes", xwrite: "xgmi_write_bytes" };
const sampleSeries = () => ({ t: [], y: [], ids: [], ...Object.fromEntries(Object.keys(READINGS).map((k) => [k, []])) });
// A job on several nodes has one series per node and GPU: the same GPU index on two nodes is two devices.
const devKey = (s) => `${s.node || ""}/${s.gpu}`;
function devOf(key) {
  const i = key.lastIndexOf("/");
  return { node: key.slice(0, i), gpu: Number(key.slice(i + 1)) };
}
function byDevice(map) {
  return [...map.entries()].map(([k, g]) => [k, g, devOf(k)])
    .sort((a, b) => (a[2].node < b[2].node ? -1 : a[2].node > b[2].node ? 1 : a[2].gpu - b[2].gpu));
}
function push(g, s) {
  g.t.push(s.t); g.y.push(s.used_bytes); g.ids.push(s.id);
  for (const [k, field] of Object.entries(READINGS)) g[k].push(s[field] ?? null);
}

async function loadMemory(range) {
  const params = { max_points: pointsFor("mem-chart"), limit: 20000 };
  if (range) { params.t0 = range[0]; params.t1 = range[1]; }
  let page;
  try {
    page = await optional(`/api/jobs/${jobId}/memory`, params);
    await plotlyReady;
  } catch (e) {
    $("#mem-note").replaceChildren(h("div", { class: "notice", text: `Memory samples unavailable: ${describe(e)}` }));
    return;
  }
  if (page === null) {
    state.memAvailable = false;
    $("#mem-note").replaceChildren(h("div", { class: "notice", text: "Memory telemetry is not available on this server yet." }));
    return;
  }
  const byGpu = new Map();
  for (const s of page.samples) {
    if (!range && state.memCursor !== undefined && s.id > state.memCursor) continue; // the stream sends those
    const g = byGpu.get(devKey(s)) || sampleSeries();
    push(g, s);
    byGpu.set(devKey(s), g);
    if (s.total_bytes) state.memTotal.set(devKey(s), s.total_bytes);
  }
  for (const g of page.gpus || []) if (g.total_bytes) state.memTotal.set(devKey(g), g.total_bytes);
  state.powerShared = new Map((page.gpus || []).filter((g) => g.power_shared_with !== null && g.power_shared_with !== undefined)
    .map((g) => [devKey(g), g.power_shared_with]));
  if (!range) {
    // Samples the stream delivered while this history was loading come after it.
    for (const [gpu, old] of state.mem) {
      const g = byGpu.get(gpu) || sampleSeries();
      old.ids.forEach((id, i) => {
        if (id > state.memCursor) {
          push(g, { id, t: old.t[i], used_bytes: old.y[i], ...Object.fromEntries(Object.entries(READINGS).map(([k, f]) => [f, old[k][i]])) });
        }
      });
      byGpu.set(gpu, g);
    }
  }
  state.mem = byGpu;
  state.gpuNames = new Map((page.gpus || []).map((g) => [devKey(g), g.name]));
  state.memDownsampled = page.downsampled;
  state.memLoaded = true;
  drawMemory();
}

function addMemory(rows) {
  for (const s of rows) {
    if (s.id <= state.memLast) continue;
    state.memLast = s.id;
    const g = state.mem.get(devKey(s)) || sampleSeries();
    push(g, s);
    state.mem.set(devKey(s), g);
    if (s.total_bytes) state.memTotal.set(devKey(s), s.total_bytes);
  }
  if (!state.memZoom) redrawMemory();
}

// "GPU 0 MI300X"; on a job of several nodes "node-b · GPU 0 MI300X" (one node: no node named).
function gpuLabel(key) {
  const { node, gpu } = devOf(key);
  const name = state.gpuNames && state.gpuNames.get(key);
  const label = gpu === -1 ? "host memory (CPU job)" : `${deviceLabel(gpu)}${name ? ` ${name}` : ""}`;
  const nodes = new Set([...state.mem.keys()].map((k) => devOf(k).node));
  return nodes.size > 1 && node ? `${node} · ${label}` : label;
}

function drawMemory() {
  if (!state.memAvailable) return;
  axisNow();
  const axis = axisFor(true);
  const at = (t) => xOf(axis, axisMap, { t });
  const traces = [], shapes = [];
  const colors = ["#2f6fed", "#e4572e", "#1a7f37", "#7a3ee8", "#d08a00", "#0d9ea0", "#a1306b", "#555"];
  const hover = "%{y:.4~g} GiB";
  let i = 0, maxTotal = 0, maxUsed = 0;
  for (const [gpu, g] of byDevice(state.mem)) {
    const color = colors[i++ % colors.length];
    for (const b of g.y) if (b > maxUsed) maxUsed = b;
    traces.push({ name: plain(`${gpuLabel(gpu)} used`), x: g.t.map(at), y: g.y.map((b) => b / GiB),
      mode: mode(g.y), line: { color, width: 1.5 }, marker: { color, size: 6 }, hovertemplate: hover });
    const total = state.memTotal.get(gpu);
    if (total && g.t.length) {
      maxTotal = Math.max(maxTotal, total);
      const x = [at(g.t[0]), at(g.t[g.t.length - 1])];
      traces.push({ name: plain(`${gpuLabel(gpu)} total`), x, y: [total / GiB, total / GiB], mode: "lines", line: { color, dash: "dash", width: 1 }, hovertemplate: hover });
    }
  }
  let n = 0;
  for (const g of state.mem.values()) n += g.y.length;
  $("#mem-n").textContent = `${n} samples shown${state.memDownsampled ? " (downsampled)" : ""}${state.memZoom ? ", zoomed" : ""}`;
  drawGpu();
  drawXgmi();
  summary();
  axisNote();
  if (!n) return empty("mem-chart", noData("memory samples"));
  if (maxTotal && state.nearOom) {
    // The same threshold as the vram_near_oom alert (the server's setting), from the largest device.
    const pct = Math.round(100 * state.nearOom);
    shapes.push({ type: "rect", xref: "paper", x0: 0, x1: 1, yref: "y", y0: (state.nearOom * maxTotal) / GiB, y1: maxTotal / GiB,
      fillcolor: "rgba(196,50,26,0.12)", line: { width: 0 }, layer: "below", name: `near-OOM ≥ ${pct}% (alert threshold)`,
      showlegend: true, label: { text: `near-OOM ≥ ${pct}%`, textposition: "top left", font: { size: 11, color: "#c4321a" } } });
  }
  const peaks = series("vram_reserved");
  if (peaks.y.some((y) => y > 0)) { // CPU runs record zeros: nothing to show
    traces.push({ name: "RECORD_VRAM peak reserved (main rank)", x: xsOf(peaks, axis), y: peaks.y,
      mode: "markers", marker: { symbol: "diamond", size: 6, color: "#111" }, hovertemplate: hover });
  }
  const am = alertMarkers(axis);
  am.y = am.x.map(() => (maxTotal ? maxTotal / GiB : null));
  if (am.x.length) traces.push(am);
  // Host RAM of a CPU job is a sliver of the machine: then scale to the job and say where the total is.
  const offScale = maxTotal && maxUsed && maxUsed < 0.4 * maxTotal;
  if (offScale) for (const tr of traces) if (tr.name.endsWith(" total")) tr.name += ` ${(maxTotal / GiB).toFixed(0)} GiB (off scale)`;
  if (offScale) am.y = am.x.map(() => maxUsed / GiB);
  if (offScale) for (const sh of shapes) if (sh.showlegend) sh.name += " (off scale)";
  let top = offScale ? maxUsed : Math.max(maxUsed, maxTotal);
  for (const y of peaks.y) if (y > 0) top = Math.max(top, y * GiB);
  const yaxis = { title: { text: "GiB" }, automargin: true, range: [0, (1.08 * top) / GiB || 1] };
  Plotly.react("mem-chart", traces, layout("", { datarevision: ++revision, uirevision: axis, yaxis, xaxis: xaxisOf(axis),
    shapes: [...shapes, ...alertShapes(axis)] }), config);
}

// Utilisation and temperature, when the telemetry carries them (NVML / amdsmi samples; host ones: CPU only).
function drawGpu() {
  const traces = [];
  const utils = [], temps = [];
  const axis = axisFor(true);
  for (const [gpu, g, dev] of byDevice(state.mem)) {
    const x = g.t.map((t) => xOf(axis, axisMap, { t }));
    if (g.util.some((v) => v !== null)) {
      utils.push(g.util);
      // A CPU job's sampler reports its processes' CPU percent (over 100 with several cores busy).
      const who = dev.gpu === -1 ? "CPU (the job's processes)" : gpuLabel(gpu);
      traces.push({ name: plain(`${who} utilisation`), x, y: g.util, mode: mode(g.util), hovertemplate: "%{y:.3~g} %" });
    }
    // Every sensor the part has: edge (none on MI300-series parts), junction, the hottest HBM stack.
    for (const [k, sensor, dash] of [["temp", "edge", "dot"], ["junction", "junction", "dash"], ["hbm", "HBM", "dashdot"]]) {
      if (!g[k].some((v) => v !== null)) continue;
      temps.push(g[k]);
      traces.push({ name: plain(`${gpuLabel(gpu)} ${sensor} temperature`), x, y: g[k], yaxis: "y2", mode: mode(g[k]),
        line: { dash }, hovertemplate: "%{y:.3~g} °C" });
    }
    for (const [k, why] of [["tpower", "power"], ["tthermal", "thermal"], ["thbm", "HBM thermal"]]) {
      if (!g[k].some((v) => v)) continue;
      const y = g[k].map((v) => (v === null ? null : 100 * v));
      utils.push(y);
      traces.push({ name: plain(`${gpuLabel(gpu)} throttled (${why}) %`), x, y, mode: mode(y), hovertemplate: "%{y:.3~g} % of the interval" });
    }
    if (g.power.some((v) => v !== null)) {
      traces.push({ name: plain(`${gpuLabel(gpu)} power W`), x, y: g.power, yaxis: "y3", mode: mode(g.power), hovertemplate: "%{y:.4~g} W" });
    } else if (state.powerShared && state.powerShared.has(gpu)) {
      // An MI250X's secondary GCD reports none: the card's power is on the die it names (never summed).
      traces.push({ name: plain(`${gpuLabel(gpu)} power: shared with GPU ${state.powerShared.get(gpu)}`), x: [], y: [], yaxis: "y3" });
    }
  }
  $("#gpu-card").hidden = !traces.length;
  if (!traces.length) return;
  const am = alertMarkers(axis);
  am.y = am.x.map(() => 100);
  if (am.x.length) traces.push({ ...am, showlegend: false });
  Plotly.react("gpu-chart", traces, layout("", { datarevision: revision, uirevision: axis, xaxis: xaxisOf(axis), shapes: alertShapes(axis), showlegend: true, // even for one trace: whose
    yaxis: { title: { text: "utilisation %" }, range: range(utils.length ? utils : [[0, 100]]), automargin: true },
    yaxis2: { title: { text: "°C" }, overlaying: "y", side: "right", tickmode: "auto", showgrid: false, range: range(temps.length ? temps : [[0, 100]]), automargin: true },
    yaxis3: { title: { text: "W" }, overlaying: "y", side: "right", anchor: "free", position: 1, showgrid: false, automargin: true } }), config);
}
// Bytes/s between consecutive samples of a device from its cumulative counters (on a downsampled
// series, the average over each drawn stretch); none across a counter that went back (a driver reload).
function perSecond(t, v) {
  return v.map((x, i) => {
    const p = i ? v[i - 1] : null;
    return x !== null && p !== null && x >= p && t[i] > t[i - 1] ? (x - p) / (t[i] - t[i - 1]) : null;
  });
}

// xGMI traffic by direction (AMD MI300 series; the card stays hidden where no GPU counts it).
function drawXgmi() {
  const traces = [];
  const axis = axisFor(true);
  for (const [gpu, g] of byDevice(state.mem)) {
    const x = g.t.map((t) => xOf(axis, axisMap, { t }));
    for (const [k, what, dash] of [["xread", "read", "solid"], ["xwrite", "written", "dot"]]) {
      if (!g[k].some((v) => v !== null)) continue;
      const y = perSecond(g.t, g[k]).map((v) => (v === null ? null : v / 1e9));
      traces.push({ name: plain(`${gpuLabel(gpu)} xGMI ${what}`), x, y, mode: mode(y), line: { dash }, hovertemplate: "%{y:.4~g} GB/s" });
    }
  }
  $("#xgmi-card").hidden = !traces.length;
  if (!traces.length) return;
  Plotly.react("xgmi-chart", traces, layout("", { datarevision: revision, uirevision: axis, xaxis: xaxisOf(axis), shapes: alertShapes(axis), showlegend: true,
    yaxis: { title: { text: "GB/s" }, rangemode: "tozero", automargin: true } }), config);
}
const redrawMemory = throttled(drawMemory);

// ------------------------------------------------------------------ alerts, logs, config, files
// Reads of the list can overlap each other and the stream: a read's answer is drawn only when no newer
// read was asked for, and alerts the stream brought while it was in flight are kept (its answer may
// predate them), so an alert once shown never vanishes for an older answer.
let alertReads = 0;
let streamed = [];  // [read number when it came, alert] for alerts the stream brought
async function loadAlerts() {
  const n = ++alertReads;
  const rows = await optional(`/api/jobs/${jobId}/alerts`).catch(() => null);
  if (rows === null || n !== alertReads) return;
  const byId = new Map(rows.map((a) => [a.id, a]));
  for (const [at, a] of streamed) if (at >= n && !byId.has(a.id)) byId.set(a.id, a);
  streamed = streamed.filter(([at]) => at > n);
  showAlerts([...byId.values()].sort((a, b) => a.id - b.id));
}

// The stream sends each alert as the engine opens it: shown at once, no request. (Changes to ones the
// page holds come as `job` events, and the list is read again then.)
function addAlerts(rows) {
  const byId = new Map(state.alerts.map((a) => [a.id, a]));
  for (const a of rows) { byId.set(a.id, a); streamed.push([alertReads, a]); }  // the alert list's row shape
  showAlerts([...byId.values()].sort((a, b) => a.id - b.id));
}

function showAlerts(rows) {
  state.alerts = rows;
  const box = $("#alerts");
  if (!rows.length) { box.replaceChildren(h("span", { class: "muted", text: "none" })); return; }
  box.replaceChildren(...rows.map((a) => alertItem(a, jobId)));
  // Only charts already drawn: the others draw their alerts when their data comes (on a page just
  // opened, the alerts usually come first, and redrawing then would draw every chart twice).
  if ("loss-chart" in drawn) redrawMetrics();
  if (state.memLoaded) redrawMemory();
}
let alertTimer = null;
function scheduleAlerts() {
  if (alertTimer) return;
  alertTimer = setTimeout(() => { alertTimer = null; loadAlerts(); }, 1000);
}

function addLogs(rows) {
  const pre = $("#logs");
  const text = rows.map((r) => (r.stream === "stderr" ? r.text : r.stream === "runner" ? `[tunedeck] ${r.text}` : r.text)).join("\n");
  pre.append(document.createTextNode((state.logLines ? "\n" : "") + text));
  state.logLines += rows.length;
  // Keep the page light on a long run: only the newest lines stay in the DOM.
  if (pre.childNodes.length > 400) {
    const kept = pre.textContent.split("\n").slice(-5000).join("\n");
    pre.textContent = kept;
  }
  $("#log-n").textContent = `${state.logLines} lines`;
  if ($("#follow").checked) pre.scrollTop = pre.scrollHeight;
}

async function loadConfig() {
  const c = await get(`/api/jobs/${jobId}/config`);
  $("#train-yaml").textContent = c.train_yaml;
  $("#ds-config").textContent = c.ds_config || "–";
  const env = Object.entries(c.env || {}).map(([k, v]) => `${k}=${v}`).join("\n");
  $("#paths").replaceChildren(h("span", { class: "muted", text: "run folder" }), h("code", { text: c.run_dir }),
    h("span", { class: "muted", text: "output folder" }), h("code", { text: c.output_dir }),
    h("span", { class: "muted", text: "environment" }), h("code", { id: "job-env", class: env ? "env" : "muted", text: env || "none set" }));
}

// Checkpoints folded away: a run with many saves lists dozens of files per checkpoint.
async function loadFiles() {
  const files = await get(`/api/jobs/${jobId}/files`);
  if (!files.length) {
    $("#files").replaceChildren(h("span", { class: "muted", text: "no files yet" }));
    $("#downloads").replaceChildren();
    await showResults(state.job);
    actionsFiles({ adapter: false });
    return;
  }
  const groups = new Map();
  for (const f of files) {
    const m = /^(checkpoint-(\d+))\//.exec(f.path);
    const key = m ? m[1] : "";
    if (!groups.has(key)) groups.set(key, { order: m ? Number(m[2]) : -1, files: [] });
    groups.get(key).files.push({ path: m ? f.path.slice(m[0].length) : f.path, bytes: f.bytes });
  }
  const final = groups.get("") || { files: [] };
  const adapter = final.files.some((f) => f.path === "adapter_config.json");
  const failed = (e) => refuse($("#refusals"), "Download failed", e);
  const archive = (what, text) => downloadLink(`/api/jobs/${jobId}/archive?what=${what}`, text, `job${jobId}-${what}.zip`, failed, { "data-archive": what });
  $("#downloads").replaceChildren(h("span", { class: "muted", text: "download" }),
    ...(adapter ? [archive("adapter", "adapter (zip)")] : []), archive("output", "whole output folder (zip)"));
  $("#files").replaceChildren(...[...groups.entries()].sort((a, b) => a[1].order - b[1].order).map(([key, g]) => {
    const total = g.files.reduce((sum, f) => sum + f.bytes, 0);
    const file = (f) => {
      const path = key ? `${key}/${f.path}` : f.path;
      const url = `/api/jobs/${jobId}/files/${path.split("/").map(encodeURIComponent).join("/")}`;
      return downloadLink(url, f.path, path.split("/").pop(), failed, { "data-file": path });
    };
    return h("details", { class: "files", "data-group": key || "final" },
      h("summary", {}, h("b", { text: key || "final output" }), h("span", { class: "muted", text: ` · ${g.files.length} files · ${bytes(total)} · ` }),
        key ? archive(key, "download (zip)") : null),
      h("table", {}, h("tbody", {}, ...g.files.map((f) => h("tr", {}, h("td", {}, h("code", {}, file(f))),
        h("td", { class: "num", text: bytes(f.bytes) }))))));
  }));
  await showResults(state.job);
  actionsFiles({ adapter }); // after the results card: its Chat button is offered by who may act too
}

// ------------------------------------------------------------------ summary
function last(s) { return s && s.y.length ? [s.step[s.y.length - 1], s.y[s.y.length - 1]] : null; }

// The newest logged loss, inf or NaN too (the team page's "last loss" is the newest line's, whatever it
// held): [step, text, whether it was a number].
function lastLoss() {
  const s = state.metrics.loss, l = last(s);
  const bad = s && s.bad.step.length ? s.bad.step.length - 1 : -1;
  if (bad >= 0 && (!l || s.bad.step[bad] >= l[0])) return [s.bad.step[bad], nonfiniteText(s.bad.value[bad]), false];
  return l && [l[0], num(l[1]), true];
}

function summary() {
  const j = state.job;
  if (!j) return;
  const rows = [];
  const add = (key, value, bad = false) => rows.push(h("span", { class: "muted", text: key }),
    h("span", { class: bad ? "num nonfinite" : "num", "data-key": key, text: value, title: bad ? "the loss is not a finite number" : null }));
  const l = lastLoss();
  add("last loss", l ? `${l[1]} at step ${l[0]}` : "–", l && !l[2]);
  const ev = state.metrics.eval_loss;
  if (ev && ev.y.length) {
    let b = 0;
    ev.y.forEach((y, i) => { if (y < ev.y[b]) b = i; });
    add("best eval loss", `${num(ev.y[b])} at step ${ev.step[b]}`);
  } else add("best eval loss", "–");
  const p = j.progress || {};
  add("steps", p.total_steps ? `${p.current_steps ?? 0} / ${p.total_steps}` : `${p.current_steps ?? (l ? l[0] : "–")}`);
  add("runtime", duration(runtime()));
  const tp = last(state.metrics.throughput);
  add("tokens/s", tp ? `${num(tp[1])} (last)` : "–");
  const est = state.estimate && state.estimate.estimate;
  for (const [gpu, g, dev] of byDevice(state.mem)) {
    const peak = g.y.reduce((m, y) => (y > m ? y : m), 0); // a long live run holds too many for Math.max(...)
    const total = state.memTotal.get(gpu);
    let text = `${bytes(peak)}${total ? ` of ${bytes(total)}` : ""}`;
    if (est && dev.gpu >= 0) text += ` · estimate ${bytes(est.per_gpu_bytes)} (measured ${num(peak / est.per_gpu_bytes, 3)}×)`;
    add(`peak ${gpuLabel(gpu)}`, text);
  }
  if (!state.mem.size) add("peak memory", est ? `no samples · estimate ${bytes(est.per_gpu_bytes)} per GPU` : "no samples");
  $("#summary").replaceChildren(...rows);
}

function runtime() {
  const j = state.job;
  const t = (iso) => (iso ? new Date(/Z|[+-]\d\d:?\d\d$/.test(iso) ? iso : iso + "Z").getTime() / 1000 : null);
  const start = t(j.started_at), end = t(j.finished_at) ?? (j.status === "running" ? Date.now() / 1000 : null);
  const s = ["loss", "eval_loss", "lr"].map((n) => state.metrics[n]).find((m) => m && m.t.length);
  const logged = s ? s.t[s.t.length - 1] - s.t[0] : null;
  // A run whose times say less than its trainer log's clock (a launch's first step came late): the clock.
  return start !== null && end !== null ? Math.max(end - start, logged ?? 0) : logged;
}

// ------------------------------------------------------------------ start
async function start() {
  // Every request that does not need another's answer goes out at once; the charts' data does not wait
  // for plotly.js, nor for the estimate (only the summary shows it).
  const estimate = optional(`/api/jobs/${jobId}/estimate`).catch(() => null);
  const basics = Promise.all([get("/api/stream/cursor"), get("/api/health")]);
  const job = get(`/api/jobs/${jobId}`);
  onMe((me) => {
    state.me = me;
    actionsMe(me);
    if (state.job) showActions(state.job, ["succeeded", "failed", "cancelled"].includes(state.job.status));
  });
  try {
    showJob(await job);
  } catch (e) {
    document.querySelector("main").replaceChildren(h("div", { class: "error", text: `Cannot load job ${jobId}: ${describe(e)}` }));
    return;
  }
  // Everything up to `now` comes from history; the stream sends only what is newer.
  const [{ cursor: now }, health] = await basics;
  const m = Number(/^m(\d+)/.exec(now)[1]);
  const s = Number(/-s(\d+)/.exec(now)[1]);
  state.memCursor = s;
  state.memLast = s;
  state.nearOom = health.near_oom_share;
  const memory = loadMemory(null); // may take longer on a huge run: the stream does not wait for it
  const estimated = estimate.then((e) => { state.estimate = e; summary(); });
  const loaded = Promise.all([loadSeries(null, m), loadConfig(), loadFiles(), loadAlerts()]);
  loadPlotly(); // evaluated while the server answers the requests just sent, not before they go out
  await loaded;
  state.metricsLast = Math.max(state.metricsLast, m);
  live({ job: jobId, cursor: `m${m}-l0-s${s}-a0-j0` }, {
    job: showJob,
    metrics: addMetrics,
    memory: addMemory,
    logs: addLogs,
    alerts: addAlerts,
  }, indicator);
  onZoom(document.getElementById("loss-chart"), (range) => {
    state.lossZoom = range && range.map((x) => toSteps(axisFor(false), axisMap, x));
    range = state.lossZoom;
    loadSeries(range, range ? undefined : state.metricsLast);
    keepView();
  });
  onZoom(document.getElementById("mem-chart"), (range) => {
    state.memZoom = range ? range.map((x) => toTime(axisFor(true), axisMap, x)) : null;
    if (range) loadMemory(state.memZoom); else { state.memCursor = state.memLast; loadMemory(null); }
    keepView();
  });
  await Promise.all([memory, estimated]);
  restoreZoom();
  window.tunedeckReady = true;
}
start();
