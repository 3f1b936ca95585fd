// Where each rank of a hung job waits: the stack dumps a stall alert asked for (GET /api/jobs/{id}/stacks),
// shown under the alert; "Dump again" asks the runners for a fresh one (POST, the owner's).
import { describe, get, post } from "./api.js";
import { h } from "./fmt.js";

const seen = new Map(); // job id -> the newest dump read: the alert list is redrawn as alerts change

function render(box, jobId, got) {
  box.replaceChildren(
    h("div", { class: "stacks-summary" }, h("b", { text: "Where each rank waits: " }),
      got.summary || "no runner has sent its dump yet (they send with their next batch)"),
    got.flight_recorder
      ? h("div", { class: "stacks-flight" }, h("b", { text: "Flight recorder: " }), got.flight_recorder)
      : null,
    got.ranks.length
      ? h("ul", { class: "stacks-ranks" }, ...got.ranks.map((r) =>
        h("li", { text: `rank ${r.rank} on ${r.node || "this node"} (pid ${r.pid}): ${r.where}` })))
      : null,
    h("div", { class: "muted" }, `dump ${got.request} (${got.reason}) · `,
      h("a", { href: `/api/jobs/${jobId}/stacks?request=${got.request}`, target: "_blank", rel: "noopener", text: "every frame (JSON)" })),
  );
}

async function load(box, jobId) {
  try {
    const got = await get(`/api/jobs/${jobId}/stacks`);
    seen.set(jobId, got);
    render(box, jobId, got);
    return got;
  } catch (e) {
    box.replaceChildren(h("span", { class: "muted", text: describe(e) }));
    return null;
  }
}

export function stacksPanel(jobId, open) {
  const box = h("div", { class: "stacks" });
  if (seen.has(jobId)) render(box, jobId, seen.get(jobId));
  const show = h("button", { class: "secondary stacks-show", type: "button" }, "Where each rank waits");
  show.addEventListener("click", async () => {
    show.disabled = true;
    let got = await load(box, jobId);
    // A dump still arriving: look again a few times as the runners send their parts.
    for (let i = 0; got && !got.summary && i < 20; i += 1) {
      await new Promise((r) => setTimeout(r, 3000));
      got = await load(box, jobId);
    }
    show.disabled = false;
  });
  const again = h("button", { class: "secondary stacks-again needs-submit", type: "button", title: "ask every runner for a new py-spy dump" }, "Dump again");
  again.addEventListener("click", async () => {
    again.disabled = true;
    try {
      await post(`/api/jobs/${jobId}/stacks`, {});
      show.click();
    } catch (e) {
      box.replaceChildren(h("span", { class: "muted", text: describe(e) }));
    }
    again.disabled = false;
  });
  return h("div", { class: "stacks-panel" }, show, " ", open ? again : null, box);
}
