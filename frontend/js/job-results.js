// The job page's results card: eval/predict metrics, generations beside their labels (paged), an
// export's files and size, and the way into chat for a finished train or export job.
/* global Plotly */
import { get, post } from "./api.js";
import { config, layout, plotlyReady } from "./charts.js";
import { $, bytes, chatHolds, h, num } from "./fmt.js";
import { refuse } from "./refusal.js";

const PAGE = 20;
let offset = 0;

function card() {
  let el = $("#results");
  if (!el) {
    el = h("div", { class: "card", id: "results" });
    $("#head").after(el);
  }
  return el;
}

// What each of LLaMA-Factory's result numbers counts (its BLEU and ROUGE scores are 0-100, the
// Trainer's loss is a cross-entropy in nats per token), by the end of the metric's name.
const UNITS = [
  [/^(bleu|rouge)/, "% (0–100)"],
  [/accuracy$/, "share (0–1)"],
  [/(^|_)loss$/, "nats/token"],
  [/perplexity$/, "× (e^loss)"],
  [/(runtime|_time)$/, "s"],
  [/samples_per_second$/, "samples/s"],
  [/steps_per_second$/, "steps/s"],
  [/tokens_per_second$/, "tokens/s"],
  [/^epoch$/, "epochs"],
];
export const unitOf = (name) => (UNITS.find(([re]) => re.test(name)) || [null, ""])[1];

function metricsTable(rows) {
  return h("table", { id: "result-metrics" }, h("thead", {}, h("tr", {}, h("th", { text: "split" }), h("th", { text: "metric" }), h("th", { text: "value" }), h("th", { text: "unit" }))),
    h("tbody", {}, rows.map((m) => h("tr", {}, h("td", { text: m.split }), h("td", { text: m.name }), h("td", { class: "num", text: num(m.value) }),
      h("td", { class: "muted", text: unitOf(m.name) })))));
}

async function predictionsPage(jobId, box) {
  const page = await get(`/api/jobs/${jobId}/predictions`, { offset, limit: PAGE });
  const pager = h("div", { class: "toolbar" },
    h("button", { class: "secondary", id: "pred-prev", disabled: offset === 0, onclick: () => { offset = Math.max(0, offset - PAGE); predictionsPage(jobId, box); } }, "‹ prev"),
    h("span", { class: "muted", id: "pred-range", text: `${page.total ? offset + 1 : 0}–${offset + page.rows.length} of ${page.total}` }),
    h("button", { class: "secondary", id: "pred-next", disabled: offset + PAGE >= page.total, onclick: () => { offset += PAGE; predictionsPage(jobId, box); } }, "next ›"));
  const table = h("table", { id: "predictions" },
    h("thead", {}, h("tr", {}, h("th", { text: "#" }), h("th", { text: "prompt" }), h("th", { text: "label" }), h("th", { text: "prediction" }))),
    h("tbody", {}, page.rows.map((r) => h("tr", {}, h("td", { class: "num", text: String(r.index + 1) }),
      h("td", {}, h("pre", { text: r.prompt })), h("td", {}, h("pre", { text: r.label })), h("td", {}, h("pre", { text: r.prediction }))))));
  box.replaceChildren(h("h2", { text: "Predictions" }), pager, h("div", { class: "scroll-x" }, table));
}

function exportBlock(e) {
  const chart = h("div", { class: "chart", id: "export-chart", style: "height:220px" });
  const block = h("div", {}, h("h2", { text: "Exported model" }),
    h("div", { class: "kv" }, h("span", { class: "muted", text: "folder size" }), h("span", { id: "export-total", text: bytes(e.total_bytes) }),
      h("span", { class: "muted", text: "weights" }), h("span", { text: bytes(e.weights_bytes) }),
      h("span", { class: "muted", text: "base model weights" }), h("span", { text: bytes(e.base_weights_bytes) }),
      h("span", { class: "muted", text: "adapter weights" }), h("span", { text: bytes(e.adapter_weights_bytes) })),
    chart);
  plotlyReady.then(() => requestAnimationFrame(() => Plotly.react(chart, [
    { type: "bar", name: "merged export", x: ["export"], y: [e.weights_bytes] },
    { type: "bar", name: "base", x: ["base + adapter"], y: [e.base_weights_bytes || 0] },
    { type: "bar", name: "adapter", x: ["base + adapter"], y: [e.adapter_weights_bytes || 0] },
  ], layout("weight files: merged export vs base + adapter (bytes)", { barmode: "stack", hovermode: "closest" }), config)));
  return block;
}

function chatButton(job) {
  if (job.kind === "chat") {
    return job.status === "running" ? h("a", { class: "button", id: "open-chat", href: `/jobs/${job.id}/chat` }, "Open chat") : null;
  }
  if (!["train", "export"].includes(job.kind) || !["succeeded", "cancelled"].includes(job.status)) return null;
  // Offered to whoever may act on the job (job-actions.js disables it, with the reason, for others).
  const button = h("button", { id: "start-chat", hidden: true, onclick: async () => {
    button.disabled = true;
    try {
      const chat = await post(`/api/jobs/${job.id}/chat`, { gpus: Math.min(job.gpus, 1) });
      location.href = `/jobs/${chat.id}/chat`;
    } catch (e) { refuse($("#refusals"), "Starting a chat failed", e); button.disabled = false; }
  } }, "Chat with this model");
  const holds = h("div", { class: "muted", id: "chat-holds" });
  get("/api/health").then((health) => { holds.textContent = chatHolds(health, Math.min(job.gpus, 1)); }).catch(() => {});
  return h("span", {}, button, " ", holds);
}

export async function showResults(job) {
  if (!job) return;
  const res = await get(`/api/jobs/${job.id}/results`);
  const parts = [];
  const chat = chatButton(job);
  if (chat) parts.push(h("div", { class: "toolbar" }, chat));
  if (res.metrics.length && job.kind !== "train") parts.push(h("h2", { text: "Results" }), h("div", { class: "scroll-x" }, metricsTable(res.metrics)));
  if (res.export) parts.push(exportBlock(res.export));
  const preds = h("div", { id: "predictions-box" });
  if (res.predictions) parts.push(preds);
  if (!parts.length) return;
  card().replaceChildren(...parts);
  if (res.predictions) await predictionsPage(job.id, preds);
}
