// Which jobs the team page shows: the filters (text, owner, tag, created after, status, my jobs) are
// asked of the server (GET /api/jobs, newest first), a page of PAGE rows at a time by its cursor, sorted
// as chosen; every choice is kept in the address, so a reload or a shared link shows the same rows.
// The rows' contents stay live from the stream; which rows belong is asked again when a job appears or
// changes status.
import { get } from "./api.js";
import { $, h } from "./fmt.js";

export const PAGE = 50;
const TEXT = ["q", "owner", "tag", "since", "sort"]; // inputs named by their parameter in the address
const SORTS = {
  oldest: (a, b) => a.id - b.id,
  name: (a, b) => a.name.localeCompare(b.name) || b.id - a.id,
  loss: (a, b) => (a.last_loss ?? Infinity) - (b.last_loss ?? Infinity) || b.id - a.id,
};

export class Listing {
  constructor(changed) {
    this.changed = changed; // the page draws again
    this.ids = null; // the page's job ids in the server's order; null until it answers
    this.fetched = new Map(); // the server's rows, for a job the stream has not sent yet
    this.next = null; // cursor of the older page
    this.newer = []; // cursors of the pages before this one ("" the first)
    this.known = new Map(); // job id -> the status the stream last sent
    this.me = null;
    this.asked = 0;
    this.timer = null;
    const url = new URLSearchParams(location.search);
    for (const k of TEXT) $(`#${k}`).value = url.get(k) || "";
    this.after = url.get("after") || "";
    let typing = null;
    for (const k of TEXT.filter((k) => k !== "sort")) {
      $(`#${k}`).addEventListener("input", () => {
        clearTimeout(typing);
        typing = setTimeout(() => this.refilter(), 250); // asked once typing pauses
      });
    }
    $("#sort").addEventListener("change", () => { this.remember(); this.changed(); }); // the page shown, re-ordered
    $("#older").addEventListener("click", () => { this.newer.push(this.after); this.turn(String(this.next)); });
    $("#newer").addEventListener("click", () => this.turn(this.newer.pop() || ""));
  }

  // A filter changed: back to the first page.
  refilter() {
    this.newer = [];
    this.turn("");
  }

  turn(after) {
    this.after = after;
    this.remember();
    this.load();
  }

  // The address holds every choice (and the page's cursor); the status select and My jobs are jobs.js's.
  remember() {
    const u = new URL(location.href);
    for (const k of [...TEXT, "after"]) {
      const v = k === "after" ? this.after : $(`#${k}`).value.trim();
      if (v) u.searchParams.set(k, v); else u.searchParams.delete(k);
    }
    history.replaceState(null, "", u);
  }

  params() {
    const since = $("#since").value;
    const mine = $("#mine").checked && this.me && this.me.name;
    return {
      status: $("#filter").value,
      q: $("#q").value.trim(),
      owner: mine ? this.me.name : $("#owner").value.trim(),
      tag: $("#tag").value.trim(),
      // The day the user picked starts at their midnight, not UTC's.
      created_after: since ? new Date(`${since}T00:00`).toISOString() : "",
      after: this.after,
      limit: PAGE,
    };
  }

  async load() {
    if ($("#mine").checked && !this.me) return; // my jobs need my name: jobs.js loads again once it is known
    const asked = ++this.asked;
    $("#owner").disabled = !!($("#mine").checked && this.me && this.me.name);
    let page;
    try {
      page = await get("/api/jobs", this.params());
    } catch (e) {
      if (asked !== this.asked) return;
      $("#list-error").replaceChildren(h("div", { class: "error", text: `Cannot list jobs: ${e.message}` }));
      return;
    }
    if (asked !== this.asked) return; // a newer choice was asked meanwhile
    $("#list-error").replaceChildren();
    this.ids = page.jobs.map((j) => j.id);
    this.fetched = new Map(page.jobs.map((j) => [j.id, j]));
    this.next = page.next;
    this.changed();
  }

  // Streamed rows: a new job, or one whose status moved, may enter or leave the page; progress alone
  // (most rows the stream sends) changes nothing of which rows belong.
  streamed(rows) {
    const moved = rows.some((j) => this.known.get(j.id) !== j.status);
    for (const j of rows) this.known.set(j.id, j.status);
    if (moved && !this.timer) this.timer = setTimeout(() => { this.timer = null; this.load(); }, 500);
  }

  // The page's rows, each as the stream last sent it, in the order chosen.
  rows(jobs) {
    if (this.ids === null) return [];
    const rows = this.ids.map((id) => jobs.get(id) || this.fetched.get(id));
    const sort = SORTS[$("#sort").value];
    return sort ? rows.sort(sort) : rows;
  }

  pager(shown) {
    $("#older").disabled = this.next === null;
    $("#newer").disabled = !this.after;
    $("#pager").hidden = this.next === null && !this.after;
    $("#page-n").textContent = this.after ? `older than #${this.after}` : shown ? "newest" : "";
  }
}

// What the owner and tag fields offer: every owner and tag among the jobs the stream sent.
export function choices(jobs) {
  const owners = new Set(), tags = new Set();
  for (const j of jobs.values()) {
    if (j.owner) owners.add(j.owner);
    for (const t of j.tags || []) tags.add(t);
  }
  const options = (set) => [...set].sort().map((v) => h("option", { value: v }));
  $("#owners").replaceChildren(...options(owners));
  $("#tags").replaceChildren(...options(tags));
}
