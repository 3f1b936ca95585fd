// The team page: every job, live from the team stream (which sends every job's current row first).
import { live } from "./api.js";
import { $, alertSummaryBadge, bytes, duration, h, nav, num, progressBar, verdictBadge, when } from "./fmt.js";

const indicator = nav("/");
const jobs = new Map();
const filter = $("#filter");
filter.value = new URLSearchParams(location.search).get("status") || "";

function gpus(j) {
  if (!j.gpus) return "CPU";
  return j.devices ? `${j.gpus} (${j.devices.join(",")})` : String(j.gpus);
}

function vram(j) {
  if (j.peak_vram_bytes === null || j.peak_vram_bytes === undefined) return "–";
  return j.total_vram_bytes ? `${bytes(j.peak_vram_bytes)} / ${bytes(j.total_vram_bytes)}` : bytes(j.peak_vram_bytes);
}

function lossCell(j) {
  // An inf or NaN loss arrives as null, named in `nonfinite` (strict JSON has neither).
  const bad = j.nonfinite && j.nonfinite.last_loss;
  if (bad) return h("td", { class: "num nonfinite", title: "the loss is not a finite number", text: bad === "nan" ? "NaN" : bad });
  return h("td", { class: "num", text: num(j.last_loss) });
}

function waiting(j) {
  if (j.status !== "queued" || !j.waiting_for) return [];
  const priority = j.priority ? ` · priority ${j.priority}` : "";
  return [h("div", { class: "muted waiting", text: `#${j.queue_position}${priority} · ${j.waiting_for}` })];
}

function row(j) {
  const p = j.progress || {};
  const steps = p.total_steps ? `${p.current_steps ?? 0}/${p.total_steps}` : "";
  return h("tr", { "data-job": j.id, "data-status": j.status },
    h("td", { class: "num", text: j.id }),
    h("td", {}, h("a", { href: `/jobs/${j.id}`, text: j.name }), j.kind && j.kind !== "train" ? h("span", { class: "muted", text: ` · ${j.kind}` }) : null),
    h("td", { text: j.owner || "–" }),
    h("td", {}, verdictBadge(j), ...waiting(j)),
    h("td", { text: gpus(j) }),
    h("td", {}, progressBar(p), " ", h("span", { class: "muted num", text: steps })),
    h("td", { class: "num", text: j.status === "running" ? duration(p.eta_seconds) : "–" }),
    lossCell(j),
    h("td", { class: "num", text: vram(j) }),
    h("td", { class: "alerts" }, alertSummaryBadge(j)),
    h("td", { class: "muted", text: when(j.created_at) }));
}

let pending = false;
function render() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    const want = filter.value;
    const rows = [...jobs.values()].filter((j) => !want || j.status === want).sort((a, b) => b.id - a.id);
    $("#jobs tbody").replaceChildren(...rows.map(row));
    $("#empty").style.display = rows.length ? "none" : "";
    $("#count").textContent = `${rows.length} of ${jobs.size}`;
  });
}

filter.addEventListener("change", () => {
  const u = new URL(location.href);
  if (filter.value) u.searchParams.set("status", filter.value); else u.searchParams.delete("status");
  history.replaceState(null, "", u);
  render();
});

live({}, { jobs: (rows) => { for (const j of rows) jobs.set(j.id, j); render(); } }, indicator);
render();
