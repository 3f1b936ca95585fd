// Signing in: a dialog on the page (never window.prompt) whose token is kept for this browser session.
import { h } from "./fmt.js";

const KEY = "tunedeck.token";
export const SIGNED_IN = "tunedeck:signed-in";

export function token() { return sessionStorage.getItem(KEY) || ""; }

export function signOut() { sessionStorage.removeItem(KEY); }

let asking = null;

// Resolves true once a token is stored, false when the user cancels. Several requests of one page may
// need a token together: they share one dialog and its answer.
export function signIn(message = "This tunedeck server needs a token (`tunedeck token create`).") {
  asking ||= ask(message).finally(() => { asking = null; });
  return asking;
}

function ask(message) {
  return new Promise((resolve) => {
    const field = h("input", { id: "signin-token", type: "password", autocomplete: "off", spellcheck: "false",
      placeholder: "tdk_…", "aria-label": "token", required: true });
    const form = h("form", { method: "dialog", class: "signin" },
      h("h2", { text: "Sign in" }),
      h("p", { class: "muted", id: "signin-why", text: message }),
      h("label", { for: "signin-token", text: "Token" }), field,
      h("div", { class: "toolbar", style: "margin:10px 0 0" },
        h("button", { type: "submit", id: "signin-ok", text: "Sign in" }),
        h("button", { type: "button", class: "secondary", id: "signin-cancel", text: "Cancel" })));
    const dialog = h("dialog", { id: "signin", "aria-labelledby": "signin-why" }, form);
    const done = (ok) => { dialog.close(); dialog.remove(); resolve(ok); };
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = field.value.trim();
      if (!t) return;
      sessionStorage.setItem(KEY, t);
      window.dispatchEvent(new Event(SIGNED_IN)); // who is asking has changed (identity.js asks again)
      done(true);
    });
    form.querySelector("#signin-cancel").addEventListener("click", () => done(false));
    dialog.addEventListener("cancel", (ev) => { ev.preventDefault(); done(false); }); // Escape
    document.body.append(dialog);
    dialog.showModal();
    field.focus();
  });
}
