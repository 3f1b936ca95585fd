// Compare's job picker: the chosen jobs first (however old), then the newest jobs that a search finds
// (GET /api/jobs?q=, name or notes), a page at a time instead of every job as a checkbox.
import { get } from "./api.js";
import { $, h } from "./fmt.js";

const SHOWN = 50;

// `chosen` (a Set of ids) is changed in place; `names` learns each listed job's name; `changed()` redraws.
export async function picker({ chosen, names, changed }) {
  const known = new Map(); // id -> row, of every job listed so far
  let asked = 0;
  const label = (j) => h("label", { "data-pick": j.id },
    h("input", { type: "checkbox", value: j.id, checked: chosen.has(j.id),
      onchange: (ev) => { if (ev.target.checked) chosen.add(j.id); else chosen.delete(j.id); changed(); } }),
    ` #${j.id} ${j.name} `, h("span", { class: "muted", text: j.status }));

  async function list() {
    const mine = ++asked;
    const page = await get("/api/jobs", { q: $("#pick-q").value.trim(), limit: SHOWN });
    // A chosen job the search does not find stays listed, so it can be unticked.
    const missing = [...chosen].filter((id) => !known.has(id) && !page.jobs.some((j) => j.id === id));
    const more = await Promise.all(missing.map((id) => get(`/api/jobs/${id}`).catch(() => null)));
    if (mine !== asked) return; // a newer search was asked meanwhile
    for (const j of [...page.jobs, ...more.filter(Boolean)]) { known.set(j.id, j); names.set(j.id, j.name); }
    const picked = [...chosen].map((id) => known.get(id)).filter(Boolean);
    $("#pick").replaceChildren(...[...picked, ...page.jobs.filter((j) => !chosen.has(j.id))].map(label));
    $("#pick-n").textContent = page.next !== null ? `the newest ${SHOWN} found: search to narrow` : `${page.jobs.length} found`;
  }

  let typing = null;
  $("#pick-q").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(list, 250); });
  await list();
}
