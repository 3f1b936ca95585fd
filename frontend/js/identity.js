// Who is asking and what they may do, as the server decides it (GET /api/me asks the server's own
// rule): the pages offer only the actions the server would allow.
import { get } from "./api.js";
import { h } from "./fmt.js";
import { SIGNED_IN, signIn, signOut, token } from "./signin.js";

let asked = null;
const listeners = [];

// One request per page, shared by everything that needs it.
export function whoami() {
  asked ||= get("/api/me");
  return asked;
}

// `fn(me)` now and again whenever who is asking changes: a page that asked for a token mid-way (its
// first requests were refused) learns the new caller without a reload.
export function onMe(fn) {
  listeners.push(fn);
  tell([fn]);
}

// An answer that came after the caller changed is not told: it is about the caller before.
function tell(fns) {
  const p = whoami();
  p.then((me) => { if (p === asked) for (const fn of fns) fn(me); }).catch(() => {});
}

window.addEventListener(SIGNED_IN, () => {
  asked = null;
  tell(listeners);
});

// Whether `me` may act (stop, tag, delete) on a job that `owner` owns: null is a job made without a token.
export function mayAct(me, owner) {
  if (!me) return false;
  if (!owner) return me.acts_on.unowned;
  return owner === me.name ? me.acts_on.own : me.acts_on.others;
}

// The nav's words for the caller: a name and role, or the server's open mode, with sign in or out.
function describeMe(me) {
  if (me.name) return `${me.name} · ${me.role}`;
  return me.open_write ? "open mode: anyone here may act" : "not signed in";
}

export function showWho(slot) {
  onMe((me) => whoIs(slot, me));
}

function whoIs(slot, me) {
  document.body.dataset.maySubmit = me.may_submit ? "yes" : "no";
  const again = () => location.reload(); // every request, and the stream, again with the new token
  const button = token()
    ? h("button", { type: "button", class: "secondary", id: "sign-out", text: "Sign out", onclick: () => { signOut(); again(); } })
    : h("button", { type: "button", class: "secondary", id: "sign-in", text: "Sign in",
      onclick: async () => { if (await signIn("Sign in with your tunedeck token (`tunedeck token create`).")) again(); } });
  slot.replaceChildren(h("span", { id: "me", "data-name": me.name || "", text: describeMe(me) }), " ", button);
}
