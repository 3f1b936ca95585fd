// The team page: the jobs its filters find (team-list.js), live from the team stream (which sends every
// job's current row first, then each change).
import { live } from "./api.js";
import { $, alertSummaryBadge, bytes, duration, h, nav, nonfiniteText, num, phaseText, progressBar, verdictBadge, when } from "./fmt.js";
import { onMe } from "./identity.js";
import { actions } from "./team-actions.js";
import { choices, Listing } from "./team-list.js";

const indicator = nav("/");
const jobs = new Map();
const filter = $("#filter");
filter.value = new URLSearchParams(location.search).get("status") || "";
const mine = $("#mine");
mine.checked = new URLSearchParams(location.search).get("mine") === "1";
let me = null; // who is asking (GET /api/me): which rows offer Stop, and whose "my jobs" are

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
  if (bad) return h("td", { class: "num nonfinite", title: "the loss is not a finite number", text: nonfiniteText(bad) });
  return h("td", { class: "num", text: num(j.last_loss) });
}

function waiting(j) {
  if (j.status !== "queued" || !j.waiting_for) return [];
  const priority = j.priority ? ` · priority ${j.priority}` : "";
  return [h("div", { class: "muted waiting", text: `#${j.queue_position}${priority} · ${j.waiting_for}` })];
}

// What a running job is doing and for how long, beside its status: "running · building a DeepSpeed op (5m 2s)".
function phase(j) {
  if (j.status !== "running" || !j.phase) return [];
  return [h("span", { class: "muted phase", "data-phase": j.phase, text: ` · ${phaseText(j)}` })];
}

function row(j) {
  const p = j.progress || {};
  const steps = p.total_steps ? `${p.current_steps ?? 0}/${p.total_steps}` : "";
  return h("tr", { "data-job": j.id, "data-status": j.status },
    h("td", { class: "num", text: j.id }),
    h("td", {}, h("a", { href: `/jobs/${j.id}`, text: j.name }), j.kind && j.kind !== "train" ? h("span", { class: "muted", text: ` · ${j.kind}` }) : null),
    h("td", { text: j.owner || "–", title: j.owner ? null : "made without a token: whoever may write here may act on it" }),
    h("td", {}, verdictBadge(j), ...phase(j), ...waiting(j)),
    h("td", { text: gpus(j) }),
    h("td", {}, progressBar(p), " ", h("span", { class: "muted num", text: steps })),
    h("td", { class: "num", text: j.status === "running" ? duration(p.eta_seconds) : "–" }),
    lossCell(j),
    h("td", { class: "num", text: vram(j) }),
    h("td", { class: "alerts" }, alertSummaryBadge(j)),
    h("td", { class: "muted", text: when(j.created_at) }),
    h("td", { class: "actions" }, ...actions(j, me, $("#refusals"))));
}

let pending = false;
function render() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    const rows = listing.rows(jobs);
    $("#jobs tbody").replaceChildren(...rows.map(row));
    const none = listing.ids !== null && !rows.length;
    const filtered = none && (location.search.length > 1 || jobs.size > 0);
    $("#empty").style.display = none && !filtered ? "" : "none";
    $("#unmatched").hidden = !filtered;
    // Of every job the page knows: streamed or listed (a listing may come before the stream's first rows).
    const known = new Set([...jobs.keys(), ...listing.fetched.keys()]).size;
    $("#count").textContent = `${rows.length} of ${known}`;
    listing.pager(rows.length);
  });
}

filter.addEventListener("change", () => {
  const u = new URL(location.href);
  if (filter.value) u.searchParams.set("status", filter.value); else u.searchParams.delete("status");
  history.replaceState(null, "", u);
  listing.refilter();
});

mine.addEventListener("change", () => {
  const u = new URL(location.href);
  if (mine.checked) u.searchParams.set("mine", "1"); else u.searchParams.delete("mine");
  history.replaceState(null, "", u);
  listing.refilter();
});

// "My jobs" only for a caller with a name: in open mode jobs have no owner to filter by.
onMe((m) => {
  me = m;
  listing.me = m;
  $("#mine-label").hidden = !m.name;
  if (mine.checked) listing.load(); // my jobs are the server's to find, by my name
  render();
});

const listing = new Listing(render);
listing.load();
// A phase's duration moves on between the stream's updates: a running job's row is drawn again.
setInterval(() => { if ([...jobs.values()].some((j) => j.status === "running" && j.phase)) render(); }, 10000);
live({}, { jobs: (rows) => {
  for (const j of rows) jobs.set(j.id, j);
  listing.streamed(rows);
  choices(jobs);
  render();
} }, indicator);
render();
