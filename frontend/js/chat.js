// Chat with a running chat job: the answer streams in through tunedeck's OpenAI-compatible route.
import { describe, get, post, token } from "./api.js";
import { $, h, nav, statusBadge } from "./fmt.js";

nav("");
const jobId = Number(location.pathname.split("/").filter(Boolean).at(-2));
const base = `/api/jobs/${jobId}/v1`;
const history = [];
const state = { ready: false, answers: [] };
window.tunedeck = state; // for the browser tests

function say(role, text) {
  const body = h("div", { class: "chat-text", text });
  $("#messages").append(h("div", { class: `chat-msg chat-${role}` }, h("b", { text: role === "user" ? "you" : "model" }), body));
  return body;
}

function headers() {
  const hd = { "Content-Type": "application/json", "X-Tunedeck": "1" };
  return token() ? { ...hd, Authorization: `Bearer ${token()}` } : hd;
}

// The OpenAI stream: `data: {json}` events, each with a piece of the answer, then `data: [DONE]`.
async function ask(question) {
  history.push({ role: "user", content: question });
  say("user", question);
  const out = say("assistant", "");
  const r = await fetch(`${base}/chat/completions`, {
    method: "POST", headers: headers(), body: JSON.stringify({ model: "tunedeck", messages: history, stream: true }),
  });
  if (!r.ok) throw new Error(`${r.status}: ${await r.text()}`);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    for (const ev of events) {
      const data = ev.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("");
      if (!data || data === "[DONE]") continue;
      const piece = JSON.parse(data).choices?.[0]?.delta?.content;
      if (piece) out.textContent += piece;
    }
  }
  history.push({ role: "assistant", content: out.textContent });
  state.answers.push(out.textContent);
}

// What the chat is waiting for: a slot while it is queued (and why, as the queue says), the model after.
function waiting(j) {
  if (j.status !== "queued") return "loading the model…";
  const place = j.queue_position ? `, #${j.queue_position} in line` : "";
  return `queued${place}: waiting for a slot${j.waiting_for ? ` (${j.waiting_for})` : ""}`;
}

async function waitReady(job) {
  for (let j = job; ; j = await get(`/api/jobs/${jobId}`)) {
    $("#status").replaceChildren(statusBadge(j.status));
    $("#state").textContent = waiting(j);
    if (["succeeded", "failed", "cancelled"].includes(j.status)) {
      $("#state").textContent = `the chat server has stopped${j.error ? `: ${j.error}` : ""}`;
      return false;
    }
    if (j.status === "running") {
      try { await get(`${base}/models`); return true; } catch (e) {
        // A chat is its owners' and admins': `get` asked for another token once; 503 while it loads.
        if (e.status === 401 || e.status === 403) { $("#state").textContent = describe(e); return false; }
      }
    }
    await new Promise((done) => setTimeout(done, 1000));
  }
}

async function start() {
  let job;
  try { job = await get(`/api/jobs/${jobId}`); } catch (e) {
    $("#error").replaceChildren(h("div", { class: "error", text: describe(e) }));
    return;
  }
  $("#title").textContent = `#${job.id} ${job.name}`;
  $("#job-link").href = `/jobs/${job.id}`;
  $("#hint").textContent = `Scripts: any OpenAI client with base_url ${location.origin}${base} and a tunedeck token as the API key.`;
  if (job.kind !== "chat") {
    $("#error").replaceChildren(h("div", { class: "error", text: `job ${jobId} is a ${job.kind} job: start a chat from its job page` }));
    return;
  }
  $("#stop").disabled = false;
  if (!(await waitReady(job))) return;
  state.ready = true;
  $("#state").textContent = "ready";
  $("#question").disabled = $("#send").disabled = false;
  $("#question").focus();
}

$("#ask").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const q = $("#question").value.trim();
  if (!q) return;
  $("#question").value = "";
  $("#send").disabled = true;
  try { await ask(q); } catch (e) { $("#error").replaceChildren(h("div", { class: "error", text: describe(e) })); }
  $("#send").disabled = false;
});

$("#stop").addEventListener("click", async () => {
  $("#stop").disabled = true;
  try { await post(`/api/jobs/${jobId}/cancel`); $("#state").textContent = "stopping…"; } catch (e) {
    $("#error").replaceChildren(h("div", { class: "error", text: describe(e) }));
  }
});

start();
