// GPU inventory: which job holds which GPU; refreshed every few seconds. Also the team's open alerts.
import { describe, live, optional } from "./api.js";
import { $, bytes, h, nav } from "./fmt.js";

const indicator = nav("/nodes");

const known = (v) => v !== null && v !== undefined;

// An MI250X's secondary GCD reports no power: the card's whole power is on the die it names.
function power(g) {
  if (known(g.power_w)) return `${Math.round(g.power_w)} W`;
  return known(g.power_shared_with) ? `shared with GPU ${g.power_shared_with}` : "–";
}

// Edge where the part has one (MI300-series parts have none), junction and the hottest HBM stack.
function temps(g) {
  const parts = [["edge", g.temp_c], ["junction", g.temp_junction_c], ["HBM", g.temp_hbm_c]].filter(([, v]) => known(v));
  return parts.length ? parts.map(([k, v]) => `${k} ${Math.round(v)}°C`).join(", ") : "–";
}

function ecc(g) {
  if (!known(g.ecc_correctable) && !known(g.ecc_uncorrectable)) return h("span", { class: "muted", text: "–" });
  const blocks = Object.entries(g.ecc_blocks || {}).map(([b, [ce, ue]]) => `${b} ${ce}/${ue}`).join(", ");
  return h("span", { class: g.ecc_uncorrectable ? "sev-critical" : "", title: "correctable / uncorrectable",
    text: `${g.ecc_correctable ?? "–"} / ${g.ecc_uncorrectable ?? "–"}${blocks ? ` (${blocks})` : ""}` });
}

function throttle(g) {
  const held = Object.entries(g.throttle || {}).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${Math.round(100 * v)}%`);
  const now = (g.throttle_reasons || []).join(", ");
  return held.length || now ? [held.join(", "), now].filter(Boolean).join("; ") : "none";
}

// A rate in binary units, as the totals beside it: "3.5 MiB/s".
function perSecond(v) {
  const units = ["B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v < 10 && i ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

// xGMI traffic: each direction's rate between the server's last two readings, and its total since the
// driver loaded (AMD MI300 series; "–" where the part has no counters or the rate is unknown).
function xgmi(g) {
  if (!known(g.xgmi_read_bytes) && !known(g.xgmi_write_bytes)) return h("span", { class: "muted", text: "–" });
  const rate = (v) => (known(v) ? perSecond(v) : "–");
  return h("span", { title: `since the driver loaded: read ${bytes(g.xgmi_read_bytes)}, written ${bytes(g.xgmi_write_bytes)}` },
    `${rate(g.xgmi_read_bytes_per_s)} / ${rate(g.xgmi_write_bytes_per_s)}`,
    h("span", { class: "muted", text: ` (${bytes(g.xgmi_read_bytes)} / ${bytes(g.xgmi_write_bytes)})` }));
}

function processes(g) {
  if (!g.processes || !g.processes.length) return h("span", { class: "muted", text: "none" });
  return h("span", {}, ...g.processes.map((p, i) => h("span", { class: "proc", "data-pid": p.pid },
    i ? ", " : "", `${p.name || "?"} (pid ${p.pid}${known(p.vram_bytes) ? `, ${bytes(p.vram_bytes)}` : ""})`,
    p.job_id ? [" ", h("a", { href: `/jobs/${p.job_id}`, text: `#${p.job_id}` })] : "")));
}

function gpuRow(g) {
  const pct = g.total_bytes ? (100 * (g.used_bytes || 0)) / g.total_bytes : 0;
  const mode = [g.partition, known(g.clock_mhz) ? `${Math.round(g.clock_mhz)} MHz` : null].filter(Boolean).join(", ");
  return h("tr", { "data-gpu": g.index }, h("td", { class: "num", text: g.index }), h("td", { text: g.name || "–", title: g.serial || "" }),
    h("td", {}, h("code", { text: g.bus_id || "–" })),
    h("td", {}, h("span", { class: "bar" }, h("i", { style: `width:${pct}%` })), ` ${bytes(g.used_bytes)} / ${bytes(g.total_bytes)}`),
    h("td", { class: "num", text: g.util === null || g.util === undefined ? "–" : `${g.util}%` }),
    h("td", { class: "power", text: power(g) }), h("td", { class: "temps", text: temps(g) }), h("td", { class: "ecc" }, ecc(g)),
    h("td", { class: "throttle", text: throttle(g) }), h("td", { class: "xgmi" }, xgmi(g)), h("td", { text: mode || "–" }), h("td", { class: "procs" }, processes(g)),
    h("td", {}, g.job_id ? h("a", { href: `/jobs/${g.job_id}`, text: `#${g.job_id}` }) : h("span", { class: "muted", text: "free" })));
}

// One card per node; on a Ray cluster each names its Ray node id, and a node Ray lost is marked dead.
function nodeCard(n) {
  const dead = n.alive === false;
  // A plain sentence where the server has one: the GPU libraries' exceptions stay in the API (`reason`).
  const none = dead ? "Not read: the node is gone." : n.summary || (n.backend === "cpu" ? "No GPUs on this node: jobs run on the CPU." : "No GPU readings from this node.");
  return h("div", { class: `card${dead ? " dead" : ""}`, "data-node": n.id || n.name, "data-alive": dead ? "0" : "1" },
    h("h2", {}, `${n.name} `, n.id ? h("code", { class: "muted", text: n.id.slice(0, 8), title: n.id }) : "", " ",
      dead ? "" : h("span", { class: "badge", text: n.backend }), n.head ? h("span", { class: "badge", text: "head" }) : "",
      dead ? h("span", { class: "badge sev-critical", text: "dead" }) : "",
      n.gpu_slots ? h("span", { class: "muted", text: ` ${n.gpu_slots} GPU slot(s) in Ray` }) : ""),
    n.reason && !n.summary ? h("div", { class: "notice", text: n.reason }) : null,
    n.gpus.length ? h("table", {}, h("thead", {}, h("tr", {}, ...["#", "GPU", "bus id", "VRAM", "util", "power", "temperature", "ECC (corr / uncorr)", "throttled", "xGMI read / write", "mode", "processes", "job"].map((t) => h("th", { text: t })))),
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
