// Small formatters and DOM helpers.

export const $ = (sel, root = document) => root.querySelector(sel);

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i >= 3 ? 1 : 0)} ${units[i]}`;
}

export function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.max(0, Math.round(s));
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), mm = Math.floor((s % 3600) / 60), ss = s % 60;
  if (d) return `${d}d ${hh}h`;
  if (hh) return `${hh}h ${mm}m`;
  if (mm) return `${mm}m ${ss}s`;
  return `${ss}s`;
}

export function num(x, digits = 4) {
  if (x === null || x === undefined) return "–";
  return Math.abs(x) >= 1000 ? x.toFixed(0) : Number(x.toPrecision(digits)).toString();
}

// An inf or NaN value as every page names it (strict JSON carries it as a word: "nan", "inf", "-inf").
export function nonfiniteText(word) { return word === "nan" ? "NaN" : word; }

export function when(iso) {
  if (!iso) return "–";
  return utc(iso).toLocaleString();
}

// What a trainer is doing, in the words the job's log says it (contract/protocol.py PHASES holds the same).
export const PHASES = {
  waiting_for_ranks: "waiting for the other ranks",
  loading_model: "loading the model",
  preparing_dataset: "tokenizing the dataset",
  building_op: "building a DeepSpeed op",
  training: "training",
  evaluating: "evaluating",
  predicting: "generating predictions",
  saving: "saving a checkpoint",
  exporting: "exporting the model",
  serving: "serving chat requests",
};

function utc(iso) { return new Date(/Z|[+-]\d\d:?\d\d$/.test(iso) ? iso : iso + "Z"); }

// A job's phase in words, with how long it has lasted while the job runs: "building a DeepSpeed op (5m 2s)".
export function phaseText(j, now = Date.now()) {
  if (!j.phase) return "";
  const words = PHASES[j.phase] || j.phase.replace(/_/g, " ");
  if (j.status !== "running" || !j.phase_at) return words;
  return `${words} (${duration((now - utc(j.phase_at).getTime()) / 1000)})`;
}

export function statusBadge(status) { return h("span", { class: `badge s-${status}`, "data-status": status, text: status }); }

// A success whose loss went NaN, diverged or stayed stuck is not shown as a healthy green success.
export function verdictBadge(j) {
  if (j.verdict !== "succeeded_with_problems") return statusBadge(j.status);
  const problems = (j.alerts && j.alerts.problems) || [];
  return h("span", { class: "badge s-problems", "data-status": j.status, "data-verdict": j.verdict,
    title: `the run finished, but: ${problems.join(", ")}`, text: "succeeded with problems" });
}

// Each severity its own sign and colour: an info finding never looks like a warning.
export const SEVERITY_SIGN = { critical: "✖", warning: "⚠", info: "ℹ" };

// The worst alert a job ever had (open or closed), with how many of that severity and how many are open.
export function alertSummaryBadge(j) {
  const a = j.alerts || {};
  if (!a.worst) return "";
  const n = (a.counts || {})[a.worst] || 0;
  const parts = Object.entries(a.counts || {}).map(([sev, k]) => `${k} ${sev}`);
  return h("span", { class: `badge sev-${a.worst}`, "data-severity": a.worst,
    title: `alerts ever: ${parts.join(", ")}; ${a.open || 0} open now`,
    text: `${SEVERITY_SIGN[a.worst] || ""} ${a.worst} ${n}${a.open ? ` · ${a.open} open` : ""}` });
}

export function progressBar(p, wide = false) {
  const pct = p && p.percentage !== null && p.percentage !== undefined ? p.percentage : 0;
  return h("span", { class: `bar${wide ? " wide" : ""}`, title: `${pct.toFixed(1)}%` }, h("i", { style: `width:${Math.min(100, pct)}%` }));
}

// What starting a chat costs the team, in the server's own numbers (`/api/health`: TUNEDECK_CHAT_IDLE_S,
// the CPU slots): said wherever a chat is started.
export function chatHolds(health, gpus) {
  const idle = health.chat_idle_s;
  const span = idle >= 60 ? `${+(idle / 60).toFixed(1)} minutes` : `${idle} s`;
  const slot = gpus ? "its GPU" : health.cpu_slots === 1 ? "the only CPU slot" : "a CPU slot";
  return `A chat job holds ${slot} until you stop it or it has had no request for ${span}.`;
}

export function nav(here) {
  const links = [["/", "Jobs"], ["/new", "New job"], ["/compare", "Compare"], ["/nodes", "Nodes"]];
  const top = h("header", { class: "top" }, h("span", { class: "brand", text: "tunedeck" }),
    ...links.map(([href, label]) => h("a", { href, class: href === here ? "here" : null, text: label })),
    h("span", { class: "live", id: "live" }), h("span", { class: "who", id: "who" }));
  document.body.prepend(top);
  // Loaded apart: this module stays free of requests (identity.js asks the server who is asking).
  import("./identity.js").then((m) => m.showWho(top.querySelector("#who")));
  return top.querySelector("#live");
}
