// Fetch helpers shared by every page: JSON in and out, an optional bearer token, readable errors.

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.detail = detail;
  }
}

export function token() { return localStorage.getItem("tunedeck.token") || ""; }

function headers(extra = {}) {
  const t = token();
  return t ? { ...extra, Authorization: `Bearer ${t}` } : extra;
}

async function handle(r) {
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = text; }
  if (!r.ok) throw new ApiError(r.status, body && body.detail !== undefined ? body.detail : body);
  return body;
}

export async function get(path, params = {}) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== ""));
  const url = q.toString() ? `${path}?${q}` : path;
  return handle(await fetch(url, { headers: headers() }));
}

export async function post(path, body, { yaml = false } = {}) {
  const r = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": yaml ? "application/yaml" : "application/json" }),
    body: yaml ? body : JSON.stringify(body ?? {}),
  });
  return handle(r);
}

// An endpoint another part of the server may not offer yet: null instead of an error on 404/405.
export async function optional(path, params) {
  try { return await get(path, params); } catch (e) {
    if (e instanceof ApiError && (e.status === 404 || e.status === 405)) return null;
    throw e;
  }
}

export function streamUrl(params) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined));
  if (token()) q.set("access_token", token());
  return `/api/stream?${q}`;
}

// One EventSource per page. The browser reconnects by itself and sends Last-Event-ID, so the
// server resumes exactly after the last event we got.
export function live(params, handlers, indicator) {
  const es = new EventSource(streamUrl(params));
  const mark = (on) => { if (indicator) { indicator.className = `live ${on ? "on" : "off"}`; indicator.textContent = on ? "live" : "reconnecting…"; } };
  es.onopen = () => mark(true);
  es.onerror = () => mark(false);
  for (const [name, fn] of Object.entries(handlers)) {
    es.addEventListener(name, (ev) => { mark(true); fn(JSON.parse(ev.data), ev.lastEventId); });
  }
  return es;
}

export function describe(e) {
  if (e instanceof ApiError) {
    if (Array.isArray(e.detail)) return e.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
    return `${e.status}: ${typeof e.detail === "string" ? e.detail : JSON.stringify(e.detail)}`;
  }
  return String(e && e.message ? e.message : e);
}
