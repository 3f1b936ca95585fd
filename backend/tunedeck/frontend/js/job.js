// One job, live: history is loaded downsampled up to a cursor, then the job stream continues from it.
/* global Plotly */
import { describe, get, live, optional, post } from "./api.js";
import { config, ema, GiB, layout, onZoom, plain, throttled } from "./charts.js";
import { $, bytes, duration, h, nav, progressBar, statusBadge, when } from "./fmt.js";

const indicator = nav("");
const jobId = Number(location.pathname.split("/").filter(Boolean).pop());
const MAX_POINTS = 2000;
const state = {
  job: null,
  metrics: {}, // name -> {step: [], t: [], y: []}
  seriesNames: [],
  metricsLast: 0, // newest metric id held (history or stream)
  lossZoom: null,
  mem: new Map(), // gpu -> {t: [], y: [], name}
  memTotal: new Map(), // gpu -> total bytes
  memLast: 0,
  memZoom: null,
  memAvailable: true,
  alerts: [],
  logLines: 0,
  arrivals: [], // [step, epoch ms] of the newest streamed points (bench/ui_latency.py reads them)
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
  $("#status").replaceChildren(statusBadge(j.status));
  $("#owner").textContent = j.owner ? `by ${j.owner}` : "";
  const p = j.progress || {};
  $("#bar").replaceChildren(progressBar(p, true));
  $("#steps").textContent = p.total_steps ? `${p.current_steps ?? 0} / ${p.total_steps} steps` : "";
  $("#eta").textContent = j.status === "running" ? duration(p.eta_seconds) : "–";
  $("#gpus").textContent = j.gpus ? `${j.gpus}${j.devices ? ` (${j.devices.join(",")})` : ""}` : "CPU";
  $("#started").textContent = when(j.started_at);
  $("#finished").textContent = when(j.finished_at);
  const stop = $("#stop");
  const ended = ["succeeded", "failed", "cancelled"].includes(j.status);
  stop.disabled = ended || stop.dataset.sent === "1";
  if (ended) stop.textContent = j.status === "cancelled" ? "Stopped" : "Stop";
  const waits = j.status === "queued" && j.waiting_for;
  $("#waiting").replaceChildren(...(waits ? [h("div", { class: "notice", text: `Queued, #${j.queue_position} in line: ${j.waiting_for}` })] : []));
  // `error` also carries the cause of a stop or a clean exit: red only for failures.
  $("#error").replaceChildren(...(j.error ? [h("div", { class: j.status === "failed" ? "error" : "notice", text: j.error })] : []));
  $("#compare").href = `/compare?jobs=${j.id}`;
  if (was && was !== j.status && ended) loadFiles();
  scheduleAlerts();
}

$("#stop").addEventListener("click", async () => {
  const stop = $("#stop");
  stop.disabled = true;
  stop.dataset.sent = "1";
  stop.textContent = "Stopping…";
  try {
    showJob(await post(`/api/jobs/${jobId}/cancel`));
  } catch (e) {
    $("#error").replaceChildren(h("div", { class: "error", text: `Stop failed: ${describe(e)}` }));
    stop.dataset.sent = "";
    stop.disabled = false;
    stop.textContent = "Stop";
  }
});

// ------------------------------------------------------------------ metric charts
async function loadSeries(range, until) {
  const params = { max_points: MAX_POINTS, until };
  if (range) { params.x0 = Math.floor(range[0]); params.x1 = Math.ceil(range[1]); }
  const data = await get(`/api/jobs/${jobId}/series`, params);
  state.seriesNames = Object.keys(data.series); // the server's list: streamed rows carry the same names
  for (const [name, s] of Object.entries(data.series)) {
    state.metrics[name] = { step: s.step, t: s.t, y: s.y, n: s.n, bad: s.nonfinite_points || { step: [], t: [], value: [] } };
  }
  if (!range) state.metricsLast = Math.max(state.metricsLast, data.last_id || 0);
  state.lossDownsampled = data.downsampled;
  drawMetrics();
  drawMemory();
}

function addMetrics(rows) {
  let added = false;
  for (const r of rows) {
    if (r.id <= state.metricsLast) continue; // already in the loaded history
    state.metricsLast = r.id;
    if (r.loss !== null) state.arrivals.push([r.step, performance.timeOrigin + performance.now()]);
    if (state.arrivals.length > 5000) state.arrivals.splice(0, 1000);
    for (const name of state.seriesNames) {
      const bad = r.nonfinite && r.nonfinite[name];
      if (bad && r.step !== null) {
        const b = series(name).bad;
        b.step.push(r.step); b.t.push(r.t); b.value.push(bad);
      }
      if (r[name] === null || r[name] === undefined || r.step === null) continue;
      const s = series(name);
      s.step.push(r.step); s.t.push(r.t); s.y.push(r[name]);
      s.n = (s.n || 0) + 1;
    }
    added = true;
  }
  if (added && !state.lossZoom) { redrawMetrics(); redrawMemory(); }
}

function alertShapes(axis) {
  return state.alerts.filter((a) => (axis === "step" ? a.step !== null && a.step !== undefined : true)).map((a) => ({
    type: "line", xref: "x", yref: "paper", y0: 0, y1: 1,
    x0: axis === "step" ? a.step : new Date(a.t * 1000), x1: axis === "step" ? a.step : new Date(a.t * 1000),
    line: { color: a.severity === "critical" || a.severity === "error" ? "#c4321a" : "#d08a00", width: 1, dash: "dot" },
  }));
}

function alertMarkers(axis) {
  const marks = state.alerts.filter((a) => axis !== "step" || (a.step !== null && a.step !== undefined));
  return {
    name: "alerts", mode: "markers", type: "scatter", yaxis: "y", marker: { symbol: "triangle-down", size: 10, color: "#d08a00" },
    x: marks.map((a) => (axis === "step" ? a.step : new Date(a.t * 1000))),
    y: marks.map(() => null), text: marks.map((a) => plain(`${a.kind}: ${a.message}`)), hoverinfo: "text",
  };
}

let revision = 0; // Plotly.react redraws arrays grown in place only when this changes

function drawMetrics() {
  revision++;
  const loss = series("loss"), evl = series("eval_loss"), lr = series("lr"), tp = series("throughput");
  const w = Number($("#smooth").value);
  const logy = $("#logy").checked;
  const markersY = (xs) => xs.map((x) => {
    const i = loss.step.findIndex((s) => s >= x);
    return i >= 0 ? loss.y[i] : loss.y[loss.y.length - 1] ?? null;
  });
  const am = alertMarkers("step");
  am.y = markersY(am.x);
  const bad = [loss, evl].flatMap((s, k) => s.bad.step.map((x, i) => [x, `${k ? "eval loss" : "loss"} ${s.bad.value[i]}`]));
  const nonfinite = {
    name: "inf / NaN", mode: "markers", type: "scatter", marker: { symbol: "x", size: 9, color: "#c4321a" },
    x: bad.map((b) => b[0]), y: markersY(bad.map((b) => b[0])), text: bad.map((b) => b[1]), hoverinfo: "x+text",
  };
  Plotly.react("loss-chart", [
    { name: "loss", x: loss.step, y: loss.y, mode: "lines", line: { color: "rgba(47,111,237,0.25)", width: 1 } },
    { name: `loss (smoothed ${w.toFixed(2)})`, x: loss.step, y: ema(loss.y, w), mode: "lines", line: { color: "#2f6fed", width: 2 } },
    { name: "eval loss", x: evl.step, y: evl.y, mode: "lines+markers", line: { color: "#e4572e", width: 2 }, marker: { size: 6 } },
    am,
    nonfinite,
  ], layout("", { datarevision: revision, xaxis: { title: { text: "step" } }, yaxis: { type: logy ? "log" : "linear" }, shapes: alertShapes("step") }), config);
  Plotly.react("lr-chart", [{ name: "lr", x: lr.step, y: lr.y, mode: "lines", line: { color: "#7a3ee8" } }],
    layout("", { datarevision: revision, xaxis: { title: { text: "step" } }, yaxis: { exponentformat: "e" }, showlegend: false }), config);
  Plotly.react("tp-chart", [{ name: "tokens/s", x: tp.step, y: tp.y, mode: "lines", line: { color: "#1a7f37" } }],
    layout("", { datarevision: revision, xaxis: { title: { text: "step" } }, showlegend: false }), config);
  $("#loss-n").textContent = `${loss.n ?? loss.y.length} points${state.lossDownsampled ? " (downsampled for display)" : ""}${state.lossZoom ? ", zoomed" : ""}`;
}
const redrawMetrics = throttled(drawMetrics);

$("#smooth").addEventListener("input", () => { $("#smooth-v").textContent = Number($("#smooth").value).toFixed(2); drawMetrics(); });
$("#logy").addEventListener("change", drawMetrics);

// ------------------------------------------------------------------ memory chart
async function loadMemory(range) {
  const params = { max_points: MAX_POINTS, limit: 20000 };
  if (range) { params.t0 = range[0]; params.t1 = range[1]; }
  let page;
  try {
    page = await optional(`/api/jobs/${jobId}/memory`, params);
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
    const g = byGpu.get(s.gpu) || { t: [], y: [], ids: [] };
    g.t.push(s.t); g.y.push(s.used_bytes); g.ids.push(s.id);
    byGpu.set(s.gpu, g);
    if (s.total_bytes) state.memTotal.set(s.gpu, s.total_bytes);
  }
  for (const g of page.gpus || []) if (g.total_bytes) state.memTotal.set(g.gpu, g.total_bytes);
  if (!range) {
    // Samples the stream delivered while this history was loading come after it.
    for (const [gpu, old] of state.mem) {
      const g = byGpu.get(gpu) || { t: [], y: [], ids: [] };
      old.ids.forEach((id, i) => { if (id > state.memCursor) { g.t.push(old.t[i]); g.y.push(old.y[i]); g.ids.push(id); } });
      byGpu.set(gpu, g);
    }
  }
  state.mem = byGpu;
  state.gpuNames = new Map((page.gpus || []).map((g) => [g.gpu, g.name]));
  state.memDownsampled = page.downsampled;
  drawMemory();
}

function addMemory(rows) {
  for (const s of rows) {
    if (s.id <= state.memLast) continue;
    state.memLast = s.id;
    const g = state.mem.get(s.gpu) || { t: [], y: [], ids: [] };
    g.t.push(s.t); g.y.push(s.used_bytes); g.ids.push(s.id);
    state.mem.set(s.gpu, g);
    if (s.total_bytes) state.memTotal.set(s.gpu, s.total_bytes);
  }
  if (!state.memZoom) redrawMemory();
}

function gpuLabel(gpu) {
  if (gpu === -1) return "host RAM (CPU job)";
  const name = state.gpuNames && state.gpuNames.get(gpu);
  return `GPU ${gpu}${name ? ` ${name}` : ""}`;
}

function drawMemory() {
  if (!state.memAvailable) return;
  const traces = [], shapes = [];
  const colors = ["#2f6fed", "#e4572e", "#1a7f37", "#7a3ee8", "#d08a00", "#0d9ea0", "#a1306b", "#555"];
  let i = 0, maxTotal = 0, maxUsed = 0;
  for (const [gpu, g] of [...state.mem.entries()].sort((a, b) => a[0] - b[0])) {
    const color = colors[i++ % colors.length];
    for (const b of g.y) if (b > maxUsed) maxUsed = b;
    traces.push({ name: plain(`${gpuLabel(gpu)} used`), x: g.t.map((t) => new Date(t * 1000)), y: g.y.map((b) => b / GiB), mode: "lines", line: { color, width: 1.5 } });
    const total = state.memTotal.get(gpu);
    if (total && g.t.length) {
      maxTotal = Math.max(maxTotal, total);
      const x = [new Date(g.t[0] * 1000), new Date(g.t[g.t.length - 1] * 1000)];
      traces.push({ name: plain(`${gpuLabel(gpu)} total`), x, y: [total / GiB, total / GiB], mode: "lines", line: { color, dash: "dash", width: 1 } });
    }
  }
  if (maxTotal) {
    // The near-OOM band: the last 10% of the device before an allocation fails.
    shapes.push({ type: "rect", xref: "paper", x0: 0, x1: 1, yref: "y", y0: 0.9 * maxTotal / GiB, y1: maxTotal / GiB,
      fillcolor: "rgba(196,50,26,0.10)", line: { width: 0 }, layer: "below" });
  }
  const peaks = series("vram_reserved");
  if (peaks.y.some((y) => y > 0)) { // CPU runs record zeros: nothing to show
    traces.push({ name: "RECORD_VRAM peak reserved (main rank)", x: peaks.t.map((t) => new Date(t * 1000)), y: peaks.y,
      mode: "markers", marker: { symbol: "diamond", size: 6, color: "#111" } });
  }
  const am = alertMarkers("t");
  am.y = am.x.map(() => (maxTotal ? maxTotal / GiB : null));
  if (am.x.length) traces.push(am);
  let n = 0;
  for (const g of state.mem.values()) n += g.y.length;
  $("#mem-n").textContent = `${n} samples shown${state.memDownsampled ? " (downsampled)" : ""}${state.memZoom ? ", zoomed" : ""}`;
  // Host RAM of a CPU job is a sliver of the machine: then scale to the job and say where the total is.
  const offScale = maxTotal && maxUsed && maxUsed < 0.4 * maxTotal;
  if (offScale) for (const tr of traces) if (tr.name.endsWith(" total")) tr.name += ` ${(maxTotal / GiB).toFixed(0)} GiB (off scale)`;
  if (offScale) am.y = am.x.map(() => maxUsed / GiB);
  const yaxis = { title: { text: "GiB" }, rangemode: "tozero", ...(offScale ? { range: [0, (1.2 * maxUsed) / GiB] } : { autorange: true }) };
  Plotly.react("mem-chart", traces, layout("", { datarevision: ++revision, yaxis,
    shapes: [...shapes, ...alertShapes("t")] }), config);
}
const redrawMemory = throttled(drawMemory);

// ------------------------------------------------------------------ alerts, logs, config, files
async function loadAlerts() {
  const rows = await optional(`/api/jobs/${jobId}/alerts`).catch(() => null);
  if (rows === null) return;
  state.alerts = rows;
  const box = $("#alerts");
  if (!rows.length) { box.replaceChildren(h("span", { class: "muted", text: "none" })); return; }
  box.replaceChildren(...rows.map((a) => h("div", { class: `alert-item${a.open ? "" : " closed"}`, "data-kind": a.kind },
    h("span", { class: `badge sev-${a.severity}`, text: a.severity }), " ",
    h("b", { text: a.kind }), a.gpu !== null && a.gpu !== undefined ? ` · GPU ${a.gpu}` : "",
    a.step !== null && a.step !== undefined ? ` · step ${a.step}` : "", a.count > 1 ? ` · ×${a.count}` : "",
    a.open ? " · open" : " · resolved",
    h("div", { text: a.message }),
    a.suggestion ? h("div", { class: "sugg", text: `→ ${a.suggestion}` }) : null)));
  redrawMetrics();
  redrawMemory();
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
  $("#paths").replaceChildren(h("span", { class: "muted", text: "run folder" }), h("code", { text: c.run_dir }),
    h("span", { class: "muted", text: "output folder" }), h("code", { text: c.output_dir }));
}

async function loadFiles() {
  const files = await get(`/api/jobs/${jobId}/files`);
  $("#files tbody").replaceChildren(...(files.length ? files.map((f) => h("tr", {}, h("td", {}, h("code", { text: f.path })),
    h("td", { class: "num", text: bytes(f.bytes) }))) : [h("tr", {}, h("td", { class: "muted", text: "no files yet" }))]));
}

// ------------------------------------------------------------------ start
async function start() {
  try {
    showJob(await get(`/api/jobs/${jobId}`));
  } catch (e) {
    document.querySelector("main").replaceChildren(h("div", { class: "error", text: `Cannot load job ${jobId}: ${describe(e)}` }));
    return;
  }
  // Everything up to `now` comes from history; the stream sends only what is newer.
  const now = (await get("/api/stream/cursor")).cursor;
  const m = Number(/^m(\d+)/.exec(now)[1]);
  const s = Number(/-s(\d+)/.exec(now)[1]);
  state.memCursor = s;
  state.memLast = s;
  const memory = loadMemory(null); // may take longer on a huge run: the stream does not wait for it
  await Promise.all([loadSeries(null, m), loadConfig(), loadFiles(), loadAlerts()]);
  state.metricsLast = Math.max(state.metricsLast, m);
  live({ job: jobId, cursor: `m${m}-l0-s${s}-a0-j0` }, {
    job: showJob,
    metrics: addMetrics,
    memory: addMemory,
    logs: addLogs,
    alerts: scheduleAlerts,
  }, indicator);
  onZoom(document.getElementById("loss-chart"), (range) => {
    state.lossZoom = range;
    loadSeries(range, range ? undefined : state.metricsLast);
  });
  onZoom(document.getElementById("mem-chart"), (range) => {
    state.memZoom = range ? range.map((x) => new Date(x).getTime() / 1000) : null;
    if (range) loadMemory(state.memZoom); else { state.memCursor = state.memLast; loadMemory(null); }
  });
  await memory;
  window.tunedeckReady = true;
}
start();
