// The job page's one x axis for every chart: step, wall time or tokens seen. Logged points carry a step
// and a time; memory samples only a time. The run's own logged points map one onto the other (linear
// between them, at the run's pace beyond its first and last), and tokens come from the tokens-seen
// column (total_tokens) by step.

export const AXES = ["step", "time", "tokens"];
export const TITLES = { step: "step", time: "time", tokens: "tokens seen" };

// y at x on the polyline (xs ascending); beyond its ends along the line through its ends (one point:
// that point's y everywhere).
function interp(x, xs, ys) {
  const n = xs.length;
  if (!n) return null;
  if (n === 1 || xs[n - 1] === xs[0]) return ys[0];
  if (x <= xs[0] || x >= xs[n - 1]) {
    const slope = (ys[n - 1] - ys[0]) / (xs[n - 1] - xs[0]);
    return x <= xs[0] ? ys[0] + (x - xs[0]) * slope : ys[n - 1] + (x - xs[n - 1]) * slope;
  }
  let lo = 0, hi = n - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid; else hi = mid;
  }
  const d = xs[hi] - xs[lo];
  return d ? ys[lo] + ((x - xs[lo]) * (ys[hi] - ys[lo])) / d : ys[lo];
}

// Points sorted by their first value, each first value once, both values finite.
function ascending(a, b) {
  const pairs = a.map((x, i) => [x, b[i]]).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y)).sort((p, q) => p[0] - q[0] || p[1] - q[1]);
  const xs = [], ys = [];
  for (const [x, y] of pairs) {
    if (xs.length && xs[xs.length - 1] === x) continue;
    xs.push(x); ys.push(y);
  }
  return [xs, ys];
}

// The maps of one job's logged points: `metrics` is the page's name -> {step, t, y}.
export function mapping(metrics) {
  const steps = [], times = [];
  for (const s of Object.values(metrics)) {
    if (!s || !s.step) continue;
    for (let i = 0; i < s.step.length; i++) { steps.push(s.step[i]); times.push(s.t[i]); }
  }
  const [byTime, stepOfTime] = ascending(times, steps);
  const [byStep, timeOfStep] = ascending(steps, times);
  const tok = metrics.total_tokens || { step: [], y: [] };
  const [tokSteps, tokens] = ascending(tok.step, tok.y);
  const [tokSorted, stepOfTokens] = ascending(tokens, tokSteps);
  return {
    // A memory sample can be put on a step (or a tokens) axis only between two logged steps: with one
    // (an eval job's step 0) every sample would stand on the same x, a vertical line.
    steps: new Set(byStep).size > 1,
    tokens: tokSteps.length > 0,
    stepAtTime: (t) => interp(t, byTime, stepOfTime),
    timeAtStep: (s) => interp(s, byStep, timeOfStep),
    tokensAtStep: (s) => interp(s, tokSteps, tokens),
    stepAtTokens: (k) => interp(k, tokSorted, stepOfTokens),
  };
}

// The axis a chart is drawn on: the one asked for, or time for a chart of samples when the run logged
// nothing to map them with (no step yet, no token counts).
export function usable(axis, map, samples) {
  if (axis === "tokens" && !map.tokens) return samples ? "time" : "step";
  if (axis !== "time" && samples && !map.steps) return "time";
  return axis;
}

// x on `axis` of a point known by its step (logged points) or only by its time (samples, alerts).
export function xOf(axis, map, { step = null, t = null }) {
  if (axis === "time") return t === null ? (step === null ? null : new Date(map.timeAtStep(step) * 1000)) : new Date(t * 1000);
  const s = step ?? (t === null ? null : map.stepAtTime(t));
  if (s === null) return null;
  return axis === "step" ? s : map.tokensAtStep(s);
}

// A zoomed range on `axis` back to steps (what the series route takes) or to unix seconds (memory).
export function toSteps(axis, map, x) {
  if (axis === "step") return x;
  if (axis === "time") return map.stepAtTime(new Date(x).getTime() / 1000);
  return map.stepAtTokens(x);
}
export function toTime(axis, map, x) {
  if (axis === "time") return new Date(x).getTime() / 1000;
  return map.timeAtStep(toSteps(axis, map, x));
}
// ... and the other way, for a range kept in the address.
export function fromSteps(axis, map, s) { return xOf(axis, map, { step: s }); }
export function fromTime(axis, map, t) { return xOf(axis, map, { t }); }
