// The form's dataset and model choices: the datasets the server has registered (with "add a
// dataset…" right there: an upload whose format the server detects) and the local models it can train.
import { describe, get, postForm } from "./api.js";
import { h } from "./fmt.js";

let registered = [];

function size(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

// Every dataset of every dataset_info.json the server sees: [{name, dataset_dir, formatting, rows, ...}].
export async function loadRegistered() {
  const out = await get("/api/datasets").catch(() => null);
  registered = (out && out.datasets) || [];
  return registered;
}

export function registeredOptions() {
  return registered.map((d) => h("option", {
    value: d.name,
    label: `${d.formatting}${d.rows !== null ? `, ${d.rows} rows` : ""}${d.size_bytes ? `, ${size(d.size_bytes)}` : ""} — ${d.dataset_dir}`,
  }));
}

// The folder that defines `name`, when exactly one does.
export function folderOf(name) {
  const dirs = [...new Set(registered.filter((d) => d.name === name).map((d) => d.dataset_dir))];
  return dirs.length === 1 ? dirs[0] : null;
}

export async function modelOptions() {
  const out = await get("/api/models").catch(() => null);
  return ((out && out.models) || []).map((m) => {
    const params = m.parameters ? `${(m.parameters / 1e6).toFixed(1)}M params` : "";
    const bits = [m.architecture, params, m.dtype, m.templates.length ? `template ${m.templates[0]}` : ""].filter(Boolean);
    return h("option", { value: m.hub_id || m.path, label: bits.join(", ") });
  });
}

// "add a dataset…": a name and a file, sent as an upload; `added(answer)` gets the server's answer.
export function addDatasetBox(added) {
  const name = h("input", { id: "add-dataset-name", type: "text", placeholder: "name, e.g. my_sft_data" });
  const file = h("input", { id: "add-dataset-file", type: "file", accept: ".json,.jsonl,.csv,.parquet" });
  const said = h("div", { class: "hint", id: "add-dataset-said" });
  const send = h("button", { type: "button", id: "add-dataset-send", text: "Add" });
  send.addEventListener("click", async () => {
    const chosen = file.files[0];
    if (!chosen) { said.textContent = "Choose a JSON, JSONL, CSV or Parquet file."; return; }
    const body = new FormData();
    body.append("name", name.value.trim() || chosen.name.replace(/\.[^.]+$/, "").replace(/[^A-Za-z0-9_.-]+/g, "_"));
    body.append("file", chosen);
    said.textContent = "Checking every row…";
    try {
      const out = await postForm("/api/datasets", body);
      file.value = "";
      name.value = "";
      await added(out); // the form offers it first, then says so
      said.textContent = `Added ${out.name}: ${out.detected}`;
    } catch (e) {
      said.textContent = `Not added: ${describe(e)}`;
    }
  });
  return h("details", { id: "add-dataset" }, h("summary", { text: "add a dataset…" }),
    h("div", { class: "field" }, h("label", { for: "add-dataset-name", text: "dataset name" }), name),
    h("div", { class: "field" }, h("label", { for: "add-dataset-file", text: "file (JSON, JSONL, CSV, Parquet)" }), file),
    send, said);
}
