// Drawing one method's result into its region: image blocks, highlighted tokens, bars for
// tabular features, a prompt x output grid for generated text. Every drawn feature, token,
// cell or pixel block carries data-score, its attribution; colours follow the sign and
// colormap chosen, the scores never change.

// The colormaps are the API pictures' own (served from service/serving/render.py's table), so
// that a score has one colour on the page and in a rendered PNG.
import { ANCHORS, DIVERGING } from "./colormaps.js";

/** What each colormap's ends look like, for the legend's words. */
const ENDS = { redblue: ["blue", "red"], viridis: ["purple", "yellow"], grays: ["white", "black"] };

/** The legend of a view: a swatch of the colours shown, and in words which colour is positive
 * (by default: raises the target's score) and which negative (lowers it). */
export function legend(sign, cmap, up = "raises the target's score", down = "lowers it") {
  const diverging = DIVERGING[cmap];
  const map = sign === "absolute" && diverging ? "grays" : cmap;
  const [low, high] = ENDS[map] || ["light", "dark"];
  const half = Math.floor(ANCHORS[map].length / 2);
  let anchors = ANCHORS[map];
  if (diverging && sign === "positive") anchors = anchors.slice(half);
  if (diverging && sign === "negative") anchors = anchors.slice(0, half + 1).reverse();
  const strong = diverging && sign === "negative" ? low : high;
  const words = {
    all: `${high}: positive, ${up}; ${low}: negative, ${down}; ${diverging ? "white" : "the middle"}: no effect`,
    absolute: `${high}: a large effect either way (the sign is not shown); ${low}: none`,
    positive: `${strong}: positive, ${up} (negative scores are not shown)`,
    negative: `${strong}: negative, ${down} (positive scores are not shown)`,
  }[sign];
  const box = el("p", { class: "legend", role: "note", "aria-label": "Legend" });
  const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
  const stops = anchors.map((h) => `#${h}`);
  swatch.style.background = `linear-gradient(to right, ${stops.join(", ")})`;
  box.append(swatch, el("span", {}, `Colour: ${words}.`));
  return box;
}

/** The legend of a view whose colours are fixed (red for positive, blue for negative, grey
 * for neither): a swatch of the three and `words` saying what each means. */
export function signLegend(words) {
  const box = el("p", { class: "legend", role: "note", "aria-label": "Legend" });
  const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
  // the colours of explorer.css's .bar.for and .bar.against
  swatch.style.background = "linear-gradient(to right, #b2182b 0 33%, #bbb 33% 67%, #2166ac 67%)";
  box.append(swatch, el("span", {}, `Colour: ${words}.`));
  return box;
}

function rgb(hex) {
  return [0, 2, 4].map((i) => parseInt(hex.slice(i, i + 2), 16));
}

/** The colour of `t` in 0..1 on a colormap. */
function lookup(name, t) {
  const stops = ANCHORS[name].map(rgb);
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  return stops[i].map((c, k) => Math.round(c + (stops[i + 1][k] - c) * f));
}

/** A scorer for the shown values: colour of a score, by sign and colormap. */
export function palette(values, sign, cmap) {
  const shown = (v) =>
    sign === "absolute" ? Math.abs(v) : sign === "positive" ? Math.max(v, 0) : sign === "negative" ? Math.max(-v, 0) : v;
  let scale = 0;
  for (const v of values) scale = Math.max(scale, Math.abs(shown(v)));
  scale = scale || 1;
  const two = sign === "all" || DIVERGING[cmap];
  // one convention with the API's pictures: on a diverging map positive is its red end,
  // negative its blue end, and a magnitude without its sign is grey
  const map = sign === "absolute" && DIVERGING[cmap] ? "grays" : cmap;
  return {
    scale,
    colour(v) {
      const s = shown(v) / scale; // -1..1 for "all", 0..1 otherwise
      let t = s; // grey, and the sequential maps: 0..1 as it is
      if (map === cmap && sign === "all") t = (s + 1) / 2;
      else if (map === cmap && two) t = sign === "negative" ? 0.5 - s / 2 : 0.5 + s / 2;
      const [r, g, b] = lookup(map, t);
      return `rgb(${r}, ${g}, ${b})`;
    },
    alpha(v) {
      return Math.min(1, Math.abs(shown(v)) / scale);
    },
  };
}

const fmt = (v) => (v === null || v === undefined ? "–" : Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : Number(v.toFixed(4)).toString());

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

/** An array's shape (nested lists). */
export function shapeOf(a) {
  const shape = [];
  while (Array.isArray(a)) {
    shape.push(a.length);
    a = a[0];
  }
  return shape;
}

function flat(a) {
  return Array.isArray(a) ? a.flat(Infinity) : [a];
}

/** A [C, H, W] image (values in [0, 1], clipped; one channel drawn grey) as a canvas. */
export function imageCanvas(chw, name = "image") {
  const c = chw.length;
  const h = chw[0].length;
  const w = chw[0][0].length;
  const canvas = el("canvas", { width: String(w), height: String(h), class: "picture", role: "img", "aria-label": name });
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(w, h);
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const p = 4 * (y * w + x);
      for (let k = 0; k < 3; k++) img.data[p + k] = Math.round(255 * Math.min(1, Math.max(0, chw[c === 1 ? 0 : k][y][x])));
      img.data[p + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  return canvas;
}

/** Blocks of an [C, H, W] or [H, W] map: each the sum over its pixels and channels. */
export function blocks(map) {
  const planes = shapeOf(map).length === 3 ? map : [map];
  const h = planes[0].length;
  const w = planes[0][0].length;
  const size = Math.max(1, Math.ceil(Math.max(h, w) / 32));
  const rows = Math.ceil(h / size);
  const cols = Math.ceil(w / size);
  const sums = new Float64Array(rows * cols);
  for (const plane of planes) {
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++) sums[Math.floor(y / size) * cols + Math.floor(x / size)] += plane[y][x];
    }
  }
  return { size, rows, cols, sums: Array.from(sums) };
}

/** An image map over the input (a canvas of it, when given), one cell per block. */
export function drawImage(target, map, picture, style) {
  const { rows, cols, sums } = blocks(map);
  const grid = el("div", { class: "heat", role: "img", "aria-label": `${rows} x ${cols} blocks` });
  grid.style.gridTemplateColumns = `repeat(${cols}, 1fr)`;
  grid.style.aspectRatio = `${cols} / ${rows}`;
  if (picture) grid.append(picture);
  const p = palette(sums, style.sign, style.colormap);
  sums.forEach((s, i) => {
    const cell = el("div", { class: "cell", "data-score": String(s), title: `block ${i}: ${fmt(s)}` });
    cell.style.background = p.colour(s);
    if (picture) cell.style.opacity = String(0.15 + 0.7 * p.alpha(s));
    grid.append(cell);
  });
  target.append(grid, el("p", { class: "hint" }, `scale ±${fmt(p.scale)} per block`));
}

/** Highlighted tokens; hover shows the score. */
export function drawTokens(target, scores, tokens, style) {
  const box = el("p", { class: "tokens" });
  const used = scores.slice(0, tokens.length);
  const p = palette(used, style.sign, style.colormap);
  tokens.forEach((token, i) => {
    const s = used[i];
    const span = el("span", { "data-score": String(s), title: `${token}: ${fmt(s)}` }, token);
    span.style.background = p.colour(s);
    box.append(span, " ");
  });
  target.append(box);
}

/** Horizontal bars, one per feature, from the middle line (`title(i)`: each bar's tooltip). */
export function drawBars(target, scores, names, style, title = (i) => `${names[i]}: ${fmt(scores[i])}`) {
  const box = el("div", { class: "bars" });
  const p = palette(scores, style.sign, style.colormap);
  scores.forEach((s, i) => {
    const row = el("div", { class: "track", "data-score": String(s), title: title(i) });
    const bar = el("div", { class: "bar" });
    const frac = Math.abs(s) / p.scale / 2;
    bar.style.background = p.colour(s);
    bar.style.width = `${frac * 100}%`;
    bar.style.left = s < 0 ? `${(0.5 - frac) * 100}%` : "50%";
    row.append(bar);
    box.append(el("span", { class: "name" }, names[i]), row, el("span", { class: "value" }, fmt(s)));
  });
  target.append(box);
}

/** Generated text: one row per output token, one column per prompt feature. The numbers are
 * fixed-point with one count of decimals for the whole grid (no exponents, no wrapping), and
 * the grid scrolls sideways inside its region when it is wider than the screen. */
export function drawGrid(target, rows, inputs, outputs, style) {
  const table = el("table", { class: "grid" });
  const fixed = fixedPoint(rows.flat());
  const head = el("tr");
  head.append(el("th"));
  inputs.forEach((t) => head.append(el("th", {}, t)));
  table.append(head);
  const p = palette(rows.flat(), style.sign, style.colormap);
  rows.forEach((row, i) => {
    const tr = el("tr");
    tr.append(el("th", {}, outputs[i] ?? String(i)));
    row.forEach((s, j) => {
      const td = el("td", { "data-score": String(s), title: `${outputs[i]} ← ${inputs[j]}: ${fmt(s)}` }, fixed(s));
      td.style.background = p.colour(s);
      tr.append(td);
    });
    table.append(tr);
  });
  const scroll = el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "attribution grid" });
  scroll.append(table);
  target.append(scroll, el("p", { class: "hint" }, "Rows: the answer's tokens; columns: the prompt's. Scroll sideways for more."));
}

/** A formatter of a set of values: fixed-point, with enough decimals for three significant
 * digits of the largest, the same for all (so columns line up), and no "-0". */
export function fixedPoint(values) {
  let top = 0;
  for (const v of values) if (Number.isFinite(v)) top = Math.max(top, Math.abs(v));
  const decimals = top > 0 ? Math.min(8, Math.max(0, 2 - Math.floor(Math.log10(top)))) : 0;
  return (v) => {
    if (v === null || v === undefined || !Number.isFinite(v)) return "–";
    const text = v.toFixed(decimals);
    return Number(text) === 0 ? (0).toFixed(decimals) : text;
  };
}

/** How to read each metric, in one sentence. */
const READ = {
  infidelity: "How far the attributions miss the change in the output when the input is nudged; lower is better, 0 is perfect.",
  sensitivity_max: "How much the attributions move when the input is jittered a little; lower is steadier.",
  deletion: "The model's output as the most important features are removed first: a steep early drop (a small area) means the attributions found what the answer rests on.",
  insertion: "The model's output as the most important features are put back first into a blank input: a fast rise (a large area) means the attributions found what the answer rests on.",
};
const NAMES = { infidelity: "Infidelity", sensitivity_max: "Sensitivity (max)", deletion: "Deletion curve", insertion: "Insertion curve" };

/** A deletion or insertion curve as a small chart: the share of features changed along, the
 * output up, the area under it shaded. */
function curveChart(values, name) {
  const w = 200;
  const h = 64;
  const pad = 18;
  const lo = Math.min(0, ...values);
  const hi = Math.max(...values);
  const x = (i) => pad + (i / Math.max(1, values.length - 1)) * (w - pad - 4);
  const y = (v) => 4 + (1 - (v - lo) / (hi - lo || 1)) * (h - pad - 4);
  const svg = svgEl("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": `${name}: ${values.length} points from ${fmt(values[0])} to ${fmt(values[values.length - 1])}` });
  const pts = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`);
  svg.append(
    svgEl("polygon", { points: `${x(0)},${y(lo)} ${pts.join(" ")} ${x(values.length - 1)},${y(lo)}`, fill: "#d1e5f0" }),
    svgEl("polyline", { points: pts.join(" "), fill: "none", stroke: "#0b5cad", "stroke-width": 1.5 }),
    svgEl("line", { x1: pad, y1: y(lo), x2: w - 4, y2: y(lo), stroke: "#57606a" }),
    svgEl("line", { x1: pad, y1: 4, x2: pad, y2: y(lo), stroke: "#57606a" }),
  );
  const label = (text, attrs) => {
    const t = svgEl("text", { "font-size": 9, fill: "#57606a", ...attrs });
    t.textContent = text;
    return t;
  };
  svg.append(label("0%", { x: pad, y: h - 4 }), label("100% of features", { x: w - 4, y: h - 4, "text-anchor": "end" }));
  return svg;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

/** The metrics of example `i`: each with its value or curve, and how to read it. */
export function drawMetrics(target, metrics, i) {
  const box = el("div", { class: "metrics" });
  for (const [name, value] of Object.entries(metrics)) {
    if (value === null || value === undefined) continue;
    const item = el("figure", { class: "metric", "data-metric": name });
    const head = el("figcaption");
    if (Array.isArray(value)) {
      head.append(el("b", {}, `${NAMES[name] || name} `), el("code", {}, name), ": ", el("span", { "data-value": String(value[i]) }, fmt(value[i])));
      item.append(head);
    } else {
      head.append(el("b", {}, `${NAMES[name] || name} `), el("code", {}, name), ": ", el("span", { "data-value": String(value.auc[i]) }, `area ${fmt(value.auc[i])}`));
      const curve = value.curve[i];
      const ends = el("p", { class: "hint" }, `output ${fmt(curve[0])} at the start, ${fmt(curve[curve.length - 1])} at the end`);
      item.append(head, curveChart(curve, NAMES[name] || name), ends);
    }
    item.append(el("p", { class: "hint" }, READ[name] || ""));
    box.append(item);
  }
  target.append(box);
}

export { el, flat, fmt };
