// Overlay a metric and the memory curves of chosen jobs, and list where their configs differ.
/* global Plotly */
import { describe, get, optional, post } from "./api.js";
import { config, defaultSmoothing, ema, empty, GiB, layout, mode, plain, range } from "./charts.js";
import { picker } from "./compare-pick.js";
import { $, h, nav } from "./fmt.js";

nav("/compare");
const chosen = new Set((new URLSearchParams(location.search).get("jobs") || "").split(",").filter(Boolean).map(Number));
const cache = new Map(); // job id -> {series, memory, config, ds, name}
const names = new Map(); // job id -> name
const COLORS = ["#2f6fed", "#e4572e", "#1a7f37", "#7a3ee8", "#d08a00", "#0d9ea0", "#a1306b", "#555",
  "#8c6d1f", "#c2185b", "#00838f", "#5d4037"];

// Each run's colour comes from its id, not its place in the list: a run keeps its colour whichever
// runs it is compared with (two chosen runs whose ids share one: the later takes the next free).
function colours(ids) {
  const out = new Map(), taken = new Set();
  for (const id of ids) {
    let k = Number(id) % COLORS.length;
    for (let n = 0; n < COLORS.length && taken.has(k); n++) k = (k + 1) % COLORS.length;
    taken.add(k);
    out.set(id, COLORS[k]);
  }
  return out;
}
const LABELS = { loss: "loss", eval_loss: "eval loss", lr: "learning rate", throughput: "throughput", grad_norm: "grad norm",
  total_tokens: "tokens seen", vram_allocated: "RECORD_VRAM allocated", vram_reserved: "RECORD_VRAM reserved" };
const UNITS = { throughput: "tokens/s", total_tokens: "tokens" };
const X_TITLES = { step: "step", time: "seconds since the first point", tokens: "tokens seen" };
const X_HOVER = { step: "", time: ".4~g", tokens: ".4~s" };
const X_LABEL = { step: "step %{x}", time: "%{x:.4~g} s", tokens: "%{x:.4~s} tokens" }; // x in hover, with its unit
const label = (m) => LABELS[m] || m;
let smoothChosen = false; // the user moved the slider: the default no longer follows the chosen runs

async function data(id) {
  if (!cache.has(id)) {
    const [series, memory, cfg] = await Promise.all([
      get(`/api/jobs/${id}/series`, { max_points: 1500 }),
      optional(`/api/jobs/${id}/memory`, { max_points: 1500, limit: 20000 }).catch(() => null),
      get(`/api/jobs/${id}/config`),
    ]);
    // An imported run may come without its train.yaml: nothing to parse, nothing to compare.
    const parsed = cfg.train_yaml.trim() ? await post("/api/ui/parse-yaml", cfg.train_yaml, { yaml: true }) : { config: {} };
    cache.set(id, { series: series.series, memory, config: parsed.config, ds: cfg.ds_config });
  }
  return cache.get(id);
}

// x values of one curve on the chosen axis; null where the job has no such x (no token counts).
function xsOf(series, curve, axis) {
  if (axis === "step") return curve.step;
  if (axis === "time") {
    const t0 = Math.min(...Object.values(series).filter((c) => c.t.length).map((c) => c.t[0]));
    return curve.t.map((t) => t - t0);
  }
  const tok = series.total_tokens;
  if (!tok || !tok.y.length) return curve.step.map(() => null);
  return curve.step.map((s) => {
    let i = tok.step.findIndex((x) => x >= s);
    if (i < 0) return null;
    if (tok.step[i] === s || i === 0) return tok.step[i] === s ? tok.y[i] : null;
    const f = (s - tok.step[i - 1]) / (tok.step[i] - tok.step[i - 1]); // eval rows carry no count: between its neighbours
    return tok.y[i - 1] + f * (tok.y[i] - tok.y[i - 1]);
  });
}

function curve(id, d, metric, axis, { color, dash, smooth }) {
  const c = d.series[metric];
  if (!c || !c.y.length) return null;
  const x = xsOf(d.series, c, axis);
  const keep = x.map((v) => v !== null);
  const y = (smooth ? ema(c.y, smooth) : c.y).filter((_, i) => keep[i]);
  if (!y.length) return null;
  const unit = UNITS[metric] ? ` ${UNITS[metric]}` : "";
  const name = plain(`#${id} ${names.get(id) || ""} ${label(metric)}`.replace(/ +/g, " "));
  return { name, x: x.filter((_, i) => keep[i]), y, mode: mode(y, dash ? "lines+markers" : "lines"),
    line: { color, dash: dash ? "dash" : "solid" }, marker: { color, size: 6 },
    hovertemplate: `${X_LABEL[axis]}: %{y:.4~g}${unit}`, hoverlabel: { namelength: -1 } };
}

function metricOptions(all, wanted) {
  const have = new Set(["loss"]);
  for (const [, d] of all) for (const [k, c] of Object.entries(d.series)) if (c.y.length && k !== "eval_loss") have.add(k);
  const sel = $("#metric"), was = wanted || sel.value;
  sel.replaceChildren(...[...have].map((k) => h("option", { value: k, text: k === "loss" ? "loss and eval loss" : label(k) })));
  sel.value = have.has(was) ? was : "loss";
}

function drawMetric(all) {
  const metric = $("#metric").value, axis = $("#xaxis").value, logy = $("#logy").checked;
  // The shortest chosen run's default: a short run is not smoothed into a shape it never had.
  const points = all.map(([, d]) => (d.series.loss ? d.series.loss.y.length : 0)).filter(Boolean);
  if (!smoothChosen && points.length) $("#smooth").value = defaultSmoothing(Math.min(...points));
  const w = Number($("#smooth").value);
  const title = metric === "loss" ? "loss" : label(metric);
  $("#metric-title").textContent = title[0].toUpperCase() + title.slice(1);
  if (!all.length) return empty("loss-chart", "Pick jobs above to overlay their curves.");
  const traces = [], colour = colours(all.map(([id]) => id));
  all.forEach(([id, d]) => {
    const color = colour.get(id);
    if (metric === "loss") {
      traces.push(curve(id, d, "loss", axis, { color, smooth: w }), curve(id, d, "eval_loss", axis, { color, dash: true }));
    } else traces.push(curve(id, d, metric, axis, { color }));
  });
  const shown = traces.filter(Boolean);
  if (!shown.length) {
    const why = axis === "tokens" ? " with token counts (total_tokens)" : "";
    return empty("loss-chart", `None of the chosen jobs logged ${metric === "loss" ? "a loss" : label(metric)}${why}.`);
  }
  return Plotly.react("loss-chart", shown, layout("", {
    xaxis: { title: { text: X_TITLES[axis] }, automargin: true, hoverformat: X_HOVER[axis], ticksuffix: axis === "time" ? " s" : "" },
    yaxis: { type: logy ? "log" : "linear", range: range(shown.map((t) => t.y), { log: logy }), automargin: true,
      title: { text: UNITS[metric] || "" } },
  }), config);
}

function drawMemory(all) {
  const traces = [], colour = colours(all.map(([id]) => id));
  all.forEach(([id, d]) => {
    if (!d.memory || !d.memory.samples.length) return;
    const t0 = d.memory.samples[0].t;
    const byGpu = new Map(); // per node and GPU: a job on several nodes repeats GPU indices
    for (const s of d.memory.samples) {
      const key = `${s.node || ""}/${s.gpu}`;
      const g = byGpu.get(key) || { x: [], y: [], node: s.node || "", gpu: s.gpu };
      g.x.push(s.t - t0); g.y.push(s.used_bytes / GiB);
      byGpu.set(key, g);
    }
    const several = new Set([...byGpu.values()].map((g) => g.node)).size > 1;
    const label = (g) => `${several && g.node ? `${g.node} · ` : ""}${g.gpu === -1 ? "host memory" : `GPU ${g.gpu}`}`;
    const dashes = ["solid", "dot", "dash", "longdash", "dashdot"];
    [...byGpu.values()].forEach(({ node, gpu, ...g }, i) => traces.push({ name: plain(`#${id} ${names.get(id) || ""} ${label({ node, gpu })}`),
      ...g, mode: mode(g.y), line: { color: colour.get(id), dash: dashes[i % dashes.length] },
      hovertemplate: "%{y:.4~g} GiB", hoverlabel: { namelength: -1 } }));
  });
  if (!traces.length) {
    return empty("mem-chart", all.length ? "No memory samples for these jobs." : "Pick jobs above to overlay their memory.");
  }
  const top = Math.max(...traces.flatMap((t) => t.y));
  return Plotly.react("mem-chart", traces, layout("", { xaxis: { title: { text: "seconds since first sample" }, automargin: true, ticksuffix: " s" },
    yaxis: { title: { text: "GiB" }, range: [0, 1.08 * top || 1], automargin: true } }), config);
}

async function draw() {
  const u = new URL(location.href);
  u.searchParams.set("jobs", [...chosen].join(","));
  // The view too (replaceState: no history entry a change), so a reload or a shared link keeps it.
  const put = (k, v) => (v ? u.searchParams.set(k, v) : u.searchParams.delete(k));
  put("metric", $("#metric").value !== "loss" ? $("#metric").value : null);
  put("x", $("#xaxis").value !== "step" ? $("#xaxis").value : null);
  put("logy", $("#logy").checked ? "1" : null);
  put("smooth", smoothChosen ? Number($("#smooth").value).toFixed(2) : null);
  history.replaceState(null, "", u);
  const ids = [...chosen].sort((a, b) => a - b);
  let all;
  try { all = await Promise.all(ids.map(async (id) => [id, await data(id)])); } catch (e) {
    $("#diff").replaceChildren(h("div", { class: "error", text: describe(e) }));
    return;
  }
  metricOptions(all, asked.metric);
  asked.metric = null; // asked for by the address once: from then on the menu says
  await drawMetric(all);
  await drawMemory(all);
  diff(all);
}

// Nested settings as dotted keys: a DeepSpeed file is compared key by key, not as one blob.
function flatten(obj, prefix, out) {
  for (const [k, v] of Object.entries(obj || {})) {
    if (v !== null && typeof v === "object" && !Array.isArray(v)) flatten(v, `${prefix}${k}.`, out);
    else out[`${prefix}${k}`] = v;
  }
  return out;
}

function settings(d) {
  const out = flatten(d.config, "", {});
  delete out.output_dir;
  if (d.ds) {
    delete out.deepspeed; // the path of the run's own copy: always different, says nothing
    try { flatten(JSON.parse(d.ds), "deepspeed.", out); } catch { out.deepspeed = "(not JSON)"; }
  }
  return out;
}

function shown(v) {
  if (v === undefined) return "—";
  if (typeof v === "string") return v;
  if (v !== null && typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function diff(all) {
  if (all.length < 2) { $("#diff").classList.add("muted"); $("#diff").replaceChildren("Pick two or more jobs."); return; }
  const flat = all.map(([, d]) => settings(d));
  const keys = new Set(flat.flatMap((f) => Object.keys(f)));
  const rows = [];
  for (const k of [...keys].sort()) {
    const vals = flat.map((f) => f[k]);
    if (new Set(vals.map((v) => JSON.stringify(v))).size > 1) {
      rows.push(h("tr", { "data-key": k }, h("td", {}, h("code", { text: k })), ...vals.map((v) => h("td", { text: shown(v) }))));
    }
  }
  $("#diff").classList.remove("muted");
  $("#diff").replaceChildren(rows.length
    ? h("table", {}, h("thead", {}, h("tr", {}, h("th", { text: "key" }), ...all.map(([id]) => h("th", { text: `#${id}` })))), h("tbody", {}, ...rows))
    : "The configs are the same.");
}

// What the address asks to show (draw() keeps it there).
const asked = Object.fromEntries(new URLSearchParams(location.search));
if (["step", "time", "tokens"].includes(asked.x)) $("#xaxis").value = asked.x;
if (asked.logy === "1") $("#logy").checked = true;
if (asked.smooth !== undefined && Number.isFinite(+asked.smooth)) { $("#smooth").value = +asked.smooth; smoothChosen = true; }

async function start() {
  await picker({ chosen, names, changed: draw });
  $("#smooth").addEventListener("input", () => { smoothChosen = true; });
  for (const id of ["#logy", "#smooth", "#metric", "#xaxis"]) $(id).addEventListener("change", draw);
  await draw();
  window.tunedeckReady = true;
}
start();
