// "Which concepts does it use?": TCAV (POST .../tcav) over the model's stored concept sets, one
// row per concept and one column per layer: how many of the inputs' gradients point toward the
// concept, and whether that differs from random sets of examples.

import { call } from "./api.js";
import { el, fmt, signLegend } from "./draw.js";

/** Sets named like these are the random sets the concepts are tested against. */
const RANDOM = /^rand/i;

export const view = {
  id: "concepts",
  region: "Concepts",
  title: "Which concepts does it use?",
  about: "Tests the model's stored concept sets (TCAV): does the model's answer rise when " +
    "its internal state moves toward a concept, more often than for random examples?",

  offered(m) {
    if (!m.layers || !m.layers.length) return "this model lists no layers to test concepts at";
    if (m.kind === "causal_lm" || m.kind === "seq2seq_lm") return "concept tests take classifiers";
    return true;
  },

  form(box, m, preset = {}) {
    const note = el("p", { class: "hint" }, "Loading the concept sets…");
    box.append(note);
    const url = `/v1/models/${encodeURIComponent(m.id)}/concepts`;
    return call(url).then(({ concepts }) => {
      note.remove();
      box.dataset.built = "true";
      const names = concepts.map((c) => c.name);
      if (names.filter((n) => !RANDOM.test(n)).length < 1 || names.filter((n) => RANDOM.test(n)).length < 2) {
        box.append(el("p", { class: "hint", id: "concepts-missing" },
          `This model needs at least one concept set and two random sets (named random…). ` +
          `Store them with PUT ${url}/{name}, {"inputs": [...]} (examples of the concept).`));
      }
      const group = (legendText, cls, checked) => {
        const set = el("fieldset", { class: cls });
        set.append(el("legend", {}, legendText));
        const list = el("div", { class: "choices" });
        for (const c of concepts) {
          if (RANDOM.test(c.name) !== (cls === "tcav-random")) continue;
          const box_ = el("input", { type: "checkbox", value: c.name });
          box_.checked = checked(c.name);
          const label = el("label");
          label.append(box_, ` ${c.name} `, el("span", { class: "hint" }, `(${c.n})`));
          list.append(label);
        }
        set.append(list);
        return set;
      };
      const given = (list) => Array.isArray(list) && list.length > 0; // an empty list: no preset
      const pickConcept = (n) => (given(preset.concepts) ? preset.concepts.includes(n) : true);
      const pickRandom = (n) => (given(preset.random) ? preset.random.includes(n) : true);
      const layers = el("fieldset", { class: "tcav-layers" });
      layers.append(el("legend", {}, "Layers"));
      const list = el("div", { class: "choices" });
      for (const layer of m.layers) {
        const box_ = el("input", { type: "checkbox", value: layer });
        box_.checked = given(preset.layers) ? preset.layers.includes(layer) : true;
        const label = el("label");
        label.append(box_, ` ${layer}`);
        list.append(label);
      }
      layers.append(list);
      box.append(group("Concepts", "tcav-concepts", pickConcept), group("Compared against (random sets)", "tcav-random", pickRandom), layers);
    }, (err) => {
      note.textContent = `The concept sets could not be listed: ${err.message}`;
      throw err;
    });
  },

  collect(box) {
    if (!box.dataset.built) return undefined; // still loading: nothing chosen yet
    const checked = (cls) => [...box.querySelectorAll(`.${cls} input:checked`)].map((x) => x.value);
    return { concepts: checked("tcav-concepts"), random: checked("tcav-random"), layers: checked("tcav-layers") };
  },

  async run({ m, inputs, target, signal }, chosen) {
    if (!chosen) throw new Error("The concept sets are still loading.");
    if (!chosen.concepts.length) throw new Error("Choose at least one concept.");
    if (chosen.random.length < 2) throw new Error("Choose at least two random sets to compare against.");
    if (!chosen.layers.length) throw new Error("Choose at least one layer.");
    const body = { inputs, target, concepts: chosen.concepts, random_concepts: chosen.random, layers: chosen.layers };
    return call(`/v1/models/${encodeURIComponent(m.id)}/tcav`, { method: "POST", body, signal });
  },

  /** TCAV scores are over all examples at once: one table, whatever the example shown. */
  perExample: false,

  draw(region, res, _i, ctx) {
    const layers = [...new Set(res.scores.map((r) => r.layer))];
    const concepts = [...new Set(res.scores.map((r) => r.concept))];
    const table = el("table", { class: "tcav" });
    const head = el("tr");
    head.append(el("th", {}, "concept"), ...layers.map((l) => el("th", { scope: "col" }, l)));
    table.append(head);
    const said = [];
    for (const concept of concepts) {
      const tr = el("tr");
      tr.append(el("th", { scope: "row" }, concept));
      for (const layer of layers) {
        const r = res.scores.find((x) => x.concept === concept && x.layer === layer);
        const td = el("td", { "data-score": String(r.sign_count), "data-significant": String(r.significant) });
        const track = el("div", { class: "track" });
        const bar = el("div", { class: `bar ${{ for: "for", against: "against" }[r.verdict] || "none"}` });
        bar.style.width = `${(100 * r.sign_count).toFixed(1)}%`;
        track.append(bar);
        td.append(track, el("span", {}, `${Math.round(100 * r.sign_count)}% ${r.verdict}`));
        td.title = sentence(r, ctx);
        tr.append(td);
        said.push(sentence(r, ctx));
      }
      table.append(tr);
    }
    const scroll = el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "concepts by layers" });
    scroll.append(table);
    region.append(scroll);
    const list = el("ul", { class: "sentences" });
    for (const s of said) list.append(el("li", {}, s));
    region.append(
      signLegend(
        "red: positive, “for”: significantly more of the examples' answers rise than with " +
        "random sets; blue: negative, “against”: significantly fewer; grey: “not significant”, " +
        "no different from random. Each bar: the share of the examples whose answer rises when " +
        "the layer's state moves toward the concept"),
      list,
    );
  },
};

function sentence(r, ctx) {
  const t = ctx.target;
  const what = t === null || t === undefined || t === "predicted" ? "the predicted class" : Array.isArray(t) ? "each example's target" : `“${typeof t === "number" ? ctx.labelOf(t) : t}”`;
  const share = `${Math.round(100 * r.sign_count)}% of the examples`;
  const chance = `random sets give ${Math.round(100 * r.random_sign_count)}%`;
  const p = r.p_value === null ? "" : `, p = ${fmt(r.p_value)}`;
  if (r.verdict === "not significant") {
    return `${r.concept} at ${r.layer}: ${share} lean toward ${what}, no different from random sets (${chance}${p}).`;
  }
  return r.verdict === "for"
    ? `${r.concept} at ${r.layer}: speaks for ${what}: ${share} rise toward it, more than random sets (${chance}${p}).`
    : `${r.concept} at ${r.layer}: speaks against ${what}: only ${share} rise toward it, fewer than random sets (${chance}${p}).`;
}
