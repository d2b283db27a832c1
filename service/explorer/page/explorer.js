// The explorer: pick a model, give it an input, pick methods, see why. Everything comes from the
// public HTTP API (GET /v1/models, GET /v1/methods, POST .../attributions, :predict,
// POST /v1/uploads); the page's state lives in its URL, so a link reproduces a result.

import { Problem, apiKey, call, setApiKey, tensorB64 } from "./api.js";
import { view as change } from "./change.js";
import { view as concepts } from "./concepts.js";
import { drawBars, drawGrid, drawImage, drawMetrics, drawTokens, el, flat, fmt, legend, shapeOf } from "./draw.js";
import { view as influence } from "./influence.js";

const $ = (id) => document.getElementById(id);
const PREFERRED = ["integrated_gradients", "saliency", "occlusion", "feature_ablation"];
const SAMPLES = {
  text: "a wonderful film",
  prompt: "The capital of France is",
  question: "Who wrote the film? ||| The film was written and directed by Agnes Varda in 1962.",
  "image-text": "a red flower in a field",
};
/** What a positive score does to the output, by the model's kind (the legend's words). */
function effect(m) {
  if (m.kind === "regression") return ["raises the predicted value", "lowers it"];
  if (m.kind === "semantic_segmentation") return ["raises the class's score over the region", "lowers it"];
  if (m.kind === "question_answering") return ["raises the answer's score", "lowers it"];
  if (m.kind === "object_detection") return ["raises the box's detection score", "lowers it"];
  if (m.kind === "image_text_similarity") return ["raises the image and text's similarity", "lowers it"];
  return ["raises the target's score", "lowers it"];
}
/** inputs longer than this stay out of the URL (an image goes by its upload id) */
const URL_INPUT_MAX = 6000;
/** more examples than this go as attribution jobs: progress shown, cancellable */
const JOB_EXAMPLES = 32;
/** the features a job's summary shows per label */
const SUMMARY_TOP = 8;

/** The questions the page answers: attributions (this file), and one module each for the
 * others (change.js, concepts.js, influence.js: offered, form, collect, run, draw). */
const EXPLAIN = {
  id: "explain",
  region: "Attributions",
  title: "Why this prediction?",
  about: "Scores each part of the input by how much it raised or lowered the model's answer.",
  offered: () => true,
};
const VIEWS = [EXPLAIN, change, concepts, influence];

const state = {
  view: EXPLAIN,
  viewForm: null, // the promise of the chosen view's form (concept sets load)
  viewBox: null, // the element holding it
  models: [],
  methods: new Map(),
  model: null,
  image: null, // {id, blob, pixels, shape, b64, width, height}
  running: null,
  drawn: [], // [{name, region, response}] of the last explain
  explained: 0,
  example: 0, // which example of the batch is shown (0-based; the control counts from 1)
  count: 1, // examples in the last explain
  predictions: null, // the model's outputs for them (:predict), when it has them
  drawMs: 0, // time spent drawing the last explain's answers
};

/** The target as a person reads it: the label's name where the model has labels. */
function labelOf(target, m = state.model) {
  const labels = m && m.output && m.output.labels;
  if (labels && Number.isInteger(target) && target >= 0 && target < labels.length) return labels[target];
  if (target && Array.isArray(target.box)) return `${labelOf(target.label, m)} at [${target.box.map((v) => Math.round(v)).join(", ")}]`;
  return JSON.stringify(target);
}

/** The Example control: one option per example of the batch, shown when there are several. */
function setExamples(n) {
  state.count = n;
  state.example = Math.min(state.example, n - 1);
  const select = $("example");
  select.replaceChildren(...Array.from({ length: n }, (_, i) => el("option", { value: String(i + 1) }, String(i + 1))));
  select.value = String(state.example + 1);
  $("example-of").textContent = `Example ${state.example + 1} of ${n}`;
  $("example-bar").hidden = n < 1; // "Example 1 of 1" too: which example is always said
}

function showExample(i) {
  state.example = i;
  $("example").value = String(i + 1);
  $("example-of").textContent = `Example ${i + 1} of ${state.count}`;
  const t0 = performance.now();
  drawPrediction(state.predictions);
  renderRowEditor(); // the row editor shows the example shown
  redraw();
  document.body.dataset.redrawMs = (performance.now() - t0).toFixed(3); // benchmarks.explorer
}

// -- errors ---------------------------------------------------------------------------------

function showError(err) {
  const box = $("alert");
  box.hidden = false;
  box.textContent = err instanceof Problem ? err.describe() : String(err.message || err);
}

function clearError() {
  const box = $("alert");
  box.hidden = true;
  box.textContent = "";
}

// -- the catalogue --------------------------------------------------------------------------

async function loadCatalog() {
  const [models, methods] = await Promise.all([call("/v1/models"), call("/v1/methods")]);
  state.models = models.models;
  state.methods = new Map(methods.methods.map((m) => [m.name, m]));
  $("model").replaceChildren(
    ...state.models.map((m) => el("option", { value: m.id }, m.ready ? m.id : `${m.id} (${m.state})`)),
  );
}

/** What form a model's input takes in the page. */
/** A generative language model (a prompt in, an answer attributed)? */
function isLM(m) {
  return m.kind === "causal_lm" || m.kind === "seq2seq_lm";
}

function formOf(m) {
  if (isLM(m)) return "prompt";
  if (m.kind === "question_answering") return "question";
  if (m.kind === "image_text_similarity") return "image-text";
  if (m.tokenizer) return "text";
  if (m.images) return "encoded-image";
  if (m.inputs.length === 1) {
    const shape = m.inputs[0].shape;
    if (shape.length === 4 && [1, 3].includes(shape[1]) && shape[2] && shape[3]) return "image";
    if (shape.length === 2 && shape[1]) return "row";
  }
  return "json";
}

function chooseModel(id, preset = {}) {
  const m = state.models.find((x) => x.id === id) || state.models[0];
  if (!m) return;
  state.model = m;
  $("model").value = m.id;
  const form = formOf(m);
  const labels = m.output.labels.length ? ` Labels: ${m.output.labels.join(", ")}.` : "";
  $("model-about").textContent = `${m.description || m.kind}${labels}`;
  const wanted = preset.methods || PREFERRED.filter((x) => m.methods.includes(x)).slice(0, 2);
  if (!wanted.length && m.methods.length) wanted.push(m.methods[0]);
  renderMethods(m, wanted);
  renderParams(preset.params || {});
  renderViews(m, preset.view, preset.viewParams);
  $("image-field").hidden = !(form === "image" || form === "encoded-image" || form === "image-text");
  $("units-field").hidden = form !== "text"; // words, sentences, paragraphs of a text
  state.image = null;
  $("input").value = preset.input ?? (SAMPLES[form] || (form === "row" ? JSON.stringify([startRow(m)]) : ""));
  $("input-hint").textContent = {
    text: "One text per line; a pair as: premise ||| hypothesis. JSON works too.",
    question: "One example per line: question ||| context. JSON works too.",
    "image-text": "Choose an image, and write texts to match it with (one per line).",
    prompt: 'A prompt (every token a feature), or JSON {"prompt": "... {} ...", "features": [...]}.',
    image: "Choose an image, or paste the inputs as JSON.",
    "encoded-image": "Choose an image, or paste the inputs as JSON.",
    row: "Edit the row below, or paste JSON (one list per example).",
    json: "The attributions route's inputs, as JSON.",
  }[form];
  const targets = {
    prompt: ["generated", "The answer to attribute; empty: the model generates one."],
    question: ["span", "start, end or span (the answer's start plus end score; the default)."],
    regression: ["(none)", "A regression predicts one value: there is nothing to choose."],
    semantic_segmentation: ["a class", "A class (name or number): its score summed over the pixels predicted as it."],
    image_text_similarity: ["(none)", "The pair's similarity is attributed: there is nothing to choose."],
    object_detection: ["top detection", 'Empty: each image\'s top detection; or {"box": [x1, y1, x2, y2], "label": "car"}.'],
  }[["regression", "semantic_segmentation", "object_detection", "image_text_similarity"].includes(m.kind) ? m.kind : form] || ["predicted", "Empty: each example's predicted class."];
  $("target").placeholder = targets[0];
  $("target-hint").textContent = targets[1];
  renderRowEditor();
}

/** What each family of methods (GET /v1/methods' kind) is called, in the order shown. */
const FAMILIES = {
  gradient: "Gradient methods",
  perturbation: "Perturbation methods",
  layer: "Layer methods (a layer's units)",
  neuron: "Neuron methods (one neuron's inputs)",
};

/** The model's methods, every one in sight: grouped by family, each group headed by its name
 * and count, the whole list by its count (a list in a scroll box hid most of them). */
function renderMethods(m, wanted) {
  const groups = new Map();
  for (const name of m.methods) {
    const kind = state.methods.get(name)?.kind;
    const family = kind in FAMILIES ? kind : "other";
    if (!groups.has(family)) groups.set(family, []);
    groups.get(family).push(name);
  }
  const order = [...Object.keys(FAMILIES), "other"].filter((f) => groups.has(f));
  $("methods-count").textContent = `(${m.methods.length})`;
  $("method-list").replaceChildren(
    ...order.map((family) => {
      const names = groups.get(family);
      const head = el("p", { class: "group-name", id: `methods-${family}` }, `${FAMILIES[family] || "Other methods"} (${names.length})`);
      const group = el("div", { class: "method-group", role: "group", "aria-labelledby": head.id, "data-family": family });
      const boxes = el("div", { class: "choices" });
      for (const name of names) {
        const box = el("input", { type: "checkbox", name: "method", value: name });
        box.checked = wanted.includes(name);
        box.addEventListener("change", () => renderParams());
        const label = el("label");
        label.append(box, ` ${name}`);
        boxes.append(label);
      }
      group.append(head, boxes);
      return group;
    }),
  );
}

/** The views as tabs named by what they show (Attributions, Robustness, Concepts, Influence),
 * each described by the question it answers; those this model cannot answer disabled, saying
 * why. Arrow keys, Home and End move between the tabs (the selected one is in the tab order). */
function renderViews(m, wanted, given) {
  const list = $("view-list");
  list.replaceChildren();
  const chosen = VIEWS.find((v) => v.id === wanted && v.offered(m) === true) || EXPLAIN;
  for (const v of VIEWS) {
    const ok = v.offered(m);
    const name = el("span", { id: `view-${v.id}-name`, class: "view-name" }, v.region);
    const about = ok === true ? v.title : `${v.title} (not for this model: ${ok})`;
    const question = el("span", { id: `view-${v.id}-question`, class: "view-question" }, about);
    const tab = el("button", {
      type: "button", role: "tab", id: `view-${v.id}`, "data-view-id": v.id, "aria-controls": "results",
      "aria-labelledby": name.id, "aria-describedby": question.id, "aria-selected": "false", tabindex: "-1",
    });
    tab.append(name, question);
    if (ok !== true) {
      tab.disabled = true;
      tab.title = `Not for this model: ${ok}`;
    }
    tab.addEventListener("click", () => {
      if (state.view === v) return;
      chooseView(v, m, {});
      saveURL();
    });
    list.append(tab);
  }
  chooseView(chosen, m, given || {});
}

/** Keyboard moves between the view tabs: the next or previous enabled one is chosen. */
function moveTab(event) {
  const tabs = [...$("view-list").querySelectorAll('[role="tab"]:not([disabled])')];
  const at = tabs.indexOf(document.activeElement);
  if (at < 0) return;
  const to = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: tabs.length - 1 }[event.key];
  if (to === undefined) return;
  event.preventDefault();
  const tab = tabs[(to + tabs.length) % tabs.length];
  tab.focus();
  tab.click();
}

/** Show the view's own controls, and the page's shared ones it uses. */
function chooseView(v, m, given) {
  state.view = v;
  for (const tab of $("view-list").querySelectorAll('[role="tab"]')) {
    const on = tab.dataset.viewId === v.id;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
  }
  $("view-about").textContent = v.about;
  $("results").setAttribute("aria-label", v.region); // Attributions, Robustness, Concepts, Influence
  for (const node of document.querySelectorAll("[data-view]")) node.hidden = !node.dataset.view.split(" ").includes(v.id);
  // a fresh box each time: a form still loading for another view or model fills a box that is
  // no longer on the page
  const box = el("div");
  $("view-form").replaceChildren(box);
  $("view-form").hidden = v === EXPLAIN;
  state.viewBox = box;
  state.viewForm =
    v === EXPLAIN
      ? null
      : Promise.resolve(v.form(box, m, given)).then(
          () => state.viewBox === box && saveURL(),
          (err) => state.viewBox === box && showError(err),
        );
}

/** A starting row: ones (all zeros would sit on the usual baseline, and explain nothing). */
function startRow(m) {
  return new Array(m.inputs[0].shape[1]).fill(1);
}

/** What a parameter is called for a person (its wire name is shown beside it). */
const HUMAN = {
  n_steps: "steps along the path",
  sliding_window_shapes: "window shape",
  strides: "window step",
  n_samples: "samples",
  baselines: "baseline",
  multiply_by_inputs: "multiply by the input",
  delta_tolerance: "tolerance for automatic steps",
  approximation_method: "integration rule",
  stdevs: "noise standard deviation",
  abs: "absolute values",
  layer: "layer",
  attribute_to_layer_input: "at the layer's input",
  interpolate_to_input: "resize to the input",
  feature_mask: "feature groups",
  perturbations_per_eval: "perturbations per forward",
  internal_batch_size: "rows per forward",
  show_progress: "show progress",
};

/** A value for a required parameter, from the model: occlusion's window an eighth of each
 * spatial side of the input (a whole channel stack), one feature or token elsewhere; a layer
 * method's layer the model's first. */
function suggested(param, m) {
  if (!m) return undefined;
  if (param === "layer" && m.layers && m.layers.length) return m.layers[0];
  if (param === "sliding_window_shapes") {
    const dims = (m.inputs[0] && m.inputs[0].shape ? m.inputs[0].shape.slice(1) : []).map((d) => d || 1);
    if (dims.length === 3) return [dims[0], Math.max(1, Math.ceil(dims[1] / 8)), Math.max(1, Math.ceil(dims[2] / 8))];
    return dims.map(() => 1);
  }
  return undefined;
}

/** A form of each chosen method's parameters, from its JSON schema (GET /v1/methods). */
function renderParams(preset) {
  const given = preset || collectParams(true);
  const box = $("params");
  box.replaceChildren();
  for (const name of chosenMethods()) {
    const info = state.methods.get(name);
    const props = info ? info.params.properties || {} : {};
    const required = new Set(info ? info.params.required || [] : []);
    if (!Object.keys(props).length) continue;
    const set = el("fieldset", { "data-method": name });
    set.append(el("legend", {}, `${name} parameters`));
    const grid = el("div", { class: "params" });
    for (const [param, schema] of Object.entries(props)) {
      const id = `p-${name}-${param}`;
      const human = HUMAN[param] || param.replace(/_/g, " ");
      const label = el("label", { for: id }, `${human}${required.has(param) ? " *" : ""} `);
      label.append(el("code", {}, param)); // the wire name, as the API takes it
      const control = paramControl(param, schema, id, `${name} ${param}`);
      let value = (given[name] || {})[param];
      if (value === undefined && required.has(param)) value = suggested(param, state.model);
      if (value !== undefined) setControl(control, value);
      grid.append(label, control);
    }
    set.append(grid);
    box.append(set);
  }
  offerMetrics();
}

function paramControl(param, schema, id, name) {
  const attrs = { id, "aria-label": name, "data-param": param };
  if (param === "layer" && state.model && state.model.layers.length) {
    const select = el("select", attrs);
    select.append(el("option", { value: "" }, "(default)"), ...state.model.layers.map((l) => el("option", { value: l }, l)));
    return select;
  }
  if (schema.type === "boolean") {
    const select = el("select", attrs);
    const d = schema.default === undefined ? "" : String(schema.default);
    select.append(el("option", { value: "" }, `(default${d ? `: ${d}` : ""})`), el("option", { value: "true" }, "true"), el("option", { value: "false" }, "false"));
    return select;
  }
  if (Array.isArray(schema.enum)) {
    const select = el("select", attrs);
    select.append(el("option", { value: "" }, `(default: ${schema.default ?? "none"})`), ...schema.enum.map((v) => el("option", { value: String(v) }, String(v))));
    return select;
  }
  const input = el("input", { ...attrs, type: "text", placeholder: schema.default === undefined || schema.default === null ? "" : JSON.stringify(schema.default) });
  if (schema.description) input.title = schema.description;
  return input;
}

function setControl(control, value) {
  control.value = typeof value === "string" ? value : JSON.stringify(value);
}

/** Each chosen method's params that were given (values as JSON where they parse). */
function collectParams(lenient = false) {
  const out = {};
  for (const set of $("params").querySelectorAll("fieldset[data-method]")) {
    const method = set.dataset.method;
    for (const control of set.querySelectorAll("[data-param]")) {
      const raw = control.value.trim();
      if (!raw) continue;
      let value = raw;
      if (control.tagName === "INPUT" || raw === "true" || raw === "false") {
        try {
          value = JSON.parse(raw);
        } catch (err) {
          if (!lenient && /^[[{]/.test(raw)) throw new Error(`${method} ${control.dataset.param} is not valid JSON: ${err.message}`);
        }
      }
      (out[method] ||= {})[control.dataset.param] = value;
    }
  }
  return out;
}

function chosenMethods() {
  return [...document.querySelectorAll('input[name="method"]:checked')].map((x) => x.value);
}

/** The metrics ticked and offered (a box is disabled when no chosen method can take it). */
function chosenMetrics() {
  return [...document.querySelectorAll('input[name="metric"]:checked:not(:disabled)')].map((x) => x.value);
}

/** Why `metric` cannot be computed with `method`'s attributions on model `m` (null: it can),
 * the server's own rules (service/kinds/metrics.py): metrics need a model's predictions, score
 * attributions of the inputs (not a layer's or a neuron's), and the noisy ones perturb the
 * inputs, which must be numbers (not token ids). */
function metricRefusal(metric, method, m) {
  if (!m.predicts) return "this model gives no predictions";
  const kind = state.methods.get(method)?.kind;
  if (kind === "layer" || kind === "neuron") return `${method} attributes to a ${kind}; metrics score attributions of the inputs`;
  const numbers = !m.tokenizer && !isLM(m) && m.inputs.every((i) => /^(float|bfloat)/.test(i.dtype));
  if (NOISY.includes(metric) && !numbers) return `${metric} adds noise to the inputs, which are not numbers on this model`;
  return null;
}
const NOISY = ["infidelity", "sensitivity_max"];

/** Each metric box enabled when a chosen method can take it, else disabled, saying why. */
function offerMetrics() {
  const m = state.model;
  if (!m) return;
  const methods = chosenMethods();
  const off = new Map(); // why -> the metrics it holds back
  const note = (why, metric) => off.set(why, [...(off.get(why) || []), metric]);
  for (const box of document.querySelectorAll('input[name="metric"]')) {
    const why = methods.map((x) => metricRefusal(box.value, x, m));
    const none = methods.length ? why.every(Boolean) : !m.predicts;
    const reason = why.find(Boolean) || "this model gives no predictions";
    box.disabled = none;
    box.closest("label").title = none ? `Not offered: ${reason}` : "";
    if (none) note(reason, box.value);
    else if (box.checked) why.forEach((w, k) => w && note(`not with ${methods[k]} (${w})`, box.value));
  }
  const said = [...off].map(([why, metrics]) => `${metrics.join(", ")}: ${why}`);
  $("metrics-hint").textContent = said.length ? `Not offered: ${said.join("; ")}.` : "";
}

/** The metrics to ask with `method`: those ticked that it can take. */
function chosenMetricsFor(method) {
  return chosenMetrics().filter((x) => !metricRefusal(x, method, state.model));
}

// -- inputs ---------------------------------------------------------------------------------

/** One number field per feature of the row of the example shown (the Example control), so
 * that what is edited is what is displayed. */
function renderRowEditor() {
  const box = $("row-editor");
  const m = state.model;
  const form = m ? formOf(m) : "json";
  box.hidden = form !== "row";
  box.replaceChildren();
  if (box.hidden) return;
  const rows = safeRows(m);
  const k = Math.max(0, Math.min(state.example, rows.length - 1));
  const row = Array.isArray(rows[k]) ? rows[k] : startRow(m);
  box.dataset.row = String(k + 1);
  const names = m.inputs[0].features || row.map((_, i) => `${m.inputs[0].name}[${i}]`);
  box.append(el("p", { class: "hint row-of", id: "row-of" }, rows.length > 1 ? `Editing row ${k + 1} of ${rows.length} (the example shown)` : "Editing the row"));
  names.forEach((name, i) => {
    const id = `feature-${i}`;
    const input = el("input", { id, type: "number", step: "any", value: String(row[i] ?? 0) });
    input.addEventListener("input", () => {
      const now = safeRows(m);
      if (!Array.isArray(now[k])) now[k] = startRow(m);
      now[k][i] = Number(input.value);
      $("input").value = JSON.stringify(now);
    });
    box.append(el("label", { for: id }, name), input);
  });
}

function safeRows(m) {
  try {
    const rows = JSON.parse($("input").value);
    if (Array.isArray(rows) && Array.isArray(rows[0])) return rows;
  } catch {
    /* the editor starts a fresh row */
  }
  return [startRow(m)];
}

function parseJSON(text, what = "Input") {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`${what} is not valid JSON: ${err.message}`);
  }
}

/** The attributions route's inputs for what was given. */
function buildInputs() {
  const m = state.model;
  const form = formOf(m);
  const text = $("input").value.trim();
  if ((form === "image" || form === "encoded-image") && state.image && !text) {
    return form === "image" ? tensorB64(state.image.pixels, state.image.shape) : [{ image: state.image.b64 }];
  }
  if (!text) throw new Error(form === "image" || form === "encoded-image" ? "Choose an image or give the inputs as JSON." : "Give an input.");
  if (form === "text" && !/^[[{]/.test(text)) {
    return text.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => (l.includes(" ||| ") ? l.split(" ||| ", 2) : l));
  }
  if (form === "image-text" && !/^[[{]/.test(text)) {
    if (!state.image) throw new Error("Choose an image to match the texts with.");
    return text.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => ({ image: state.image.b64, text: l }));
  }
  if (form === "question" && !/^[[{]/.test(text)) {
    return text.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => {
      const [question, context] = l.split(" ||| ", 2);
      return context === undefined ? { question } : { question, context };
    });
  }
  if (form === "prompt" && !text.startsWith("{")) return { prompt: text, features: null };
  return parseJSON(text);
}

function buildTarget() {
  const raw = $("target").value.trim();
  const form = formOf(state.model);
  const segments = state.model.kind === "semantic_segmentation";
  if (!raw) {
    if (form === "prompt" || form === "question" || form === "image-text" || state.model.kind === "object_detection") return null;
    if (segments) throw new Error("Name a class to explain: its score over the pixels predicted as it.");
    return state.model.output.shape.every((d) => d === 1) ? null : "predicted";
  }
  if (/^[[{]/.test(raw)) return parseJSON(raw, "Target");
  const one = /^-?\d+$/.test(raw) ? Number(raw) : raw;
  return segments ? { class: one, region: "predicted" } : one;
}

/** KServe V1 instances for the same inputs (the prediction beside the explanations). */
function instancesOf(inputs) {
  if (Array.isArray(inputs)) return inputs;
  if (inputs && inputs.b64 && state.image) return [nested(state.image.pixels, state.image.shape.slice(1))];
  return null;
}

function nested(values, shape) {
  if (shape.length === 1) return Array.from(values.subarray(0, shape[0]));
  const step = shape.slice(1).reduce((a, b) => a * b, 1);
  return Array.from({ length: shape[0] }, (_, i) => nested(values.subarray(i * step, (i + 1) * step), shape.slice(1)));
}

// -- images ---------------------------------------------------------------------------------

async function takeImage(blob, uploadId) {
  const m = state.model;
  const id = uploadId || (await call("/v1/uploads", { method: "POST", raw: { data: blob, type: blob.type || "image/png" } })).id;
  const bitmap = await createImageBitmap(blob);
  const bytes = new Uint8Array(await blob.arrayBuffer());
  let b64 = "";
  for (let i = 0; i < bytes.length; i += 0x8000) b64 += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  const image = { id, blob, bitmap, b64: btoa(b64), width: bitmap.width, height: bitmap.height };
  if (formOf(m) === "image") {
    // a built-in tensor model: scaled to [0, 1] (pixel / 255), resized to the model's input
    const [, channels, h, w] = m.inputs[0].shape;
    const canvas = el("canvas", { width: String(w), height: String(h) });
    const ctx = canvas.getContext("2d");
    ctx.drawImage(bitmap, 0, 0, w, h);
    const rgba = ctx.getImageData(0, 0, w, h).data;
    const pixels = new Float32Array(channels * h * w);
    for (let p = 0; p < h * w; p++) {
      if (channels === 1) pixels[p] = (rgba[4 * p] + rgba[4 * p + 1] + rgba[4 * p + 2]) / (3 * 255);
      else for (let c = 0; c < 3; c++) pixels[c * h * w + p] = rgba[4 * p + c] / 255;
    }
    Object.assign(image, { pixels, shape: [1, channels, h, w] });
  }
  state.image = image;
  if (formOf(m) !== "image-text") $("input").value = ""; // the texts stay: they go with it
  document.body.dataset.image = id;
}

/** A canvas of the input image at the map's size, to draw the blocks over: the model's own
 * pixels for a tensor model, the photo itself (scaled to the map) for one with an image
 * processor, whose resizing the page cannot see. */
function pictureFor(map) {
  if (!state.image) return null;
  if (!state.image.pixels) {
    const shape = shapeOf(map);
    const [h, w] = shape.slice(-2);
    if (!state.image.bitmap || shape.length < 2) return null;
    const canvas = el("canvas", { width: String(w), height: String(h), "aria-hidden": "true" });
    canvas.getContext("2d").drawImage(state.image.bitmap, 0, 0, w, h);
    return canvas;
  }
  const [, channels, h, w] = state.image.shape;
  const shape = shapeOf(map);
  if (shape[shape.length - 1] !== w || shape[shape.length - 2] !== h) return null;
  const canvas = el("canvas", { width: String(w), height: String(h), "aria-hidden": "true" });
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(w, h);
  const px = state.image.pixels;
  for (let p = 0; p < h * w; p++) {
    for (let c = 0; c < 3; c++) img.data[4 * p + c] = 255 * px[(channels === 1 ? 0 : c) * h * w + p];
    img.data[4 * p + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  return canvas;
}

// -- results --------------------------------------------------------------------------------

function style() {
  return { sign: $("sign").value, colormap: $("colormap").value };
}

function pending(name) {
  const region = el("section", { class: "result pending", "aria-label": name, "aria-busy": "true" });
  region.append(el("h2", {}, name), el("p", {}, "computing…"));
  return region;
}

/** The class the model gave example i before any change (from :predict), or null. */
function before(i) {
  const p = state.predictions;
  if (!p || !p[i]) return null;
  const row = flat(p[i]);
  return row.length > 1 ? row.indexOf(Math.max(...row)) : null;
}

/** A view's answer (change, concepts, influence), at the example shown. */
function drawView(region, name, res, d) {
  region.classList.remove("pending");
  region.removeAttribute("aria-busy");
  region.replaceChildren(el("h2", {}, name));
  const rows = res.predicted || res.proponents || [null];
  const i = d.view.perExample === false ? 0 : Math.min(state.example, state.count - 1, rows.length - 1);
  const facts = el("p", { class: "facts" });
  if (res.timing_ms) facts.append(el("span", {}, `${fmt(res.timing_ms.compute)} ms compute, ${fmt(res.timing_ms.total)} ms total`));
  region.append(facts);
  region.dataset.example = String(i + 1);
  const { m, image, inputs, target } = d.context; // as they were when asked
  try {
    d.view.draw(region, res, i, { m, inputs, target, labelOf: (t) => labelOf(t, m), look: style(), before, image });
  } catch (err) {
    drawFailure(region, name, err);
    return;
  }
  region.dataset.state = "done";
}

function drawResult(region, name, res, d) {
  if (d && d.view) return drawView(region, name, res, d);
  region.classList.remove("pending");
  region.removeAttribute("aria-busy");
  region.replaceChildren(el("h2", {}, name));
  const facts = el("p", { class: "facts" });
  const add = (text) => facts.append(el("span", {}, text));
  const n = res.target && !res.token_attr ? res.target.length : 1;
  const i = Math.min(state.example, n - 1); // the example shown
  if (res.requested_method && res.requested_method !== res.method) {
    // a token model: ids have no gradient, so the method ran at the embedding layer
    const where = res.attributed_layer ? ` at ${res.attributed_layer}` : "";
    region.append(el("p", { class: "hint rewritten" }, `Ran ${res.method}${where}: this model takes token ids, which have no gradient, so ${res.requested_method} is computed at the token embeddings and summed over each token's vector.`));
  }
  if (res.answers && res.answers[i]) add(`answer “${res.answers[i].text}”`);
  if (res.detections && res.detections[i]) add(`${res.detections[i].scores.length} detections`);
  if (res.target) add(`target ${res.token_attr ? JSON.stringify(res.target[0]) : labelOf(res.target[i])}`);
  if (res.outputs !== null && res.outputs !== undefined) add(`output ${fmt(flat(res.outputs)[res.token_attr ? 0 : i])}`);
  if (res.convergence_delta) add(`delta ${fmt(flat(res.convergence_delta)[i])}`);
  // Shapley-family answers: where the attributions start from (base + sum = output)
  if (res.base_values !== null && res.base_values !== undefined) add(`base value ${fmt(flat(res.base_values)[i])}`);
  if (res.standard_error) add(`largest standard error ${fmt(Math.max(...flat(res.standard_error[i] ?? res.standard_error).map(Math.abs)))}`);
  if (res.samples) add(`${res.samples.n_samples} samples, ${res.samples.evaluations} evaluations`);
  add(`${fmt(res.timing_ms.compute)} ms compute, ${fmt(res.timing_ms.total)} ms total`);
  region.append(facts);
  region.dataset.example = String(i + 1);
  const look = style();
  const m = state.model;
  if (res.attributions && res.attributions.image && res.attributions.text) {
    // an image and a text: the pair's similarity on both at once
    const one = res.attributions.image[i];
    drawImage(region, one, pictureFor(one), look);
    drawTokens(region, res.attributions.text[i], res.tokens[i], look);
  } else if (res.token_attr) {
    drawGrid(region, res.token_attr, res.input_tokens, res.output_tokens, look);
  } else if (res.tokens) {
    drawTokens(region, res.attributions[i], res.tokens[i], look);
    const answer = res.answers && res.answers[i];
    if (answer) { // the answer's tokens underlined (question and context both shown)
      const spans = region.querySelectorAll(".tokens span");
      for (let k = answer.tokens[0]; k <= answer.tokens[1]; k++) spans[k]?.classList.add("answer");
    }
  } else {
    const multi = m.inputs.length > 1 && Array.isArray(res.attributions) && res.attributions.length === m.inputs.length && !Array.isArray(res.params.layer);
    const parts = multi ? res.attributions : [res.attributions];
    parts.forEach((part, k) => {
      const one = part[i];
      const shape = shapeOf(one);
      if (multi) region.append(el("p", { class: "hint" }, m.inputs[k].name));
      if (shape.length === 3 || (shape.length === 2 && ["image", "encoded-image"].includes(formOf(m)))) {
        drawImage(region, one, pictureFor(one), look);
      } else {
        const scores = flat(one).slice(0, 512);
        const features = shape.length === 1 && !res.params.layer ? m.inputs[k].features : null;
        const names = features || scores.map((_, i) => `${shape.length === 1 && !res.params.layer ? m.inputs[k].name : res.method}[${i}]`);
        drawBars(region, scores, names, look);
      }
    });
  }
  region.append(legend(look.sign, look.colormap, ...effect(m)));
  if (res.metrics) drawMetrics(region, res.metrics, i);
  if (res.summary) drawSummary(region, res.summary, look);
  if (d && d.unmeasured && d.unmeasured.length) region.append(el("p", { class: "hint unmeasured" }, `Metrics not computed here: ${d.unmeasured.join("; ")}.`));
  region.dataset.state = "done";
}

/** A job's summary (GET /v1/jobs/{id}/summary): per label, the features of largest mean
 * |attribution| over its examples, largest first (at most SUMMARY_TOP, three labels). */
function drawSummary(region, summary, look) {
  const box = el("section", { class: "summary", "aria-label": "Across the examples" });
  box.append(el("h3", {}, `Across the ${summary.examples} examples (mean |attribution|)`));
  const labels = Object.entries(summary.labels).sort((a, b) => b[1].examples - a[1].examples).slice(0, 3);
  for (const [label, part] of labels) {
    const top = part.ranking.slice(0, SUMMARY_TOP);
    box.append(el("p", { class: "hint" }, `${label}: ${part.examples} example${part.examples === 1 ? "" : "s"}`));
    drawBars(box, top.map((k) => part.values[k]), top.map((k) => String(part.features[k])), look);
  }
  for (const bar of box.querySelectorAll("[data-score]")) { // not the example's scores
    bar.dataset.summary = bar.dataset.score;
    delete bar.dataset.score;
  }
  region.append(box);
}

function drawFailure(region, name, err) {
  region.classList.remove("pending");
  region.removeAttribute("aria-busy");
  region.replaceChildren(el("h2", {}, name), el("p", { class: "hint" }, err instanceof Problem ? err.describe() : String(err.message || err)));
  region.dataset.state = "failed";
}

function drawPrediction(predictions) {
  state.predictions = predictions;
  const box = $("prediction");
  box.replaceChildren();
  if (!predictions) return;
  const i = Math.min(state.example, predictions.length - 1);
  const row = flat(predictions[i]);
  const labels = state.model.output.labels;
  const which = state.count > 1 ? ` of example ${i + 1}` : "";
  const kind = state.model.kind;
  if (kind === "image_text_similarity") {
    box.append(el("h2", {}, `Prediction${which}`), el("p", { class: "predicted-value" }, `Similarity: ${fmt(row[0])}`));
    return;
  }
  if (kind === "regression") {
    box.append(el("h2", {}, `Prediction${which}`), el("p", { class: "predicted-value" }, `Predicted value: ${fmt(row[0])}`));
    return;
  }
  if (["question_answering", "semantic_segmentation", "object_detection"].includes(kind)) return; // not a class
  // multi-label: each label its own sigmoid; predicted, the labels over 0.5
  const multi = kind === "multi_label_classification";
  const probs = multi ? row.map((v) => 1 / (1 + Math.exp(-v))) : row.every((v) => v >= 0 && v <= 1) && Math.abs(row.reduce((a, b) => a + b, 0) - 1) < 1e-3 ? row : softmax(row);
  const order = probs.map((p, i) => [p, i]).sort((a, b) => b[0] - a[0]).slice(0, 5);
  const grid = el("div", { class: "probs" });
  for (const [p, i] of order) {
    const track = el("div", { class: "track" });
    const bar = el("div", { class: "bar" });
    bar.style.width = `${(100 * p).toFixed(1)}%`;
    track.append(bar);
    grid.append(el("span", {}, labels[i] ?? String(i)), track, el("span", {}, `${(100 * p).toFixed(1)}%`));
  }
  box.append(el("h2", {}, `Prediction${which}`), grid);
  if (multi) {
    const over = probs.map((p, k) => [p, k]).filter(([p]) => p > 0.5).map(([, k]) => labels[k] ?? String(k));
    box.append(el("p", { class: "predicted-labels" }, over.length ? `Labels over 0.5: ${over.join(", ")}` : "No label over 0.5"));
  }
}

function softmax(row) {
  const top = Math.max(...row);
  const e = row.map((v) => Math.exp(v - top));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / sum);
}

function redraw() {
  for (const d of state.drawn) if (d.response) drawResult(d.region, d.name, d.response, d);
  saveURL();
}

// -- the URL --------------------------------------------------------------------------------

function saveURL() {
  const q = new URLSearchParams();
  if (state.model) q.set("model", state.model.id);
  if (state.view !== EXPLAIN) {
    q.set("view", state.view.id);
    const asked = state.viewBox ? state.view.collect(state.viewBox) : undefined;
    if (asked !== undefined) q.set("ask", JSON.stringify(asked)); // undefined: still loading
  }
  q.set("methods", chosenMethods().join(","));
  const given = collectParams(true);
  if (Object.keys(given).length) q.set("params", JSON.stringify(given));
  const text = $("input").value;
  if (state.image && !text.trim()) q.set("upload", state.image.id);
  else if (text.length <= URL_INPUT_MAX) q.set("input", text);
  if ($("target").value.trim()) q.set("target", $("target").value.trim());
  if (chosenMetrics().length) q.set("metrics", chosenMetrics().join(","));
  q.set("sign", $("sign").value);
  q.set("colormap", $("colormap").value);
  if (!$("units-field").hidden && $("units").value !== "token") q.set("units", $("units").value);
  history.replaceState(null, "", `#${q}`);
}

async function fromURL() {
  const q = new URLSearchParams(location.hash.slice(1));
  if (!q.has("model")) return false;
  const preset = {
    methods: q.get("methods") ? q.get("methods").split(",").filter(Boolean) : undefined,
    params: q.get("params") ? parseJSON(q.get("params"), "The link's params") : {},
    input: q.get("input") ?? undefined,
    view: q.get("view") || undefined,
    viewParams: q.get("ask") ? parseJSON(q.get("ask"), "The link's question") : undefined,
  };
  for (const [id, key] of [["sign", "sign"], ["colormap", "colormap"], ["target", "target"], ["units", "units"]]) {
    if (q.has(key)) $(id).value = q.get(key);
  }
  const metrics = (q.get("metrics") || "").split(",");
  for (const box of document.querySelectorAll('input[name="metric"]')) box.checked = metrics.includes(box.value);
  chooseModel(q.get("model"), preset);
  if (q.get("upload")) {
    const blob = await call(`/v1/uploads/${encodeURIComponent(q.get("upload"))}`);
    await takeImage(blob, q.get("upload"));
  }
  return Boolean(q.get("input") || q.get("upload"));
}

// -- explain --------------------------------------------------------------------------------

async function explain(event) {
  if (event) event.preventDefault();
  clearError();
  const m = state.model;
  const v = state.view;
  const methods = v === EXPLAIN ? chosenMethods() : [v.title];
  let inputs;
  let target;
  let given;
  try {
    if (!m) throw new Error("Choose a model.");
    if (!methods.length) throw new Error("Choose at least one method.");
    inputs = buildInputs();
    target = buildTarget();
    if (v === EXPLAIN) given = collectParams();
    else {
      await state.viewForm;
      if (state.view !== v || state.model !== m) return; // the question or model changed meanwhile
      given = v.collect(state.viewBox);
    }
  } catch (err) {
    showError(err);
    return;
  }
  saveURL();
  state.drawMs = 0;
  const controller = new AbortController();
  state.running = controller;
  $("explain").disabled = true;
  $("cancel").disabled = false;
  $("status").textContent = "computing…";
  state.example = 0;
  setExamples(isLM(m) || v.perExample === false ? 1 : Math.max(1, countOf(inputs)));
  renderRowEditor();
  const started = performance.now();
  state.drawn = methods.map((name) => ({ name, region: pending(name), response: null }));
  $("results").replaceChildren(...state.drawn.map((d) => d.region));
  $("results").scrollIntoView({ block: "nearest" }); // where the answers will come
  let failed = null;
  let failures = 0;
  const asJob = countOf(inputs) > JOB_EXAMPLES && !isLM(m) && v === EXPLAIN;
  const instances = m.predicts && formOf(m) !== "prompt" ? instancesOf(inputs) : null;
  const predicted = instances
    ? call(`/v1/models/${encodeURIComponent(m.id)}:predict`, { method: "POST", body: { instances }, signal: controller.signal })
        .then((r) => drawPrediction(r.predictions))
        .catch(() => drawPrediction(null))
    : Promise.resolve(drawPrediction(null));
  const asked = v === EXPLAIN ? state.drawn : [];
  const jobs = asked.map(async (d) => {
    const body = { method: d.name, inputs, target, params: given[d.name] || {} };
    if (state.methods.get(d.name)?.returns_delta && !isLM(m)) body.return_convergence_delta = true;
    // a text's units, for the methods that perturb groups of features (the rest score tokens)
    const takesMask = "feature_mask" in (state.methods.get(d.name)?.params?.properties || {});
    if (!$("units-field").hidden && $("units").value !== "token" && takesMask) body.units = $("units").value;
    const scale = $("output").value; // what is attributed: the raw output or a probability scale
    if (scale !== "raw" && !isLM(m)) body.output = scale;
    const metrics = asJob ? [] : chosenMetricsFor(d.name);
    if (metrics.length) body.metrics = Object.fromEntries(metrics.map((x) => [x, {}]));
    // a metric this method cannot take is not asked of it (the region says why)
    d.unmeasured = chosenMetrics().filter((x) => !metrics.includes(x)).map((x) => (asJob ? `${x}: not computed in a job` : `${x}: ${metricRefusal(x, d.name, m)}`));
    try {
      d.response = asJob
        ? await runJob(m, body, d.region, controller.signal)
        : await call(`/v1/models/${encodeURIComponent(m.id)}/attributions`, { method: "POST", body, signal: controller.signal });
      timed(() => drawResult(d.region, d.name, d.response, d));
    } catch (err) {
      failed ||= err;
      failures += 1;
      drawFailure(d.region, d.name, err);
    }
  });
  if (v !== EXPLAIN) {
    const d = state.drawn[0];
    Object.assign(d, { view: v, context: { inputs, target, m, image: state.image } });
    d.region.classList.add("wide"); // one answer: the results' whole width
    jobs.push(
      (async () => {
        try {
          d.response = await v.run({ m, inputs, target, signal: controller.signal }, given);
          await predicted; // the answer before, for the view's "before → after"
          timed(() => drawResult(d.region, d.name, d.response, d));
        } catch (err) {
          failed ||= err;
          failures += 1;
          drawFailure(d.region, d.name, err);
        }
      })(),
    );
  }
  jobs.push(predicted);
  await Promise.all(jobs);
  const ms = performance.now() - started;
  state.running = null;
  $("explain").disabled = false;
  $("cancel").disabled = true;
  if (controller.signal.aborted) {
    $("status").textContent = "cancelled";
  } else if (failed) {
    const ok = methods.length - failures;
    $("status").textContent = ok
      ? `${ok} of ${methods.length} methods answered in ${ms.toFixed(0)} ms; ${failures} failed (see the alert)`
      : `failed after ${ms.toFixed(0)} ms (see the alert)`;
    showError(failed);
  } else {
    $("status").textContent = `done in ${ms.toFixed(0)} ms`;
  }
  state.explained += 1;
  document.body.dataset.explained = String(state.explained);
  document.body.dataset.explainMs = ms.toFixed(3);
  document.body.dataset.drawMs = state.drawMs.toFixed(3); // of which drawing the answers
}

/** Run a drawing, adding its time to the explain's drawing time. */
function timed(draw) {
  const t0 = performance.now();
  draw();
  state.drawMs += performance.now() - t0;
}

/** Examples in the inputs (a list, a base64 tensor, or one tensor per input). */
function countOf(inputs) {
  if (Array.isArray(inputs)) {
    const first = inputs[0];
    return first && !Array.isArray(first) && typeof first === "object" && first.shape ? first.shape[0] : inputs.length;
  }
  if (inputs && Array.isArray(inputs.shape)) return inputs.shape[0];
  if (inputs && typeof inputs === "object") {
    const first = Object.values(inputs)[0];
    return Array.isArray(first) ? first.length : first && first.shape ? first.shape[0] : 1;
  }
  return 1;
}

/** A large request as an attribution job: its progress in the region, cancelled with the page's
 * Cancel (DELETE /v1/jobs/{id}); the job's result once it has succeeded. */
async function runJob(m, body, region, signal) {
  const job = await call(`/v1/models/${encodeURIComponent(m.id)}/attribution-jobs`, { method: "POST", body, signal });
  const bar = el("progress", { max: String(job.progress.total), value: "0", "aria-label": `${body.method} progress` });
  const note = el("p", { class: "hint" }, `job ${job.id}: queued`);
  region.replaceChildren(el("h2", {}, body.method), bar, note);
  const cancel = () => call(`/v1/jobs/${job.id}`, { method: "DELETE" }).catch(() => {});
  signal.addEventListener("abort", cancel, { once: true });
  for (;;) {
    if (signal.aborted) throw new Error("cancelled");
    const info = await call(`/v1/jobs/${job.id}`);
    bar.value = info.progress.done;
    note.textContent = `job ${job.id}: ${info.status}, ${info.progress.done} of ${info.progress.total} examples`;
    if (info.status === "succeeded") {
      const [result, summary] = await Promise.all([
        call(`/v1/jobs/${job.id}/result`),
        call(`/v1/jobs/${job.id}/summary`).catch(() => null), // what drives the model over them
      ]);
      return summary ? { ...result, summary } : result;
    }
    if (info.status !== "queued" && info.status !== "running") throw new Problem(info.error || { status: 500, title: `job ${info.status}` });
    await new Promise((done) => setTimeout(done, 250));
  }
}

// -- start ----------------------------------------------------------------------------------

async function start() {
  $("key").value = apiKey();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    $("key").dispatchEvent(new Event("change"));
  });
  $("key").addEventListener("change", async () => {
    setApiKey($("key").value.trim());
    clearError();
    await boot(false);
  });
  $("model").addEventListener("change", () => {
    chooseModel($("model").value, { view: state.view.id }); // the question stays where it can
    saveURL();
  });
  $("input").addEventListener("change", () => renderRowEditor());
  $("image").addEventListener("change", async () => {
    const file = $("image").files[0];
    if (!file) return;
    clearError();
    try {
      await takeImage(file);
      saveURL();
    } catch (err) {
      showError(err);
    }
  });
  $("view-list").addEventListener("keydown", moveTab);
  $("example").addEventListener("change", () => showExample(Number($("example").value) - 1));
  for (const box of document.querySelectorAll('input[name="metric"]')) box.addEventListener("change", offerMetrics);
  $("sign").addEventListener("change", redraw);
  $("colormap").addEventListener("change", redraw);
  $("form").addEventListener("submit", explain);
  $("cancel").addEventListener("click", () => state.running && state.running.abort());
  await boot(true);
}

async function boot(first) {
  try {
    await loadCatalog();
  } catch (err) {
    showError(err);
    document.body.dataset.ready = "error";
    return;
  }
  let run = false;
  try {
    run = first && (await fromURL());
  } catch (err) {
    showError(err);
  }
  if (!state.model || !state.models.includes(state.model)) {
    // a new catalogue (a key given): keep the model chosen, else the first that is ready
    const keep = state.model && state.models.find((m) => m.id === state.model.id);
    chooseModel((keep || state.models.find((m) => m.ready) || state.models[0] || {}).id);
  }
  document.body.dataset.ready = "true";
  if (run) await explain();
}

start();
