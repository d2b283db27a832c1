// Drawing one method's result into its region: image blocks, highlighted tokens, bars for
// tabular features, a prompt x output grid for generated text. Every drawn feature, token,
// cell or pixel block carries data-score, its attribution; colours follow the sign and
// colormap chosen, the scores never change.

const ANCHORS = {
  redblue: ["2166ac", "67a9cf", "d1e5f0", "f7f7f7", "fddbc7", "ef8a62", "b2182b"],
  viridis: ["440154", "3b528b", "21918c", "5ec962", "fde725"],
  grays: ["ffffff", "000000"],
};
const DIVERGING = { redblue: true, viridis: false, grays: false };
/** What each colormap's ends look like, for the legend's words. */
const ENDS = { redblue: ["blue", "red"], viridis: ["purple", "yellow"], grays: ["white", "black"] };

/** The legend of a view: a swatch of the colours shown, and in words which colour is positive
 * (raises the target's score) and which negative (lowers it). */
export function legend(sign, cmap) {
  const diverging = DIVERGING[cmap];
  const map = sign === "absolute" && diverging ? "grays" : cmap;
  const [low, high] = ENDS[map] || ["light", "dark"];
  const half = Math.floor(ANCHORS[map].length / 2);
  let anchors = ANCHORS[map];
  if (diverging && sign === "positive") anchors = anchors.slice(half);
  if (diverging && sign === "negative") anchors = anchors.slice(0, half + 1).reverse();
  const strong = diverging && sign === "negative" ? low : high;
  const words = {
    all: `${high}: positive, raises the target's score; ${low}: negative, lowers it; ${diverging ? "white" : "the middle"}: no effect`,
    absolute: `${high}: a large effect either way (the sign is not shown); ${low}: none`,
    positive: `${strong}: positive, raises the target's score (negative scores are not shown)`,
    negative: `${strong}: negative, lowers the target's score (positive scores are not shown)`,
  }[sign];
  const box = el("p", { class: "legend", role: "note", "aria-label": "Legend" });
  const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
  const stops = anchors.map((h) => `#${h}`);
  swatch.style.background = `linear-gradient(to right, ${stops.join(", ")})`;
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

/** Horizontal bars, one per feature, from the middle line. */
export function drawBars(target, scores, names, style) {
  const box = el("div", { class: "bars" });
  const p = palette(scores, style.sign, style.colormap);
  scores.forEach((s, i) => {
    const row = el("div", { class: "track", "data-score": String(s), title: `${names[i]}: ${fmt(s)}` });
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

/** Generated text: one row per output token, one column per prompt feature. */
export function drawGrid(target, rows, inputs, outputs, style) {
  const table = el("table", { class: "grid" });
  const head = el("tr");
  head.append(el("th"));
  inputs.forEach((t) => head.append(el("th", {}, t)));
  table.append(head);
  const p = palette(rows.flat(), style.sign, style.colormap);
  rows.forEach((row, i) => {
    const tr = el("tr");
    tr.append(el("th", {}, outputs[i] ?? String(i)));
    row.forEach((s, j) => {
      const td = el("td", { "data-score": String(s), title: `${outputs[i]} ← ${inputs[j]}: ${fmt(s)}` }, fmt(s));
      td.style.background = p.colour(s);
      tr.append(td);
    });
    table.append(tr);
  });
  target.append(table);
}

/** A deletion or insertion curve as a small line. */
function sparkline(values) {
  const w = 120;
  const h = 28;
  const lo = Math.min(...values);
  const hi = Math.max(...values);
  const pts = values
    .map((v, i) => `${((i / Math.max(1, values.length - 1)) * w).toFixed(1)},${(h - ((v - lo) / (hi - lo || 1)) * h).toFixed(1)}`)
    .join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("role", "img");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts);
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#0b5cad");
  svg.setAttribute("aria-label", `curve of ${values.length} points`);
  svg.append(line);
  return svg;
}

/** The §7.3 metrics of example `i`. */
export function drawMetrics(target, metrics, i) {
  const box = el("div", { class: "metrics" });
  for (const [name, value] of Object.entries(metrics)) {
    if (value === null || value === undefined) continue;
    const line = el("div");
    if (Array.isArray(value)) {
      line.append(el("b", {}, `${name}: `), fmt(value[i]));
    } else {
      line.append(el("b", {}, `${name}: `), `auc ${fmt(value.auc[i])} `, sparkline(value.curve[i]));
    }
    box.append(line);
  }
  target.append(box);
}

export { el, flat, fmt };
