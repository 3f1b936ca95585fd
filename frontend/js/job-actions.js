// The job page's lifecycle actions: resume from a checkpoint, export the adapter, tags and notes, delete,
// and who may do which (identity.js asks the server's own rule). An action the caller may not take is
// shown disabled with the reason; a refusal stays in #refusals until dismissed (refusal.js).
import { del, get, patch, post } from "./api.js";
import { $, h, when } from "./fmt.js";
import { mayAct } from "./identity.js";
import { refuse } from "./refusal.js";

const ENDED = new Set(["succeeded", "failed", "cancelled"]);
const RESUMABLE_FROM = new Set(["failed", "cancelled"]);
const refusals = () => $("#refusals");

let job = null, me = null;
let files = { adapter: false };
let checkpoints = { status: null, list: [] }; // read again whenever the job's status changes
let onChange = () => {};

// `changed(job)` is told of a job the page should show now (after tags or notes are saved).
export function setupActions(changed) {
  onChange = changed;
  $("#resume").addEventListener("click", pickCheckpoint);
  $("#export-job").addEventListener("click", exportAdapter);
  $("#delete").addEventListener("click", confirmDelete);
  $("#edit-labels").addEventListener("click", editLabels);
  $("#edit-priority").addEventListener("click", changePriority);
}

export function actionsFor(j) { job = j; refresh(); }
export function actionsMe(m) { me = m; refresh(); }
// What the output folder holds (job.js reads the file list): an adapter to export or chat with.
export function actionsFiles(f) { files = f; refresh(); }

// The words for what the caller may not do, or null when they may.
function actReason() {
  if (mayAct(me, job.owner)) return null;
  if (!me.name) return job.owner ? `Sign in as ${job.owner} or an admin to change this job.` : "Sign in to change this job.";
  return `Only its owner (${job.owner || "nobody: made without a token"}) or an admin may change this job.`;
}

function submitReason() {
  return me.may_submit ? null : "Sign in as a submitter to start a job from this one.";
}

// One button: hidden where the action does not apply to this job, disabled with `why` where the caller
// may not take it.
function offer(el, applies, why) {
  el.hidden = !applies;
  el.disabled = Boolean(why) || el.dataset.busy === "1";
  el.title = why || el.dataset.what || "";
  if (why) el.dataset.why = why; else delete el.dataset.why;
}

function refresh() {
  if (!job || !me) return; // every action waits until the page knows who is asking
  const ended = ENDED.has(job.status);
  const act = actReason(), submit = submitReason();
  if (job.kind === "train" && RESUMABLE_FROM.has(job.status) && checkpoints.status !== job.status) loadCheckpoints();
  const resumable = checkpoints.status === job.status && checkpoints.list.some((c) => c.resumable);
  offer($("#resume"), job.kind === "train" && RESUMABLE_FROM.has(job.status) && resumable, submit);
  offer($("#export-job"), job.kind === "train" && ["succeeded", "cancelled"].includes(job.status) && files.adapter, submit);
  offer($("#delete"), true, act || (ended ? null : "Stop it first: only a job that has ended can be deleted."));
  offer($("#edit-labels"), true, act);
  offer($("#edit-priority"), job.status === "queued", act); // only a queued job's place in line moves
  const chat = $("#start-chat");
  if (chat) offer(chat, true, act);
  const why = [...new Set([act, submit].filter(Boolean))];
  $("#actions-why").replaceChildren(...why.map((w) => h("span", { class: "muted", text: w })));
  $("#actions-why").hidden = !why.length;
  if (!$("#labels-form")) showLabels();
}

async function loadCheckpoints() {
  const status = job.status;
  checkpoints = { status, list: [] };
  try {
    const list = await get(`/api/jobs/${job.id}/checkpoints`);
    if (checkpoints.status === status) { checkpoints = { status, list }; refresh(); }
  } catch (e) {
    refuse(refusals(), "Reading the checkpoints failed", e);
  }
}

// ------------------------------------------------------------------ tags and notes
function showLabels() {
  const tags = job.tags || [];
  $("#labels").replaceChildren(
    h("span", { class: "muted", text: "tags" }),
    h("span", { id: "tags" }, ...(tags.length ? tags.map((t) => h("span", { class: "badge tag", "data-tag": t, text: t })) : [h("span", { class: "muted", text: "none" })])),
    h("span", { class: "muted", text: "notes" }),
    h("span", { id: "notes", class: job.notes ? "notes" : "muted", text: job.notes || "none" }));
}

function editLabels() {
  const tags = h("input", { id: "tags-input", type: "text", value: (job.tags || []).join(", "), placeholder: "baseline, lr-sweep", "aria-label": "tags, separated by commas" });
  const notes = h("textarea", { id: "notes-input", rows: "3", "aria-label": "notes" });
  notes.value = job.notes || "";
  const error = h("div", { class: "field-error", id: "labels-error" });
  const form = h("form", { id: "labels-form", class: "labels-form" },
    h("label", { for: "tags-input", text: "tags (separated by commas)" }), tags,
    h("label", { for: "notes-input", text: "notes" }), notes, error,
    h("div", { class: "toolbar" }, h("button", { type: "submit", id: "labels-save", text: "Save" }),
      h("button", { type: "button", class: "secondary", id: "labels-cancel", text: "Cancel", onclick: () => { form.remove(); showLabels(); } })));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = { tags: tags.value.split(",").map((t) => t.trim()).filter(Boolean), notes: notes.value };
    error.textContent = "";
    try {
      const saved = await patch(`/api/jobs/${job.id}`, body);
      form.remove();
      onChange(saved);
    } catch (e) {
      // A tag the server refuses is said at the form (it stays open with what was typed) and kept on screen.
      const items = Array.isArray(e.detail) ? e.detail : null;
      error.textContent = items ? items.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`).join("; ") : "";
      refuse(refusals(), "Saving tags and notes failed", e);
    }
  });
  $("#labels").replaceChildren(form);
  tags.focus();
}

// ------------------------------------------------------------------ a queued job's priority
async function changePriority() {
  const input = h("input", { id: "priority-input", type: "number", step: "1", value: String(job.priority || 0), "aria-label": "priority, 0 to 10" });
  const yes = await ask({ id: "priority-dialog", title: `Priority of #${job.id} ${job.name}`, ok: "Save",
    body: [h("p", { class: "muted", text: "0 to 10: a higher one starts first, equal ones in the order submitted. It changes only while the job waits." }),
      h("label", { for: "priority-input", text: "priority" }), input] });
  if (!yes) return;
  await busy($("#edit-priority"), async () => {
    // What the server refuses (out of range, started meanwhile, not the caller's) stays on screen.
    try { onChange(await patch(`/api/jobs/${job.id}`, { priority: Number(input.value) })); }
    catch (e) { refuse(refusals(), "Changing the priority failed", e); }
  });
}

// ------------------------------------------------------------------ an in-page dialog (never window.confirm)
function ask({ id, title, body, ok, danger = false }) {
  return new Promise((resolve) => {
    const form = h("form", { method: "dialog" },
      h("h2", { text: title }), ...body,
      h("div", { class: "toolbar", style: "margin:10px 0 0" },
        h("button", { type: "submit", class: danger ? "danger" : null, id: `${id}-ok`, text: ok }),
        h("button", { type: "button", class: "secondary", id: `${id}-cancel`, text: "Cancel" })));
    const dialog = h("dialog", { id, class: "ask", "aria-label": title }, form);
    const done = (answer) => { dialog.close(); dialog.remove(); resolve(answer); };
    form.addEventListener("submit", (ev) => { ev.preventDefault(); done(true); });
    form.querySelector(`#${id}-cancel`).addEventListener("click", () => done(false));
    dialog.addEventListener("cancel", (ev) => { ev.preventDefault(); done(false); }); // Escape
    document.body.append(dialog);
    dialog.showModal();
  });
}

async function busy(button, fn) {
  button.dataset.busy = "1";
  button.disabled = true;
  try { await fn(); } finally { button.dataset.busy = ""; refresh(); }
}

// ------------------------------------------------------------------ resume, export, delete
async function pickCheckpoint() {
  const list = [...checkpoints.list].sort((a, b) => b.step - a.step);
  const newest = list.find((c) => c.resumable);
  const select = h("select", { id: "resume-checkpoint", "aria-label": "checkpoint" }, ...list.map((c) =>
    h("option", { value: c.name, disabled: !c.resumable, selected: c === newest,
      text: `${c.name} · step ${c.step} · ${when(c.mtime)}${c.resumable ? "" : " · not resumable (no optimizer or trainer state)"}` })));
  const yes = await ask({ id: "resume-dialog", title: `Resume #${job.id} ${job.name}`, ok: "Resume",
    body: [h("p", { class: "muted", text: "A new job of this one's spec continues from the checkpoint chosen; its steps go on from there." }),
      h("label", { for: "resume-checkpoint", text: "from checkpoint" }), select] });
  if (!yes) return;
  await busy($("#resume"), async () => {
    try {
      const child = await post(`/api/jobs/${job.id}/resume`, { checkpoint: select.value });
      location.href = `/jobs/${child.id}`;
    } catch (e) { refuse(refusals(), "Resume failed", e); }
  });
}

// A kind `export` job merging this one's adapter into its base model; the new job records its parent.
async function exportAdapter() {
  await busy($("#export-job"), async () => {
    try {
      const cfg = await get(`/api/jobs/${job.id}/config`);
      const { config } = await post("/api/ui/parse-yaml", cfg.train_yaml, { yaml: true });
      const carried = Object.fromEntries(["model_name_or_path", "template", "finetuning_type", "trust_remote_code"]
        .filter((k) => config[k] !== undefined && config[k] !== null).map((k) => [k, config[k]]));
      const made = await post("/api/jobs", { name: `export ${job.name}`.slice(0, 100), kind: "export", gpus: 0, parent_id: job.id,
        config: { ...carried, adapter_name_or_path: cfg.output_dir } });
      location.href = `/jobs/${made.id}`;
    } catch (e) { refuse(refusals(), "Export failed", e); }
  });
}

async function confirmDelete() {
  const files = h("input", { type: "checkbox", id: "delete-files" });
  const yes = await ask({ id: "delete-dialog", title: `Delete #${job.id} ${job.name}?`, ok: "Delete", danger: true,
    body: [h("p", { text: "The job, its metrics, logs and alerts leave tunedeck. This cannot be undone." }),
      h("label", {}, files, " also remove its run folder (adapter, checkpoints, logs) from disk")] });
  if (!yes) return;
  await busy($("#delete"), async () => {
    try {
      await del(`/api/jobs/${job.id}`, { files: files.checked ? "remove" : "keep" });
      location.href = "/";
    } catch (e) { refuse(refusals(), "Delete failed", e); }
  });
}
