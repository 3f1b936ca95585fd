// GPU inventory: which job holds which GPU; refreshed every few seconds. Also the team's open alerts.
import { describe, live, optional } from "./api.js";
import { $, bytes, h, nav } from "./fmt.js";

const indicator = nav("/nodes");

function gpuRow(g) {
  const pct = g.total_bytes ? (100 * (g.used_bytes || 0)) / g.total_bytes : 0;
  return h("tr", {}, h("td", { class: "num", text: g.index }), h("td", { text: g.name || "–" }), h("td", {}, h("code", { text: g.bus_id || "–" })),
    h("td", {}, h("span", { class: "bar" }, h("i", { style: `width:${pct}%` })), ` ${bytes(g.used_bytes)} / ${bytes(g.total_bytes)}`),
    h("td", { class: "num", text: g.util === null || g.util === undefined ? "–" : `${g.util}%` }),
    h("td", {}, g.job_id ? h("a", { href: `/jobs/${g.job_id}`, text: `#${g.job_id}` }) : h("span", { class: "muted", text: "free" })));
}

// One card per node; on a Ray cluster each names its Ray node id, and a node Ray lost is marked dead.
function nodeCard(n) {
  const dead = n.alive === false;
  const none = dead ? "Not read: the node is gone." : n.backend === "cpu" ? "No GPUs on this node: jobs run on the CPU." : "No GPU readings from this node.";
  return h("div", { class: `card${dead ? " dead" : ""}`, "data-node": n.id || n.name, "data-alive": dead ? "0" : "1" },
    h("h2", {}, `${n.name} `, n.id ? h("code", { class: "muted", text: n.id.slice(0, 8), title: n.id }) : "", " ",
      dead ? "" : h("span", { class: "badge", text: n.backend }), n.head ? h("span", { class: "badge", text: "head" }) : "",
      dead ? h("span", { class: "badge sev-critical", text: "dead" }) : "",
      n.gpu_slots ? h("span", { class: "muted", text: ` ${n.gpu_slots} GPU slot(s) in Ray` }) : ""),
    n.reason ? h("div", { class: "notice", text: n.reason }) : null,
    n.gpus.length ? h("table", {}, h("thead", {}, h("tr", {}, ...["#", "GPU", "bus id", "VRAM", "util", "job"].map((t) => h("th", { text: t })))),
      h("tbody", {}, ...n.gpus.map(gpuRow))) : h("p", { class: "muted", text: none }));
}

const RECENT = 20; // closed warning/critical alerts listed under "Recent problems"

function alertItem(a) {
  return h("div", { class: `alert-item${a.open ? "" : " closed"}`, "data-kind": a.kind, "data-severity": a.severity },
    h("span", { class: `badge sev-${a.severity}`, text: a.severity }), " ",
    h("a", { href: `/jobs/${a.job_id}`, text: `#${a.job_id}` }), ` ${a.kind}: ${a.message}`,
    a.suggestion ? h("div", { class: "sugg", text: `→ ${a.suggestion}` }) : null);
}

function showAlerts(box, rows, none) {
  box.classList.toggle("muted", !rows || !rows.length);
  box.replaceChildren(...(rows === null ? ["Alerts are not available on this server yet."] : !rows.length ? [none] : rows.map(alertItem)));
}

async function refreshNodes() {
  try {
    const nodes = await optional("/api/nodes");
    if (nodes === null) { $("#nodes").replaceChildren(h("div", { class: "notice", text: "The node inventory is not available on this server yet." })); return; }
    $("#nodes").replaceChildren(...nodes.map(nodeCard));
  } catch (e) {
    $("#nodes").replaceChildren(h("div", { class: "error", text: describe(e) }));
  }
}

// Alerts come from the database: they never wait for the GPU libraries' reading.
async function refreshAlerts() {
  try {
    const [alerts, recent] = await Promise.all([optional("/api/alerts", { open: true }),
      optional("/api/alerts", { open: false, min_severity: "warning", order: "desc", limit: RECENT })]);
    const more = recent && recent.length ? `; ${recent.length === RECENT ? `${RECENT}+` : recent.length} recent problem(s) below` : "";
    showAlerts($("#alerts"), alerts, `No open alerts${more}.`);
    showAlerts($("#recent"), recent, "No recent problems.");
  } catch (e) {
    $("#alerts").replaceChildren(h("div", { class: "error", text: describe(e) }));
  }
}

async function refresh() {
  await Promise.all([refreshNodes(), refreshAlerts()]);
  window.tunedeckReady = true;
}

refresh();
setInterval(refresh, 5000);
// Job changes (start, finish) move GPUs between holders: refresh on them too.
let t = null;
live({}, { jobs: () => { clearTimeout(t); t = setTimeout(refresh, 300); } }, indicator);
