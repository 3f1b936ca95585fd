// A job's alerts: evidence, advice with what it changes, and the advised change as a new job in one click.
import { describe, post } from "./api.js";
import { h } from "./fmt.js";
import { refuse } from "./refusal.js";
import { stacksPanel } from "./stacks.js";

// A CPU job's series (-1) is the host's memory, never "GPU -1".
export function deviceLabel(gpu) {
  return gpu === -1 ? "host memory" : `GPU ${gpu}`;
}

function value(v) {
  return typeof v === "string" ? v : JSON.stringify(v);
}

function rerun(jobId, change) {
  const note = h("span", { class: "muted rerun-note" });
  const button = h("button", { class: "secondary rerun needs-submit", type: "button", "data-change": JSON.stringify(change),
    title: "a new job: this job's config with the change above" }, "Run again with this change");
  button.addEventListener("click", async () => {
    button.disabled = true;
    note.textContent = " submitting…";
    try {
      const job = await post(`/api/jobs/${jobId}/clone`, { overrides: change });
      location.assign(`/jobs/${job.id}`);
    } catch (e) {
      // The alert list is drawn again as alerts change: a refusal outlives it in the page's own box.
      const box = document.getElementById("refusals");
      if (box) { note.textContent = ""; refuse(box, "Run again failed", e); } else note.textContent = ` ${describe(e)}`;
      button.disabled = false;
    }
  });
  return h("div", { class: "change" },
    h("span", { class: "muted", text: "change: " }),
    ...Object.entries(change).map(([k, v]) => h("code", { text: `${k}: ${value(v)}` })), " ", button, note);
}

// The node is named where the message names it (a job on several nodes), as "node-b · GPU 0".
function where(a) {
  if (a.gpu === null || a.gpu === undefined) return "";
  const named = a.node && (a.message || "").startsWith(`${a.node} `);
  return ` · ${named ? `${a.node} · ` : ""}${deviceLabel(a.gpu)}`;
}

export function alertItem(a, jobId) {
  return h("div", { class: `alert-item${a.open ? "" : " closed"}`, "data-kind": a.kind, "data-severity": a.severity, "data-id": a.id, "data-open": a.open ? "1" : "0" },
    h("span", { class: `badge sev-${a.severity}`, text: a.severity }), " ",
    h("b", { text: a.kind }), where(a),
    a.step !== null && a.step !== undefined ? ` · step ${a.step}` : "", a.count > 1 ? ` · ×${a.count}` : "",
    h("span", { class: "state", text: a.open ? " · open" : " · resolved" }),
    h("div", { text: a.message }),
    a.suggestion ? h("div", { class: "sugg", text: `→ ${a.suggestion}` }) : null,
    a.change ? rerun(jobId, a.change) : null,
    a.kind === "stall" && jobId ? stacksPanel(jobId, a.open) : null);
}
