// The new-job form: presets, YAML import, preview/export of the exact train.yaml, errors at fields.
import { ApiError, del, describe, get, optional, post } from "./api.js";
import { $, bytes, chatHolds, h, nav } from "./fmt.js";
import { GROUPS, KINDS } from "./form-fields.js";
import { mayAct, onMe } from "./identity.js";
import { addDatasetBox, folderOf, loadRegistered, modelOptions, registeredOptions } from "./assets-fields.js";

nav("/new");
const form = $("#form");

// ------------------------------------------------------------------ build the fields
function input(key, kind, hint) {
  let el;
  if (Array.isArray(kind)) {
    el = h("select", { id: `f-${key}`, name: key }, h("option", { value: "", text: "—" }), ...kind.map((c) => h("option", { value: c, text: c })));
  } else if (kind === "bool") {
    el = h("select", { id: `f-${key}`, name: key }, h("option", { value: "", text: "—" }), h("option", { value: "true", text: "true" }), h("option", { value: "false", text: "false" }));
  } else {
    el = h("input", { id: `f-${key}`, name: key, type: kind === "text" ? "text" : "number", step: kind === "int" ? "1" : "any", placeholder: hint || "" });
  }
  return h("div", { class: "field", "data-field": `config.${key}` }, h("label", { for: `f-${key}`, text: key }), el);
}

$("#g-job").append(
  h("div", { class: "field", "data-field": "name" }, h("label", { for: "f-name", text: "job name" }), h("input", { id: "f-name", name: "name", required: true, placeholder: "qwen2-lora-sft" })),
  h("div", { class: "field", "data-field": "gpus" }, h("label", { for: "f-gpus", text: "GPUs (0 = CPU)" }), h("input", { id: "f-gpus", name: "gpus", type: "number", min: "0", step: "1" })),
  h("div", { class: "field", "data-field": "nodes" }, h("label", { for: "f-nodes", text: "Nodes (GPUs on each; Ray or Slurm)" }), h("input", { id: "f-nodes", name: "nodes", type: "number", min: "1", step: "1", value: "1" })),
  h("div", { class: "field", "data-field": "kind" }, h("label", { for: "f-kind", text: "kind" }),
    h("select", { id: "f-kind", name: "kind" }, ...["train", "eval", "predict", "export", "chat"].map((k) => h("option", { value: k, text: k })))),
  // The queue's own fields (the REST API's priority, devices and env): blank is the server's default.
  h("div", { class: "field", "data-field": "priority" }, h("label", { for: "f-priority", text: "priority (0–10, higher starts first)" }), h("input", { id: "f-priority", name: "priority", type: "number", min: "0", max: "10", step: "1", placeholder: "0" })),
  h("div", { class: "field", "data-field": "devices" }, h("label", { for: "f-devices", text: "pinned GPUs (ids, e.g. 0,1)" }), h("input", { id: "f-devices", name: "devices", type: "text", placeholder: "any free ones" })),
  h("div", { class: "field", "data-field": "env" }, h("label", { for: "f-env", text: "environment (NAME=value a line)" }), h("textarea", { id: "f-env", name: "env", rows: "2", placeholder: "NCCL_DEBUG=INFO" })),
  // Lineage: a job made from another ("Edit as new…") records it as its parent, unless told to forget it.
  h("div", { class: "field", "data-field": "parent_id", id: "parent-field", hidden: true }, h("label", { for: "f-parent", text: "made from (its parent)" }),
    h("span", { class: "toolbar" }, h("a", { id: "f-parent-link" }), h("input", { id: "f-parent", name: "parent_id", type: "hidden" }),
      h("button", { type: "button", class: "secondary", id: "forget-parent", text: "Forget", onclick: () => setParent(null) }))),
);

function setParent(job) {
  $("#f-parent").value = job ? String(job.id) : "";
  $("#parent-field").hidden = !job;
  if (job) { $("#f-parent-link").href = `/jobs/${job.id}`; $("#f-parent-link").textContent = `#${job.id} ${job.name}`; }
}
for (const [title, fields] of GROUPS) {
  $("#groups").append(h("fieldset", {}, h("legend", { text: title }), h("div", { class: "fields" }, ...fields.map(([k, kind, hint]) => input(k, kind, hint)))));
}

// A chat job keeps its slot until stopped or idle: said at the kind, with the server's numbers.
async function kindNote() {
  const field = document.querySelector('[data-field="kind"]');
  let note = field.querySelector("#chat-holds");
  if ($("#f-kind").value !== "chat") { if (note) note.remove(); return; }
  const health = await optional("/api/health").catch(() => null);
  if (!health || $("#f-kind").value !== "chat") return;
  if (!note) { note = h("div", { class: "hint", id: "chat-holds" }); field.append(note); }
  const gpus = $("#f-gpus").value.trim();
  note.textContent = chatHolds(health, gpus === "" ? (health.gpus > 0 ? 1 : 0) : Number(gpus));
}
$("#f-kind").addEventListener("change", kindNote);
$("#f-gpus").addEventListener("change", kindNote);

// ------------------------------------------------------------------ config <-> fields
function yamlScalar(v) { return typeof v === "string" && /^[\w./,+-]+$/.test(v) && !/^(true|false|null|yes|no|~|[\d.eE+-]+)$/i.test(v) ? v : JSON.stringify(v); }

function fill(config, deepspeed) {
  form.reset();
  const extra = [];
  for (const [key, value] of Object.entries(config || {})) {
    const el = document.getElementById(`f-${key}`);
    if (el && KINDS[key] && (value === null || typeof value !== "object")) el.value = value === null ? "" : String(value);
    else extra.push(`${key}: ${yamlScalar(value)}`);
  }
  $("#extra").value = extra.join("\n");
  setDeepspeed(deepspeed);
  refreshDatasets();
}

function setDeepspeed(ds) {
  const mode = $("#ds-mode");
  for (const o of [...mode.options]) if (o.dataset.path) o.remove();
  if (ds === null || ds === undefined || ds === "") { mode.value = ""; }
  else if (typeof ds === "object") { mode.value = "json"; $("#ds-json").value = JSON.stringify(ds, null, 2); }
  else if ([...mode.options].some((o) => o.value === `preset:${ds}`)) { mode.value = `preset:${ds}`; }
  else { mode.append(h("option", { value: `path:${ds}`, "data-path": "1", text: `file: ${ds}` })); mode.value = `path:${ds}`; }
  $("#ds-json").hidden = mode.value !== "json";
}
$("#ds-mode").addEventListener("change", () => { $("#ds-json").hidden = $("#ds-mode").value !== "json"; });

async function collect() {
  clearErrors();
  const config = {};
  if ($("#extra").value.trim()) {
    try {
      Object.assign(config, (await post("/api/ui/parse-yaml", $("#extra").value, { yaml: true })).config);
    } catch (e) { throw new FieldErrors([{ loc: ["extra"], msg: describe(e) }]); }
  }
  for (const [key, kind] of Object.entries(KINDS)) {
    const raw = document.getElementById(`f-${key}`).value.trim();
    if (raw === "") continue;
    if (kind === "int") config[key] = Number.isInteger(Number(raw)) ? Number(raw) : raw;
    else if (kind === "float") config[key] = Number.isFinite(Number(raw)) ? Number(raw) : raw;
    else if (kind === "bool") config[key] = raw === "true";
    else config[key] = raw;
  }
  const mode = $("#ds-mode").value;
  let deepspeed = null;
  if (mode === "json") {
    try { deepspeed = JSON.parse($("#ds-json").value || "{}"); } catch (e) { throw new FieldErrors([{ loc: ["deepspeed"], msg: `not valid JSON: ${e.message}` }]); }
  } else if (mode.startsWith("preset:")) deepspeed = mode.slice(7);
  else if (mode.startsWith("path:")) deepspeed = mode.slice(5);
  const gpus = $("#f-gpus").value.trim();
  const nodes = $("#f-nodes").value.trim();
  const parent = $("#f-parent").value;
  return { name: $("#f-name").value.trim(), kind: $("#f-kind").value, config, deepspeed, gpus: gpus === "" ? null : Number(gpus), nodes: nodes === "" ? 1 : Number(nodes),
    ...(parent ? { parent_id: Number(parent) } : {}), ...queueFields() };
}

// Priority, pinned GPUs and environment, as the spec takes them; only what is filled in. A value the
// form cannot read is an error at its field; what it reads, the server judges (ranges, the allow-list).
function queueFields() {
  const out = {};
  const errors = [];
  const priority = $("#f-priority").value.trim();
  if (priority !== "") out.priority = Number.isInteger(Number(priority)) ? Number(priority) : priority;
  const devices = $("#f-devices").value.trim();
  if (devices !== "") {
    const ids = devices.split(/[\s,]+/).filter(Boolean);
    if (ids.every((d) => /^\d+$/.test(d))) out.devices = ids.map(Number);
    else errors.push({ loc: ["devices"], msg: `GPU ids are whole numbers separated by commas, not ${JSON.stringify(devices)}` });
  }
  const env = {};
  for (const [i, line] of $("#f-env").value.split("\n").entries()) {
    if (!line.trim()) continue;
    const at = line.indexOf("=");
    if (at <= 0) errors.push({ loc: ["env"], msg: `line ${i + 1}: NAME=value, not ${JSON.stringify(line.trim())}` });
    else env[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  if (errors.length) throw new FieldErrors(errors);
  if (Object.keys(env).length) out.env = env;
  return out;
}

function fillQueueFields(job, env) {
  $("#f-kind").value = job.kind || "train";
  $("#f-gpus").value = job.pinned ? "" : String(job.gpus ?? ""); // pinned GPUs set the count themselves
  $("#f-nodes").value = String(job.nodes || 1);
  $("#f-priority").value = job.priority ? String(job.priority) : "";
  $("#f-devices").value = (job.pinned || []).join(",");
  $("#f-env").value = Object.entries(env || {}).map(([k, v]) => `${k}=${v}`).join("\n");
}

// ------------------------------------------------------------------ errors at their fields
class FieldErrors extends Error { constructor(errors) { super("invalid"); this.errors = errors; } }

function clearErrors() {
  for (const el of document.querySelectorAll(".field.has-error")) el.classList.remove("has-error");
  for (const el of document.querySelectorAll(".field-error:not(#ds-error)")) el.remove();
  $("#ds-error").textContent = "";
  $("#banner").replaceChildren();
}

function fieldFor(loc) {
  const path = loc[0] === "body" ? loc.slice(1) : loc;
  if (path[0] === "config" && path[1]) {
    return document.querySelector(`[data-field="config.${CSS.escape(String(path[1]))}"]`) || document.querySelector('[data-field="extra"]');
  }
  if (path[0] === "deepspeed") return document.querySelector('[data-field="deepspeed"]');
  if (["gpus", "nodes", "name", "kind", "extra", "priority", "devices", "env", "parent_id"].includes(path[0])) return document.querySelector(`[data-field="${path[0]}"]`);
  return null;
}

function showErrors(errors) {
  const loose = [];
  for (const err of errors) {
    const loc = err.loc || [];
    const field = fieldFor(loc);
    const path = (loc[0] === "body" ? loc.slice(1) : loc).join(".");
    if (!field) { loose.push(`${path}: ${err.msg}`); continue; }
    field.classList.add("has-error");
    const key = loc[loc.length - 1];
    const msg = field.dataset.field === "extra" || field.dataset.field === "deepspeed" ? `${path}: ${err.msg}` : err.msg;
    if (field.dataset.field === "deepspeed") $("#ds-error").textContent += `${msg} `;
    else field.append(h("div", { class: "field-error", "data-loc": path, "data-key": key, text: msg }));
  }
  const n = errors.length;
  $("#banner").replaceChildren(h("div", { class: "error", text: `${n} problem${n === 1 ? "" : "s"} to fix before this can run.${loose.length ? " " + loose.join("; ") : ""}` }));
  const first = document.querySelector(".field.has-error");
  if (first) first.scrollIntoView({ block: "center" });
}

async function guarded(fn) {
  try { return await fn(); } catch (e) {
    if (e instanceof FieldErrors) showErrors(e.errors);
    else if (e instanceof ApiError && e.status === 422 && Array.isArray(e.detail)) showErrors(e.detail);
    else $("#banner").replaceChildren(h("div", { class: "error", text: describe(e) }));
    return null;
  }
}

// ------------------------------------------------------------------ actions
form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  guarded(async () => {
    $("#submit").disabled = true;
    try {
      const job = await post("/api/jobs", await collect());
      location.href = `/jobs/${job.id}`;
    } catch (e) {
      clearResults(); // what they showed was for a spec that has just been refused
      throw e;
    } finally { $("#submit").disabled = false; }
  });
});

const EMPTY = { preview: $("#preview-out").textContent, checks: $("#checks").textContent };
function clearResults() {
  $("#preview-out").classList.add("muted");
  $("#preview-out").textContent = EMPTY.preview;
  $("#checks").classList.add("muted");
  $("#checks").textContent = EMPTY.checks;
}

async function preview() {
  const spec = await collect();
  const out = await post("/api/ui/preview", { ...spec, name: spec.name || "preview" });
  $("#preview-out").classList.remove("muted");
  $("#preview-out").textContent = out.train_yaml + (out.ds_config ? `\n# ds_config.json\n${out.ds_config}` : "") +
    (out.warnings.length ? `\n# warnings:\n${out.warnings.map((w) => `#  ${w}`).join("\n")}` : "");
  return out;
}
$("#preview").addEventListener("click", () => guarded(preview));
$("#export").addEventListener("click", () => guarded(async () => {
  const out = await preview();
  const a = h("a", { href: URL.createObjectURL(new Blob([out.train_yaml], { type: "application/yaml" })), download: `${$("#f-name").value.trim() || "train"}.yaml` });
  document.body.append(a);
  a.click();
  a.remove();
}));

$("#check").addEventListener("click", () => guarded(async () => {
  const spec = await collect();
  const body = { ...spec, name: spec.name || "check" };
  const box = $("#checks");
  clearErrors();
  box.classList.remove("muted");
  box.replaceChildren(h("span", { class: "muted", text: "checking…" }));
  const [lint, est] = await Promise.all([post("/api/lint", body).catch((e) => e), post("/api/estimate", body).catch((e) => e)]);
  const parts = [];
  if (lint instanceof ApiError && lint.status === 404) parts.push(h("div", { class: "notice", text: "Lint is not available on this server yet." }));
  else if (lint instanceof Error) parts.push(h("div", { class: "error", text: `lint: ${describe(lint)}` }));
  else if (!lint.findings.length) parts.push(h("div", { text: "Lint: no findings." }));
  else parts.push(...lint.findings.map((f) => h("div", { class: "alert-item" }, h("span", { class: `badge sev-${f.severity}`, text: f.severity }), " ",
    h("b", { text: f.code }), ` ${f.path || ""}: ${f.message}`, f.fix ? h("div", { class: "sugg", text: `→ ${f.fix}` }) : null)));
  if (est instanceof ApiError && est.status === 404) parts.push(h("div", { class: "notice", text: "The memory estimate is not available on this server yet." }));
  else if (est instanceof Error) parts.push(h("div", { class: "error", text: `estimate: ${describe(est)}` }));
  else parts.push(h("div", { style: "margin-top:8px" }, h("b", { text: "Estimate: " }), `${bytes(est.per_gpu_bytes)} per GPU`,
    est.nodes > 1 ? ` (${est.nodes} nodes × ${est.gpus || "CPU"}: ZeRO shards over ${est.ranks} ranks)` : "",
    est.device_total_bytes ? ` of ${bytes(est.device_total_bytes)} — ${est.fits ? "fits" : "does NOT fit"}` : "",
    ...(est.warnings || []).map((w) => h("div", { class: "notice", text: w }))));
  box.replaceChildren(...parts);
  // The errors also at their fields, as a refused Submit shows them (the list above keeps every finding).
  const errors = lint instanceof Error ? [] : lint.findings.filter((f) => f.severity === "error" && f.path);
  if (errors.length) showErrors(errors.map((f) => ({ loc: f.path.split("."), msg: `${f.code}: ${f.message}${f.fix ? ` (fix: ${f.fix})` : ""}` })));
  else if (lint instanceof ApiError && lint.status === 422 && Array.isArray(lint.detail)) showErrors(lint.detail);
}));

// ------------------------------------------------------------------ help, choices, dataset preview
let HELP = {};
const fieldOf = (key) => document.querySelector(`[data-field="config.${key}"]`);

function hint(key, text, cls = "hint") {
  const field = fieldOf(key);
  let el = field.querySelector(".hint");
  if (!el) { el = h("div", { class: cls, "data-hint": key }); field.append(el); }
  el.textContent = text || "";
}

async function loadHelp() {
  const out = await optional("/api/ui/help").catch(() => null);
  HELP = (out && out.keys) || {};
  for (const key of Object.keys(KINDS)) {
    const info = HELP[key];
    if (!info || !info.help) continue;
    fieldOf(key).querySelector("label").title = info.help;
    fieldOf(key).append(h("div", { class: "help", "data-help": key, text: info.help }));
  }
}

// The key on the caret's line of "Other keys", with LLaMA-Factory's help for it.
function extraHelp() {
  const box = $("#extra");
  const line = box.value.slice(0, box.selectionStart).split("\n").pop() + box.value.slice(box.selectionStart).split("\n")[0];
  const key = (/^\s*([A-Za-z_][\w.-]*)\s*:?/.exec(line) || [])[1];
  const info = key && HELP[key];
  $("#extra-help").textContent = !key ? "" : info ? `${key} (${info.type}${info.default !== null ? `, default ${info.default}` : ""}): ${info.help}`
    : `${key}: not a key this LLaMA-Factory knows`;
}
for (const ev of ["input", "click", "keyup"]) $("#extra").addEventListener(ev, extraHelp);

function datalist(id, values) {
  let list = document.getElementById(id);
  if (!list) { list = h("datalist", { id }); document.body.append(list); }
  list.replaceChildren(...values.map((v) => (typeof v === "string" ? h("option", { value: v }) : v)));
}

async function loadTemplates() {
  const out = await optional("/api/ui/templates").catch(() => null);
  datalist("templates-list", (out && out.templates) || []);
  $("#f-template").setAttribute("list", "templates-list");
}

let knownDatasets = null; // the dataset_dir's names, once read
async function refreshDatasets() {
  const dir = $("#f-dataset_dir").value.trim();
  $("#f-dataset").setAttribute("list", "datasets-list");
  knownDatasets = null;
  // No dataset_dir: every dataset the server has registered is offered (choosing one sets its folder).
  if (!dir) { await loadRegistered(); datalist("datasets-list", registeredOptions()); hint("dataset_dir", ""); return; }
  try {
    const out = await get("/api/ui/datasets", { dataset_dir: dir });
    knownDatasets = out.datasets;
    datalist("datasets-list", out.datasets);
    hint("dataset_dir", `${out.datasets.length} datasets in ${out.dataset_dir}/dataset_info.json`);
  } catch (e) {
    datalist("datasets-list", []);
    hint("dataset_dir", describe(e));
  }
}

async function previewDataset() {
  const name = $("#f-dataset").value.split(",")[0].trim();
  const box = $("#dataset-preview");
  if (!name) { box.replaceChildren(); return; }
  if (knownDatasets && !knownDatasets.includes(name)) {
    box.replaceChildren(h("div", { class: "hint", text: `No preview: ${name} is not in dataset_info.json (it has ${knownDatasets.join(", ") || "none"})` }));
    return;
  }
  try {
    const out = await get("/api/ui/dataset-preview", { dataset_dir: $("#f-dataset_dir").value.trim(), name, rows: 3 });
    box.replaceChildren(h("div", { class: "hint", text: `First ${out.rows.length} rows of ${out.name} (${out.formatting}, ${out.file})` }),
      h("pre", { class: "rows", text: out.rows.map((r) => JSON.stringify(r, null, 1)).join("\n") }));
  } catch (e) {
    box.replaceChildren(h("div", { class: "hint", text: `No preview: ${describe(e)}` }));
    return;
  }
  const model = $("#f-model_name_or_path").value.trim();
  if (model) box.append(renderedBox(name, model));
}

// What the model will see: the rows with the chosen template, by the model's tokenizer (a few seconds).
function renderedBox(name, model) {
  const said = h("div", { class: "hint", id: "rendered-said" });
  const show = h("button", { type: "button", id: "render-rows", text: "Show with the chat template" });
  // Not a <pre>: the preview's own rows are the box's one <pre>.
  const out = h("div", { class: "rows rendered", id: "rendered-rows", hidden: true });
  show.addEventListener("click", async () => {
    said.textContent = "Rendering with the model's tokenizer…";
    const cutoff = $("#f-cutoff_len").value.trim();
    try {
      const got = await get(`/api/datasets/${encodeURIComponent(name)}/preview`, {
        model, template: $("#f-template").value.trim(), cutoff_len: cutoff, rows: 3, dataset_dir: $("#f-dataset_dir").value.trim(),
      });
      out.textContent = got.rows.map((r) => (r.error ? `row ${r.row}: ${r.error}`
        : `── row ${r.row}: ${r.tokens} tokens${r.over_cutoff ? ` (over cutoff_len ${got.cutoff_len}: cut)` : ""}\n${r.text}`)).join("\n");
      out.hidden = false;
      said.textContent = `Template ${got.template}, cutoff_len ${got.cutoff_len}`;
    } catch (e) {
      said.textContent = `Not rendered: ${describe(e)}`;
    }
  });
  return h("div", {}, show, said, out);
}

// A model folder says which template it needs (config.json model_type): fill it when none is set.
async function modelTemplate() {
  const model = $("#f-model_name_or_path").value.trim();
  if (!model) { hint("model_name_or_path", ""); return; }
  try {
    const out = await get("/api/ui/model-templates", { model });
    const want = out.templates[0];
    if (want && !$("#f-template").value.trim()) $("#f-template").value = want;
    const chosen = $("#f-template").value.trim();
    hint("model_name_or_path", !want ? `model_type ${out.model_type || "?"}: no known template; choose one`
      : out.templates.includes(chosen) ? `model_type ${out.model_type} → template ${chosen}`
        : `model_type ${out.model_type} needs template ${out.templates.join(" or ")}, not ${chosen}`);
  } catch (e) {
    hint("model_name_or_path", describe(e));
  }
}

$("#f-dataset_dir").addEventListener("change", async () => { await refreshDatasets(); previewDataset(); });
$("#f-dataset").addEventListener("change", async () => {
  const name = $("#f-dataset").value.split(",")[0].trim();
  const dir = !$("#f-dataset_dir").value.trim() && folderOf(name);
  if (dir) { $("#f-dataset_dir").value = dir; await refreshDatasets(); }
  previewDataset();
});
$("#f-model_name_or_path").addEventListener("change", modelTemplate);
fieldOf("dataset").closest("fieldset").append(h("div", { id: "dataset-preview" }));
fieldOf("dataset").append(addDatasetBox(async (out) => {
  $("#f-dataset_dir").value = out.dataset_dir;
  await refreshDatasets();
  $("#f-dataset").value = out.name;
  previewDataset();
}));

async function loadModels() {
  datalist("models-list", await modelOptions());
  $("#f-model_name_or_path").setAttribute("list", "models-list");
}
$("[data-field=extra]").append(h("div", { class: "help", id: "extra-help" }));

// ------------------------------------------------------------------ presets and import
async function importYaml(text, name) {
  await guarded(async () => {
    const parsed = await post("/api/ui/parse-yaml", text, { yaml: true });
    fill(parsed.config, parsed.deepspeed);
    if (name && !$("#f-name").value) $("#f-name").value = name;
    $("#banner").replaceChildren(h("div", { class: "notice", text: `Imported ${Object.keys(parsed.config).length} keys.` }));
  });
}

$("#import-file").addEventListener("change", async (ev) => {
  const file = ev.target.files[0];
  if (file) await importYaml(await file.text(), file.name.replace(/\.ya?ml$/, "").replace(/[^A-Za-z0-9._+-]+/g, "-"));
  ev.target.value = "";
});
$("#toggle-paste").addEventListener("click", () => { $("#paste-box").hidden = !$("#paste-box").hidden; });
$("#import-paste").addEventListener("click", () => importYaml($("#paste").value));

// Any job as a starting point: the train.yaml it ran with, less what tunedeck sets for each job.
async function loadJob(id) {
  await guarded(async () => {
    const [job, cfg] = await Promise.all([get(`/api/jobs/${id}`), get(`/api/jobs/${id}/config`)]);
    const parsed = await post("/api/ui/parse-yaml", cfg.train_yaml, { yaml: true });
    delete parsed.config.output_dir;
    delete parsed.config.deepspeed;
    fill(parsed.config, cfg.ds_config ? JSON.parse(cfg.ds_config) : null);
    $("#f-name").value = job.name;
    fillQueueFields(job, cfg.env);
    setParent(job);
    $("#banner").replaceChildren(h("div", { class: "notice", text: `Starting from job ${job.id} (${job.name}): the new job records it as its parent.` }));
  });
}

$("#load-preset").addEventListener("click", async () => {
  const name = $("#preset").value;
  if (!name) return;
  const p = await get(`/api/presets/${encodeURIComponent(name)}`);
  await importYaml(p.text, name.replace(/_/g, "-"));
});

// The picker: shipped job presets, then the team's with owner and description (DeepSpeed ones go to
// the DeepSpeed menu). Called again after a save, keeping the choice.
function presetLabel(p) {
  if (p.source !== "team") return p.name;
  return `${p.name} — ${p.owner || "no owner"}${p.description ? `: ${p.description}` : ""}`;
}

async function listPresets() {
  const presets = (await optional("/api/presets")) || [];
  const picker = $("#preset");
  const chosen = picker.value;
  const groups = { shipped: h("optgroup", { label: "shipped (read-only)" }), team: h("optgroup", { label: "team" }) };
  for (const p of presets) {
    if (p.kind === "yaml" || p.kind === "yml") {
      groups[p.source === "team" ? "team" : "shipped"].append(h("option", { value: p.name, text: presetLabel(p), title: p.description || "", "data-source": p.source || "shipped", "data-owner": p.owner || "" }));
    } else if (p.kind === "json" && !$("#ds-mode").querySelector(`option[value="preset:${CSS.escape(p.name)}"]`)) {
      $("#ds-mode").insertBefore(h("option", { value: `preset:${p.name}`, text: `preset: ${p.name}` }), $("#ds-mode").lastElementChild);
    }
  }
  picker.replaceChildren(h("option", { value: "", text: "—" }), ...Object.values(groups).filter((g) => g.children.length));
  picker.value = chosen;
  offerDelete();
}

// ------------------------------------------------------------------ delete a team preset
// The chosen team preset's owner or an admin may delete it (the server's rule, as for a job); the
// shipped ones are read-only, so no button for them.
let me = null;
onMe((m) => { me = m; offerDelete(); });

function offerDelete() {
  const chosen = $("#preset").selectedOptions[0];
  const team = Boolean(chosen) && chosen.dataset.source === "team";
  const owner = team ? chosen.dataset.owner || null : null;
  const why = team && !mayAct(me, owner) ? `Only its owner (${owner || "nobody: saved without a token"}) or an admin may delete it.` : "";
  const button = $("#delete-preset");
  button.hidden = !team;
  button.disabled = Boolean(why);
  button.title = why || "remove this team preset (jobs made from it keep their own copy)";
}
$("#preset").addEventListener("change", offerDelete);

$("#delete-preset").addEventListener("click", () => {
  $("#delete-preset-what").textContent = `Delete the team preset ${$("#preset").value}? Jobs made from it keep their own copy.`;
  $("#delete-preset-dialog").showModal();
});
$("#delete-preset-cancel").addEventListener("click", () => $("#delete-preset-dialog").close());
$("#delete-preset-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("#delete-preset-dialog").close();
  const name = $("#preset").value;
  try {
    await del(`/api/presets/${encodeURIComponent(name)}`);
    $("#preset").value = "";
    await listPresets();
    $("#banner").replaceChildren(h("div", { class: "notice", id: "preset-deleted", text: `Deleted team preset ${name}.` }));
  } catch (e) {
    $("#banner").replaceChildren(h("div", { class: "error", id: "preset-delete-failed", text: `Deleting preset ${name} failed: ${describe(e)}` }));
  }
  offerDelete();
});

// ------------------------------------------------------------------ save as a team preset
// The form's keys as YAML: a key a line; strings that read as something else, lists and objects in
// JSON's flow syntax, which YAML reads as the same values.
function yamlText(spec) {
  const lines = Object.entries(spec.config).map(([k, v]) => `${k}: ${yamlScalar(v)}`);
  if (spec.deepspeed !== null && spec.deepspeed !== undefined) lines.push(`deepspeed: ${yamlScalar(spec.deepspeed)}`);
  return lines.join("\n") + "\n";
}

const presetDialog = $("#preset-dialog");

function clearPresetErrors() {
  for (const el of presetDialog.querySelectorAll(".field.has-error")) el.classList.remove("has-error");
  for (const el of presetDialog.querySelectorAll(".field-error")) el.remove();
  $("#preset-banner").replaceChildren();
}

// The dialog's own fields get their errors there; the YAML's go to the form's fields behind it, and
// are listed in the dialog too, so the modal never hides why nothing was saved.
function showPresetErrors(errors) {
  const form = [];
  for (const err of errors) {
    const loc = err.loc || [];
    const path = loc[0] === "body" ? loc.slice(1) : loc;
    const field = ["name", "description"].includes(path[0]) && loc[0] === "body" ? presetDialog.querySelector(`[data-preset-field="${path[0]}"]`) : null;
    if (field) {
      field.classList.add("has-error");
      field.append(h("div", { class: "field-error", "data-loc": path.join("."), text: err.msg }));
    } else form.push(err);
  }
  if (!form.length) return;
  showErrors(form);
  $("#preset-banner").replaceChildren(h("div", { class: "error" },
    h("div", { text: `The form's YAML is refused as a submit would be (${form.length} problem${form.length === 1 ? "" : "s"}, marked at the fields):` }),
    ...form.map((e) => h("div", { class: "preset-problem", "data-loc": (e.loc || []).join("."), text: `${(e.loc || []).filter((x) => x !== "body").join(".")}: ${e.msg}` }))));
}

$("#save-preset").addEventListener("click", () => {
  clearPresetErrors();
  if (!$("#preset-name").value && $("#f-name").value) $("#preset-name").value = $("#f-name").value.trim();
  presetDialog.showModal();
  $("#preset-name").focus();
});
$("#preset-cancel").addEventListener("click", () => presetDialog.close());

$("#preset-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  clearPresetErrors();
  const button = $("#preset-save");
  button.disabled = true;
  try {
    let spec;
    try { spec = await collect(); } catch (e) {
      if (e instanceof FieldErrors) { showPresetErrors(e.errors); return; }
      throw e;
    }
    const name = $("#preset-name").value.trim();
    const saved = await post("/api/presets", { name, description: $("#preset-description").value.trim(), text: yamlText(spec) });
    presetDialog.close();
    await listPresets();
    $("#preset").value = saved.name;
    offerDelete();
    $("#banner").replaceChildren(h("div", { class: "notice", id: "preset-saved", text: `Saved team preset ${saved.name}${saved.owner ? ` (owner ${saved.owner})` : ""}.` }));
  } catch (e) {
    if (e instanceof ApiError && e.status === 422 && Array.isArray(e.detail)) showPresetErrors(e.detail);
    else if (e instanceof ApiError && e.status === 409) showPresetErrors([{ loc: ["body", "name"], msg: typeof e.detail === "string" ? e.detail : describe(e) }]);
    else $("#preset-banner").replaceChildren(h("div", { class: "error", text: describe(e) }));
  } finally { button.disabled = false; }
});

async function loadPresets() {
  await Promise.all([loadHelp(), loadTemplates(), loadModels(), refreshDatasets()]);
  await listPresets();
  const params = new URLSearchParams(location.search);
  const want = params.get("preset");
  if (want) { $("#preset").value = want; offerDelete(); $("#load-preset").click(); }
  if (/^\d+$/.test(params.get("from") || "")) await loadJob(params.get("from"));
  window.tunedeckReady = true;
}
loadPresets();
