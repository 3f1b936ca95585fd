// Plotly helpers: smoothing, layouts, and a redraw that runs at most a few times a second.
/* global Plotly */

export const GiB = 1024 ** 3;

// A page either names plotly.js in a <script> tag, or preloads it (<link rel="preload">) and runs it
// with loadPlotly() once its own requests are out: evaluating it takes the main thread for a while
// even from the cache, and that time then overlaps the network instead of holding the requests
// back. Whatever draws waits for plotlyReady.
const plotlyTag = document.querySelector('script[src$="plotly.min.js"]');
const preloaded = document.querySelector('link[rel="preload"][href$="plotly.min.js"]');
let runPlotly = () => {};
export const plotlyReady = window.Plotly || (!plotlyTag && !preloaded) ? Promise.resolve()
  : plotlyTag ? new Promise((resolve) => plotlyTag.addEventListener("load", resolve, { once: true }))
  : new Promise((resolve) => {
    runPlotly = () => {
      runPlotly = () => {};
      const tag = document.createElement("script");
      tag.src = preloaded.href;
      tag.addEventListener("load", resolve, { once: true });
      document.head.append(tag);
    };
  });
export function loadPlotly() { runPlotly(); }

// Exponential moving average, debiased at the start (TensorBoard's smoothing). Kept as a running
// state so live points extend a smoothed line without recomputing it from the first step.
export class Ema {
  constructor(weight) { this.weight = weight; this.last = 0; this.n = 0; }
  next(y) {
    if (!this.weight) return y;
    if (y === null || !Number.isFinite(y)) return null;
    this.last = this.last * this.weight + (1 - this.weight) * y;
    this.n++;
    return this.last / (1 - this.weight ** this.n);
  }
}

// The smoothing a loss line gets until the user picks one: none on a short run (an EMA lags by about
// 1/(1-w) points, a good part of a short run: 0.6 made a wrecked 8-point run read as a descent), then
// a window of about a twentieth of the points, up to 0.9 on thousands.
export function defaultSmoothing(points) {
  return Math.round(100 * Math.min(0.9, Math.max(0, 1 - 20 / points))) / 100;
}

export function ema(ys, weight) {
  if (!weight) return ys;
  const e = new Ema(weight);
  return ys.map((y) => e.next(y));
}

// Plotly renders trace names and hover text as its own HTML subset, links included: text that comes
// from jobs or runners (GPU names, alert messages) goes in with its markup characters escaped.
export function plain(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// The page's colours (light or dark theme) for a chart: transparent paper, text and grid from the CSS.
export function themed() {
  const css = getComputedStyle(document.documentElement);
  const fg = css.getPropertyValue("--fg").trim() || "#1d2330", line = css.getPropertyValue("--line").trim() || "#e3e6eb";
  const axis = { gridcolor: line, zerolinecolor: line, linecolor: line };
  return { paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: fg },
    template: { layout: { xaxis: axis, yaxis: axis } } };
}

export function layout(title, extra = {}) {
  return {
    ...themed(),
    title: { text: title, font: { size: 13 }, x: 0.01 },
    // Already as wide as automargin makes them for the usual labels (the legend row above, the x title
    // below, the last x tick's overhang): Plotly lays a chart out again whenever automargin has to
    // grow a margin, and a first draw twice over was half of the job page's drawing time.
    margin: { l: 60, r: 20, t: extra.showlegend === false ? 20 : 48, b: 45 },
    // Above the plot: Plotly makes room for it there; below, it would sit on the x-axis title.
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom" },
    hovermode: "x unified",
    hoverlabel: { namelength: -1 }, // whole series names, not Plotly's first 15 characters
    uirevision: "keep", // keep zoom and legend toggles across redraws
    ...extra,
  };
}

// An axis range around every finite value with a margin; a flat series sits mid-chart at its own
// value (Plotly's autorange would put it on a 0 ± 1 axis). Log axes take log10 units.
export function range(arrays, { log = false, pad = 0.06 } = {}) {
  let lo = Infinity, hi = -Infinity;
  for (const ys of arrays) {
    for (const y of ys || []) {
      if (y === null || !Number.isFinite(y) || (log && y <= 0)) continue;
      if (y < lo) lo = y;
      if (y > hi) hi = y;
    }
  }
  if (lo > hi) return undefined;
  if (log) { lo = Math.log10(lo); hi = Math.log10(hi); }
  const d = hi > lo ? pad * (hi - lo) : log ? 0.5 : Math.abs(lo) * 0.1 || 1;
  return [lo - d, hi + d];
}

// A series of one point has no line to draw: give it a marker.
export function mode(xs, lines = "lines") {
  return xs.length < 2 ? "markers" : lines;
}

// A chart with nothing to show says why, in words, instead of drawing bare axes.
export function empty(el, message) {
  const muted = getComputedStyle(document.documentElement).getPropertyValue("--muted").trim() || "#667085";
  return Plotly.react(el, [], {
    ...themed(),
    margin: { l: 10, r: 10, t: 10, b: 10 },
    xaxis: { visible: false }, yaxis: { visible: false },
    annotations: [{ text: plain(message), xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
      font: { size: 14, color: muted } }],
  }, config);
}

// Plotly's toolbar: zoom, pan, reset and save only (its other buttons were ten Tab stops a chart, one
// of them "Share chart…" to plotly's cloud),
// and none on a phone, where it sat on the legend's first row (there a drag pans and a double tap
// resets the zoom).
export const config = {
  displaylogo: false,
  responsive: true,
  displayModeBar: window.matchMedia("(max-width: 600px)").matches ? false : "hover",
  modeBarButtonsToRemove: ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d", "toggleSpikelines",
    "hoverClosestCartesian", "hoverCompareCartesian", "sendDataToCloud"],
  // Never offer to send a run's data to Chart Studio (plotly's cloud): nothing leaves the team's server.
  showSendToCloud: false,
  showEditInChartStudio: false,
};

// Coalesce many updates into one Plotly.react per interval.
export function throttled(fn, ms = 300) {
  let timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; fn(); }, ms);
  };
}

// Runs fn on the next frame, once however many calls came before it: a live point is drawn in the
// frame after it arrives, and a burst of points costs one draw.
export function framed(fn) {
  let pending = false;
  return () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; fn(); });
  };
}

// Calls back with the zoomed x range, or null when the user resets the zoom.
// A chart not drawn yet (its data still loading, or nothing to draw) is hooked on its first draw.
export function onZoom(el, fn) {
  const hook = () => el.on("plotly_relayout", (ev) => {
    if (ev["xaxis.autorange"]) fn(null);
    else if (ev["xaxis.range[0]"] !== undefined) fn([ev["xaxis.range[0]"], ev["xaxis.range[1]"]]);
    else if (ev["xaxis.range"]) fn(ev["xaxis.range"]);
  });
  if (typeof el.on === "function") { hook(); return; }
  const drawn = new MutationObserver(() => {
    if (typeof el.on === "function") { drawn.disconnect(); hook(); }
  });
  drawn.observe(el, { childList: true });
}
