// The team page's actions on a row, offered only where the server would allow them (identity.js).
import { post } from "./api.js";
import { h } from "./fmt.js";
import { mayAct } from "./identity.js";
import { refuse } from "./refusal.js";

const ACTIVE = new Set(["queued", "running"]);

// Stop for a queued or running job the caller may stop; a refusal goes to `box`, which outlives the row.
export function actions(j, me, box) {
  if (!ACTIVE.has(j.status) || !mayAct(me, j.owner)) return [];
  const stop = h("button", { type: "button", class: "danger stop", "data-stop": j.id, text: "Stop" });
  stop.addEventListener("click", async () => {
    if (!window.confirm(`Stop job #${j.id} ${j.name}? It stops after the current step and saves its adapter.`)) return;
    stop.disabled = true;
    stop.textContent = "Stopping…";
    try {
      await post(`/api/jobs/${j.id}/cancel`); // the stream brings the row's new state
    } catch (e) {
      refuse(box, `Stop #${j.id} ${j.name} failed`, e);
      stop.disabled = false;
      stop.textContent = "Stop";
    }
  });
  return [stop];
}
