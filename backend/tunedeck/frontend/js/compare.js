// Overlay the loss and memory curves of chosen jobs, and list where their configs differ.
/* global Plotly */
import { describe, get, optional, post } from "./api.js";
import { config, ema, GiB, layout } from "./charts.js";
import { $, h, nav } from "./fmt.js";

nav("/compare");
const chosen = new Set((new URLSearchParams(location.search).get("jobs") || "").split(",").filter(Boolean).map(Number));
const cache = new Map(); // job id -> {series, memory, config}

async function data(id) {
  if (!cache.has(id)) {
    const [series, memory, cfg] = await Promise.all([
      get(`/api/jobs/${id}/series`, { max_points: 1500 }),
      optional(`/api/jobs/${id}/memory`, { max_points: 1500, limit: 20000 }).catch(() => null),
      get(`/api/jobs/${id}/config`),
    ]);
    const parsed = await post("/api/ui/parse-yaml", cfg.train_yaml, { yaml: true });
    cache.set(id, { series, memory, config: parsed.config, ds: cfg.ds_config });
  }
  return cache.get(id);
}

async function draw() {
  const u = new URL(location.href);
  u.searchParams.set("jobs", [...chosen].join(","));
  history.replaceState(null, "", u);
  const ids = [...chosen].sort((a, b) => a - b);
  let all;
  try { all = await Promise.all(ids.map(async (id) => [id, await data(id)])); } catch (e) {
    $("#diff").replaceChildren(h("div", { class: "error", text: describe(e) }));
    return;
  }
  const w = Number($("#smooth").value);
  Plotly.react("loss-chart", all.flatMap(([id, d]) => [
    { name: `#${id} loss`, x: d.series.series.loss.step, y: ema(d.series.series.loss.y, w), mode: "lines" },
    { name: `#${id} eval`, x: d.series.series.eval_loss.step, y: d.series.series.eval_loss.y, mode: "lines+markers", line: { dash: "dot" } },
  ]), layout("", { xaxis: { title: { text: "step" } }, yaxis: { type: $("#logy").checked ? "log" : "linear" } }), config);
  const memTraces = [];
  for (const [id, d] of all) {
    if (!d.memory || !d.memory.samples.length) continue;
    const t0 = d.memory.samples[0].t;
    const byGpu = new Map();
    for (const s of d.memory.samples) {
      const g = byGpu.get(s.gpu) || { x: [], y: [] };
      g.x.push(s.t - t0); g.y.push(s.used_bytes / GiB);
      byGpu.set(s.gpu, g);
    }
    for (const [gpu, g] of byGpu) memTraces.push({ name: `#${id} ${gpu === -1 ? "host memory" : `GPU ${gpu}`}`, ...g, mode: "lines" });
  }
  $("#mem-note").replaceChildren(...(memTraces.length ? [] : [h("div", { class: "notice", text: "No memory samples for these jobs." })]));
  Plotly.react("mem-chart", memTraces, layout("", { xaxis: { title: { text: "seconds since first sample" } }, yaxis: { title: { text: "GiB" } } }), config);
  diff(all);
}

function diff(all) {
  if (all.length < 2) { $("#diff").replaceChildren("Pick two or more jobs."); return; }
  const keys = new Set(all.flatMap(([, d]) => Object.keys(d.config)));
  keys.delete("output_dir");
  const rows = [];
  for (const k of [...keys].sort()) {
    const vals = all.map(([, d]) => JSON.stringify(d.config[k]));
    if (new Set(vals).size > 1) rows.push(h("tr", {}, h("td", {}, h("code", { text: k })), ...vals.map((v) => h("td", { text: v === undefined ? "—" : v }))));
  }
  const ds = all.map(([, d]) => d.ds || "");
  if (new Set(ds).size > 1) rows.push(h("tr", {}, h("td", {}, h("code", { text: "ds_config.json" })), ...ds.map((v) => h("td", { text: v ? "set (differs)" : "—" }))));
  $("#diff").classList.remove("muted");
  $("#diff").replaceChildren(rows.length
    ? h("table", {}, h("thead", {}, h("tr", {}, h("th", { text: "key" }), ...all.map(([id]) => h("th", { text: `#${id}` })))), h("tbody", {}, ...rows))
    : "The configs are the same.");
}

async function start() {
  const page = await get("/api/jobs", { limit: 200 });
  $("#pick").replaceChildren(...page.jobs.map((j) => h("label", {}, h("input", { type: "checkbox", value: j.id, checked: chosen.has(j.id),
    onchange: (ev) => { if (ev.target.checked) chosen.add(j.id); else chosen.delete(j.id); draw(); } }), ` #${j.id} ${j.name} `, h("span", { class: "muted", text: j.status }))));
  $("#logy").addEventListener("change", draw);
  $("#smooth").addEventListener("change", draw);
  await draw();
  window.tunedeckReady = true;
}
start();
