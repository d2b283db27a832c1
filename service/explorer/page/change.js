// "What would change the answer?": an attack (FGSM, PGD: POST .../attacks) or the least
// perturbation that changes it (POST .../counterfactuals). Each example is drawn as the input,
// the perturbed input and the change, with the answer before and after in words.

import { call } from "./api.js";
import { drawBars, drawImage, el, flat, fmt, imageCanvas, legend, shapeOf } from "./draw.js";

/** The ways to perturb: the route, its method or perturbation, and its parameters with a
 * default from the model (`image`: inputs are pixels in [0, 1]). The attacks' loss is the
 * margin (the largest other class's output minus the target's): a cross-entropy saturates
 * where the model is sure, its gradient is zero, and nothing moves. */
const HOW = {
  fgsm: {
    label: "FGSM attack: one step against the answer",
    route: "attacks",
    params: (k) => ({ epsilon: k.image ? 0.03 : 0.3, loss: "margin", ...k.bounds }),
  },
  pgd: {
    label: "PGD attack: ten small steps within a budget",
    route: "attacks",
    params: (k) => ({ radius: k.image ? 0.03 : 0.3, step_size: k.image ? 0.01 : 0.1, step_num: 10, loss: "margin", ...k.bounds }),
  },
  noise: {
    label: "Least random noise that changes the answer",
    route: "counterfactuals",
    perturbation: "gaussian_noise",
    params: (k) => ({ arg_min: 0, arg_max: k.image ? 0.5 : 3, arg_step: k.image ? 0.01 : 0.05, mode: "binary" }),
  },
  ablation: {
    label: "Fewest features removed, most important first",
    route: "counterfactuals",
    perturbation: "feature_ablation",
    params: (k) => ({ arg_min: 0, arg_max: k.features + 1, arg_step: 1, mode: k.features > 64 ? "binary" : "linear" }),
  },
  step: {
    label: "Least FGSM step that changes the answer",
    route: "counterfactuals",
    perturbation: "fgsm",
    params: (k) => ({ arg_min: 0, arg_max: k.image ? 0.3 : 3, arg_step: k.image ? 0.005 : 0.05, mode: "binary", loss: "margin", ...k.bounds }),
  },
};

/** What each parameter is called for a person (the wire name is shown beside it). */
const HUMAN = {
  epsilon: "step size ε",
  radius: "budget ε (largest change)",
  step_size: "size of each step",
  step_num: "steps",
  lower_bound: "smallest input value",
  upper_bound: "largest input value",
  arg_min: "search from",
  arg_max: "search up to",
  arg_step: "search step",
  mode: "search",
  loss: "loss the attack raises (margin, cross_entropy, nll)",
};

/** What the searched parameter is, for the sentence under a counterfactual. */
const SEARCHED = {
  noise: "noise standard deviation",
  ablation: "number of features removed",
  step: "FGSM step size",
};

/** Changes at most this share of the input's largest magnitude are float32 rounding (the API
 * computes in float32; a JSON input such as 0.3 comes back as 0.30000001192...), not a change:
 * drawn as none, never at full colour. */
const ROUNDING = 1e-6;

/** perturbed − input, with rounding noise (see ROUNDING) as 0; and whether anything is left. */
function settled(perturbed, original) {
  const scale = flat(original).reduce((a, v) => Math.max(a, Math.abs(v)), 0);
  const tol = ROUNDING * scale;
  let moved = false;
  const go = (a, b) => {
    if (Array.isArray(a)) return a.map((x, k) => go(x, b[k]));
    const d = a - b;
    if (Math.abs(d) <= tol) return 0;
    moved = true;
    return d;
  };
  const diff = go(perturbed, original);
  return { diff, moved };
}

/** What the defaults follow: pixels in [0, 1] (a tensor model whose pixels the page makes, not
 * a processor's normalised pixel_values), and how many features an example has. */
function shapeFacts(m) {
  const shape = (m.inputs[0] && m.inputs[0].shape) || [];
  const image = !m.images && shape.length === 4 && [1, 3].includes(shape[1]);
  const dims = shape.slice(1);
  const features = dims.every((d) => d) ? dims.reduce((a, d) => a * d, 1) : 64;
  return { image, features, bounds: image ? { lower_bound: 0, upper_bound: 1 } : {} };
}

export const view = {
  id: "change",
  region: "Robustness",
  title: "What would change the answer?",
  about: "Perturbs each input to see what it takes to change the model's answer: an attack " +
    "within a budget, or the least perturbation that changes it.",

  offered(m) {
    if (!m.predicts) return "this model gives no predictions";
    const out = m.output.shape;
    if (out.length !== 1 || !(out[0] >= 2)) return "its answer is not a choice among classes";
    if (m.tokenizer || m.kind === "causal_lm" || m.kind === "seq2seq_lm") return "its inputs are tokens, not numbers to perturb";
    return true;
  },

  form(box, m, preset = {}) {
    const how = el("select", { id: "change-how", "aria-label": "How" });
    for (const [value, h] of Object.entries(HOW)) how.append(el("option", { value }, h.label));
    how.value = preset.how && HOW[preset.how] ? preset.how : "fgsm";
    const grid = el("div", { class: "params", id: "change-params" });
    const fill = (given) => {
      grid.replaceChildren();
      const defaults = HOW[how.value].params(shapeFacts(m));
      for (const [param, value] of Object.entries({ ...defaults, ...(given || {}) })) {
        const id = `change-${param}`;
        const label = el("label", { for: id }, `${HUMAN[param] || param.replace(/_/g, " ")} `);
        label.append(el("code", {}, param));
        const input = el("input", { id, type: "text", "data-param": param, "aria-label": `change ${param}` });
        input.value = typeof value === "string" ? value : JSON.stringify(value);
        grid.append(label, input);
      }
    };
    how.addEventListener("change", () => fill({}));
    fill(preset.params);
    const field = el("div", { class: "field" });
    field.append(el("label", { for: "change-how" }, "How"), how);
    box.append(field, grid);
  },

  collect(box) {
    const params = {};
    for (const input of box.querySelectorAll("[data-param]")) {
      const raw = input.value.trim();
      if (!raw) continue;
      try {
        params[input.dataset.param] = JSON.parse(raw);
      } catch {
        params[input.dataset.param] = raw; // mode: "binary" typed without quotes
      }
    }
    return { how: box.querySelector("#change-how").value, params };
  },

  async run({ m, inputs, target, signal }, chosen) {
    const how = HOW[chosen.how];
    const body = { inputs, target: target ?? "predicted", params: chosen.params };
    // encoded images: the page cannot see the processor's pixels, so the server draws them
    // (and several inputs: the server draws each)
    if ((m.images && Array.isArray(inputs) && inputs[0] && inputs[0].image) || m.inputs.length > 1) body.render = {};
    if (how.route === "attacks") body.method = chosen.how;
    else Object.assign(body, { perturbation: how.perturbation, seed: 0 });
    return call(`/v1/models/${encodeURIComponent(m.id)}/${how.route}`, { method: "POST", body, signal });
  },

  /** Example `i` of the answer: the verdict in words, then input, perturbed and change. */
  draw(region, res, i, ctx) {
    const { m, inputs, labelOf, look, before } = ctx;
    const was = before(i);
    const now = res.predicted[i];
    const verdict = el("p", { class: "verdict" });
    const changed = res.flipped ? res.flipped[i] : res.min_param[i] !== null;
    verdict.dataset.flipped = String(changed);
    const from = was === null ? "the answer" : `“${labelOf(was)}”`;
    // an attack whose loss had no gradient took no step: "did not change" would read as robust
    const stuck = Boolean(res.zero_gradient && res.zero_gradient[i]);
    verdict.dataset.zeroGradient = String(stuck);
    verdict.textContent = changed
      ? `The answer changed: ${from} became “${labelOf(now)}”.`
      : stuck
        ? `Nothing could move: the loss's gradient is zero at this input, so the attack took no step and the answer is still ${was === null ? `“${labelOf(now)}”` : from}. This says nothing of robustness.`
        : `The answer did not change: still ${was === null ? `“${labelOf(now)}”` : from}.`;
    region.append(verdict);
    if (stuck) {
      const loss = res.params && res.params.loss;
      region.append(el("p", { class: "hint stuck" }, loss === "margin"
        ? "The model's outputs do not change around this input at all: no gradient attack can start here."
        : `The ${loss || "loss"} saturates where the model is this sure (its softmax rounds to 1); the margin loss does not: set loss to margin.`));
    }
    if (res.min_param) {
      const what = SEARCHED[Object.keys(HOW).find((k) => HOW[k].perturbation === res.perturbation)] || "parameter";
      const p = res.params;
      region.append(el("p", { class: "hint" }, res.min_param[i] === null
        ? `Nothing from ${fmt(p.arg_min)} up to ${fmt(p.arg_max)} (${what}) changed it: widen the search.`
        : `The least ${what} that changes it: ${fmt(res.min_param[i])}.`));
    }
    const original = originalOf(inputs, ctx, i);
    const perturbed = m.inputs.length === 1 && Array.isArray(res.perturbed) ? res.perturbed[i] : null;
    const drawn = (res.renders || []).filter((r) => r.example === i);
    if ((!original || !perturbed) && drawn.length) {
      const row = el("div", { class: "triptych" });
      for (const r of drawn) {
        const f = el("figure");
        f.append(el("img", { src: `data:${r.media_type};base64,${r.b64}`, alt: `${r.picture} (drawn by the server)`, class: "picture" }),
          el("figcaption", {}, `${r.input ? `${r.input}: ` : ""}${r.picture === "perturbed" ? "perturbed, as the model saw it" : "change"}`));
        row.append(f);
      }
      region.append(row);
      return;
    }
    if (!original || !perturbed) {
      region.append(el("p", { class: "hint" }, "This model has several inputs: the perturbed inputs are in the API's answer."));
      return;
    }
    const { diff, moved } = settled(perturbed, original);
    if (!moved) region.append(el("p", { class: "hint unchanged" }, "No change: the perturbed input is the input (differences within float32 rounding are not drawn)."));
    const shape = shapeOf(perturbed);
    if (shape.length === 3 && [1, 3].includes(shape[0])) {
      const row = el("div", { class: "triptych" });
      row.append(figure("input", imageCanvas(original)), figure("perturbed", imageCanvas(perturbed)));
      const change = el("figure");
      drawImage(change, diff, null, look);
      change.append(el("figcaption", {}, "change (summed over channels)"));
      row.append(change);
      region.append(row);
    } else {
      const values = flat(diff);
      const names = (m.inputs[0].features || values.map((_, k) => `${m.inputs[0].name}[${k}]`)).slice(0, values.length);
      const was_ = flat(original);
      const now_ = flat(perturbed);
      region.append(el("p", { class: "hint" }, "The change of each feature (perturbed − input):"));
      drawBars(region, values, names, look, (k) => `${names[k]}: ${fmt(was_[k])} → ${fmt(now_[k])}`);
    }
    region.append(legend(look.sign, look.colormap, "raises the input", "lowers it"));
  },
};

/** Example i of the inputs the page sent, as nested lists (null if it cannot tell). */
function originalOf(inputs, ctx, i) {
  if (ctx.m.inputs.length > 1) return null;
  if (Array.isArray(inputs) && Array.isArray(inputs[0])) return inputs[i];
  const image = ctx.image;
  if (inputs && inputs.b64 && image && image.pixels) {
    const [, c, h, w] = image.shape;
    const px = image.pixels;
    return Array.from({ length: c }, (_, k) => Array.from({ length: h }, (_, y) => Array.from(px.subarray(k * h * w + y * w, k * h * w + (y + 1) * w))));
  }
  return null;
}

function figure(caption, canvas) {
  const f = el("figure");
  f.append(canvas, el("figcaption", {}, caption));
  return f;
}
