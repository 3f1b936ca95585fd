// A refused action (403, 409, 422...) stays on screen until the user dismisses it: it lives in a box of
// its own, which no live update re-renders.
import { describe } from "./api.js";
import { h } from "./fmt.js";

export function refuse(box, what, error) {
  const item = h("div", { class: "error refusal", role: "alert", "data-status": error && error.status },
    h("span", { text: `${what}: ${describe(error)}` }), " ",
    h("button", { type: "button", class: "secondary dismiss", text: "Dismiss", onclick: () => item.remove() }));
  box.append(item);
  return item;
}
