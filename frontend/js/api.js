// Fetch helpers shared by every page: JSON in and out, an optional bearer token, readable errors.
import { signIn, token } from "./signin.js";

export { token };

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.detail = detail;
  }
}

const REFUSED = "The server refused this token (invalid or revoked). Sign in with another.";

async function send(url, init = {}) {
  return handle(await authorized(url, init));
}

async function authorized(url, init = {}) {
  const used = token();
  let r = await fetch(url, { ...init, headers: headers(init.headers) });
  // A server with closed reads or writes wants a bearer token: the page asks for one (several requests
  // that fail together share the one dialog). A 403 is a refusal the page shows, not a question.
  if (r.status === 401 && (token() !== used || await signIn(used ? REFUSED : undefined))) {
    r = await fetch(url, { ...init, headers: headers(init.headers) });
  }
  return r;
}

// X-Tunedeck marks a request as the app's own: the server refuses writes without it, and a page of
// another site cannot send it.
function headers(extra = {}) {
  const t = token();
  const h = { ...extra, "X-Tunedeck": "1" };
  return t ? { ...h, Authorization: `Bearer ${t}` } : h;
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
  return send(url);
}

export async function post(path, body, { yaml = false } = {}) {
  return send(path, {
    method: "POST",
    headers: { "Content-Type": yaml ? "application/yaml" : "application/json" },
    body: yaml ? body : JSON.stringify(body ?? {}),
  });
}

export async function patch(path, body) {
  return send(path, { method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body ?? {}) });
}

export async function del(path, params = {}) {
  const q = new URLSearchParams(params);
  return send(q.toString() ? `${path}?${q}` : path, { method: "DELETE" });
}

// A file or archive the server streams, saved under the name it gives. A plain link cannot carry the
// Authorization header: with a token the bytes come through fetch and are handed to the browser as a
// blob (without one the link is followed as it is, streamed to disk). A refusal throws an ApiError.
export async function download(url, fallbackName) {
  const r = await authorized(url);
  if (!r.ok) return handle(r);
  const named = /filename\*?=(?:UTF-8'')?"?([^";]+)"?/i.exec(r.headers.get("Content-Disposition") || "");
  const a = document.createElement("a");
  a.href = URL.createObjectURL(await r.blob());
  a.download = named ? decodeURIComponent(named[1]) : fallbackName;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000); // once the browser has taken the bytes
  return a.download;
}

// A link to a download: followed by the browser itself without a token, through `download` with one;
// a refused download goes to `onError`.
export function downloadLink(url, text, name, onError, attrs = {}) {
  const a = document.createElement("a");
  a.href = url;
  a.textContent = text;
  a.setAttribute("download", name);
  for (const [k, v] of Object.entries(attrs)) a.setAttribute(k, v);
  a.addEventListener("click", (ev) => {
    if (!token()) return;
    ev.preventDefault();
    download(url, name).catch(onError);
  });
  return a;
}

// A multipart form (an upload): the browser sets the Content-Type with its boundary.
export async function postForm(path, formData) {
  return send(path, { method: "POST", body: formData });
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
export async function live(params, handlers, indicator) {
  // An EventSource cannot report a 401: on a server with closed reads, one plain request first
  // makes the page ask for the token.
  if (!token()) await get("/api/stream/cursor").catch(() => {});
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
