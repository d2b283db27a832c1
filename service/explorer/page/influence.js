// "Which training examples led to it?": training-data influence (POST .../influence) from the
// model's index: per example, the training examples that most helped its answer and those that
// most hurt it, shown as they are (a row of features, an image, a text) with their labels.

import { call } from "./api.js";
import { el, fmt, imageCanvas, shapeOf, signLegend } from "./draw.js";

export const view = {
  id: "influence",
  region: "Influence",
  title: "Which training examples led to it?",
  about: "Ranks the training examples by how much each one, during training, moved the " +
    "model toward (helped) or away from (hurt) its answer on this input.",

  offered(m) {
    const inf = m.influence;
    if (!inf) return "no influence index is configured for this model (models.toml [models.influence])";
    if (inf.status === "building") {
      const p = inf.progress || {};
      return `its influence index is still being built (${p.done ?? 0} of ${p.total ?? "?"})`;
    }
    if (inf.status !== "ready") return `its influence index failed: ${inf.error || "see GET /v1/models"}`;
    return true;
  },

  form(box, m, preset = {}) {
    const grid = el("div", { class: "params" });
    const k = el("input", { id: "influence-k", type: "number", min: "1", max: "50", step: "1", "aria-label": "influence k" });
    k.value = String(preset.k || 5);
    const kLabel = el("label", { for: "influence-k" }, "training examples to list ");
    kLabel.append(el("code", {}, "k"));
    const opp = el("input", { id: "influence-opponents", type: "checkbox", "aria-label": "influence opponents" });
    opp.checked = preset.opponents ?? true;
    const oLabel = el("label", { for: "influence-opponents" }, "also those that hurt it ");
    oLabel.append(el("code", {}, "opponents"));
    grid.append(kLabel, k, oLabel, opp);
    box.append(grid, el("p", { class: "hint" }, `Index: ${m.influence.method}, ${m.influence.n_train} training examples.`));
  },

  collect(box) {
    return { k: Number(box.querySelector("#influence-k").value) || 5, opponents: box.querySelector("#influence-opponents").checked };
  },

  async run({ m, inputs, target, signal }, chosen) {
    const labels = target === "predicted" ? null : target;
    const body = { inputs, labels, k: chosen.k, opponents: chosen.opponents, include_examples: true };
    return call(`/v1/models/${encodeURIComponent(m.id)}/influence`, { method: "POST", body, signal });
  },

  draw(region, res, i, ctx) {
    const parts = [["Helped most", "proponents", res.proponents], ["Hurt most", "opponents", res.opponents]];
    for (const [title, key, lists] of parts) {
      if (!lists) continue;
      const top = lists[Math.min(i, lists.length - 1)];
      const box = el("div", { class: `influence ${key}`, "aria-label": title, role: "group" });
      box.append(el("h3", {}, `${title} (${key})`));
      const list = el("ol", { class: "train" });
      top.indices.forEach((index, r) => {
        const ex = top.examples ? top.examples[r] : null;
        const li = el("li", { "data-train-index": String(index), "data-score": String(top.scores[r]) });
        const label = ex ? ex.label_name ?? JSON.stringify(ex.label) : "";
        const sign = top.scores[r] > 0 ? "positive" : top.scores[r] < 0 ? "negative" : "zero";
        li.append(el("span", { class: "what" }, `training example ${index}${label ? `, labelled “${label}”` : ""}`), el("span", { class: `value ${sign}` }, fmt(top.scores[r])));
        if (ex) li.append(showExample(ex.inputs, ctx.m));
        list.append(li);
      });
      box.append(list);
      region.append(box);
    }
    region.append(signLegend(
      "red: positive, the training example helped (it pushed the model's loss on this input " +
      "down over training); blue: negative, it hurt (pushed the loss up); grey: neither. " +
      "A larger score is a stronger push"));
  },
};

/** A training example as a person reads it: a text, an image, or its features. */
function showExample(inputs, m) {
  if (typeof inputs === "string") return el("q", { class: "example" }, inputs);
  if (Array.isArray(inputs) && typeof inputs[0] === "string") return el("q", { class: "example" }, inputs.join(" ||| "));
  const shape = shapeOf(inputs);
  if (shape.length === 3 && [1, 3].includes(shape[0])) return imageCanvas(inputs, "training image");
  if (shape.length === 1) {
    const names = (m.inputs[0] && m.inputs[0].features) || inputs.map((_, k) => `[${k}]`);
    return el("span", { class: "example row" }, inputs.map((v, k) => `${names[k]} ${fmt(v)}`).join(", "));
  }
  return el("code", { class: "example" }, JSON.stringify(inputs).slice(0, 200));
}
