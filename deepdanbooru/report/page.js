"use strict";
// Builds the tag table, the tag details and the gallery from the JSON in #report-data; no request leaves the page.
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const tags = data.tags;
  const count = tags.name.length;
  const PAGE = 100;
  const columns = [
    ["name", "tag", false], ["category", "category", false], ["train", "training posts", true],
    ["validation", "validation posts", true], ["ap", "AP", true],
  ];
  if (tags.source_ap) columns.push(["source_ap", "source model AP", true]);
  columns.push(["f1", "F1", true], ["precision", "precision", true], ["recall", "recall", true],
               ["threshold", "threshold", true], ["f1_fixed", "F1 at " + data.working_threshold, true]);
  const state = { key: "validation", descending: true, filter: "", category: "", page: 0, open: -1, rows: [] };
  // A figure of a tag with fewer validation positives than it takes to calibrate rests on a few pictures: a
  // sort by a figure puts those tags after the others, and their row says so.
  const FIGURES = new Set(["ap", "source_ap", "f1", "precision", "recall", "f1_fixed"]);
  const few = i => tags.validation[i] > 0 && tags.validation[i] < data.min_support;
  // A tag the default thresholds never emit (docs/metrics.md); pages of older data have no such flag.
  const withheld = i => Boolean(tags.withheld && tags.withheld[i]);
  const positives = n => `${n} validation positive${n === 1 ? "" : "s"}`;

  function el(name, attributes, ...children) {
    const node = document.createElement(name);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
    for (const child of children) node.append(child);
    return node;
  }
  function show(value, digits) {
    if (value === null || value === undefined) return "\u2013";
    return typeof value === "number" && digits ? value.toFixed(digits) : String(value);
  }
  function thumb(picture, caption, mark) {
    const p = data.pictures[picture];
    const box = el("figure", { class: "thumb " + (mark || "") });
    if (p.thumb) box.append(el("img", { src: p.thumb, alt: "post " + p.id }));
    else box.append(el("div", { class: "missing" }, "unreadable"));
    box.append(el("figcaption", {}, caption));
    return box;
  }

  // --- the tag table ---
  const table = document.getElementById("tag-table");
  const head = el("tr");
  for (const [key, label] of columns) {
    const th = el("th", { "data-key": key }, label);
    th.addEventListener("click", () => {
      state.descending = state.key === key ? !state.descending : columns.find(c => c[0] === key)[2];
      state.key = key; state.page = 0; render();
    });
    head.append(th);
  }
  table.querySelector("thead").append(head);
  const categories = Array.from(new Set(tags.category.filter(c => c))).sort();
  const select = document.getElementById("tag-category");
  for (const c of categories) select.append(el("option", { value: c }, c));

  function compute() {
    const needle = state.filter.toLowerCase();
    const rows = [];
    for (let i = 0; i < count; i++) {
      if (needle && !tags.name[i].toLowerCase().includes(needle)) continue;
      if (state.category && tags.category[i] !== state.category) continue;
      rows.push(i);
    }
    const values = tags[state.key];
    const sign = state.descending ? -1 : 1;
    const apart = FIGURES.has(state.key);
    rows.sort((a, b) => {
      const x = values[a], y = values[b];
      if (x === null || y === null) return x === y ? a - b : (x === null ? 1 : -1);  // no figure: last either way
      if (apart && few(a) !== few(b)) return few(a) ? 1 : -1;  // then figures from a picture or two
      if (x === y) return a - b;
      return (x < y ? -1 : 1) * sign;
    });
    state.rows = rows;
  }

  function render() {
    compute();
    const body = table.querySelector("tbody");
    body.replaceChildren();
    const pages = Math.max(1, Math.ceil(state.rows.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const start = state.page * PAGE;
    for (const i of state.rows.slice(start, start + PAGE)) {
      const tr = el("tr", { class: "tag-row" + (state.open === i ? " open" : ""), "data-tag": tags.name[i] });
      for (const [key, , numeric] of columns) {
        let text = show(tags[key][i], key === "threshold" ? 3 : (numeric && key !== "train" && key !== "validation" ? 3 : 0));
        if (key === "threshold" && !tags.calibrated[i]) text += withheld(i) ? " (withheld)" : " (fallback)";
        if (key === "ap" && few(i) && tags.ap[i] !== null) text += ` (${tags.validation[i]} pos.)`;
        const cell = el("td", numeric ? { class: "number" } : {}, text);
        if (key === "name") for (const line of rowNotes(i)) cell.append(el("div", { class: "row-note" }, line));
        tr.append(cell);
      }
      tr.addEventListener("click", () => { state.open = state.open === i ? -1 : i; render(); });
      body.append(tr);
      if (state.open === i) body.append(detailRow(i));
    }
    for (const th of table.querySelectorAll("th")) {
      th.classList.toggle("sorted-asc", th.dataset.key === state.key && !state.descending);
      th.classList.toggle("sorted-desc", th.dataset.key === state.key && state.descending);
    }
    const shown = state.rows.length ? `${start + 1}\u2013${Math.min(start + PAGE, state.rows.length)}` : "0";
    document.getElementById("tag-count").textContent =
      `rows ${shown} of ${state.rows.length} (${count} tags), page ${state.page + 1} of ${pages}`;
    document.getElementById("tag-previous").disabled = state.page === 0;
    document.getElementById("tag-next").disabled = state.page >= pages - 1;
  }

  function rowNotes(i) {
    // Why the row's figures read as they do, on the row itself.
    const notes = [];
    if (!few(i)) return notes;
    const n = tags.validation[i];
    notes.push(`${positives(n)}, fewer than the ${data.min_support} that calibrate: AP and F1 rest on ` +
               (n === 1 ? "one picture" : `${n} pictures`));
    if (tags.f1[i] !== null && tags.f1_fixed[i] !== null && tags.f1[i] !== tags.f1_fixed[i])
      notes.push(`F1 ${show(tags.f1[i], 3)} is at ` + (withheld(i) ? "no threshold (withheld: never emitted by default)" :
                 `the fallback threshold ${show(tags.threshold[i], 3)}`) + ` (fewer than ` +
                 `${data.min_support} positives to choose its own); at ${data.working_threshold} it is ${show(tags.f1_fixed[i], 3)}`);
    return notes;
  }

  function curve(i) {
    // The tag's precision-recall curve as SVG: recall on x, precision on y, its threshold's point marked.
    const W = 300, H = 240, L = 40, B = 30, T = 10, R = 10;
    const x = r => L + (W - L - R) * r, y = p => H - B - (H - B - T) * p;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "pr-curve"); svg.setAttribute("width", W); svg.setAttribute("height", H);
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const add = (name, attributes, text) => {
      const node = document.createElementNS(ns, name);
      for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node); return node;
    };
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      add("line", { x1: x(0), x2: x(1), y1: y(v), y2: y(v), stroke: "#ddd" });
      add("line", { x1: x(v), x2: x(v), y1: y(0), y2: y(1), stroke: "#ddd" });
      add("text", { x: L - 4, y: y(v) + 4, "text-anchor": "end", "font-size": 10 }, v);
      add("text", { x: x(v), y: H - B + 14, "text-anchor": "middle", "font-size": 10 }, v);
    }
    add("text", { x: (L + W - R) / 2, y: H - 2, "text-anchor": "middle", "font-size": 11 }, "recall");
    add("text", { x: 10, y: (T + H - B) / 2, "font-size": 11, transform: `rotate(-90 10 ${(T + H - B) / 2})`,
                  "text-anchor": "middle" }, "precision");
    const P = data.curves.precision[i], Rc = data.curves.recall[i];
    const points = [];
    for (let k = 0; k < P.length; k++) if (Rc[k] > 0) points.push(`${x(Rc[k] / 1000).toFixed(1)},${y(P[k] / 1000).toFixed(1)}`);
    if (points.length) add("polyline", { points: points.join(" "), fill: "none", stroke: "#1f77b4", "stroke-width": 2 });
    if (tags.precision[i] !== null)
      add("circle", { cx: x(tags.recall[i]), cy: y(tags.precision[i]), r: 4, fill: "#d62728" });
    return svg;
  }

  function detailRow(i) {
    const td = el("td", { colspan: columns.length });
    const box = el("div", { class: "detail" });
    const left = el("div", {}, curve(i),
      el("div", { class: "note" }, tags.validation[i] ? `red dot: threshold ${show(tags.threshold[i], 3)}` +
        (tags.calibrated[i] ? " (its own)" : withheld(i) ? " (withheld: never emitted by default)" :
         " (the fallback: no reliable threshold of its own)") :
        "no positive in the validation split: no curve"));
    const right = el("div", {});
    const worst = (kind, title, mark, wrongWhen) => {
      const list = data.worst[kind][i];
      right.append(el("h4", {}, title));
      const row = el("div", { class: "pictures" });
      for (const [picture, score] of list) {
        const wrong = wrongWhen(score);
        row.append(thumb(picture, `post ${data.pictures[picture].id}: ${score.toFixed(3)}` + (wrong ? (kind === "fp" ? " FP" : " FN") : " (right)"), wrong ? mark : ""));
      }
      if (!list.length) row.append(el("span", { class: "note" }, "none"));
      right.append(row);
    };
    worst("fp", "Highest-scoring pictures without the tag", "fp-mark", s => s >= tags.threshold[i]);
    worst("fn", "Lowest-scoring pictures with the tag", "fn-mark", s => s < tags.threshold[i]);
    box.append(left, right);
    td.append(box);
    return el("tr", { class: "tag-detail" }, td);
  }

  document.getElementById("tag-filter").addEventListener("input", e => { state.filter = e.target.value; state.page = 0; render(); });
  select.addEventListener("change", e => { state.category = e.target.value; state.page = 0; render(); });
  document.getElementById("tag-previous").addEventListener("click", () => { state.page--; render(); });
  document.getElementById("tag-next").addEventListener("click", () => { state.page++; render(); });
  render();

  // --- the gallery ---
  const gallery = document.getElementById("gallery");
  const tagSpan = (kind, label) => ([tag, score]) => el("span", { class: "tag " + kind, title: `${label}, score ${score}` },
    tags.name[tag] + (kind === "hit" ? "" : ` ${kind.toUpperCase()} ${score.toFixed(2)}`));
  for (const picture of data.gallery) {
    const p = data.pictures[picture];
    const image = p.thumb ? el("img", { src: p.thumb, alt: "post " + p.id }) : el("div", { class: "missing" }, "unreadable");
    const text = el("div", {}, el("div", {}, el("b", {}, `post ${p.id}`), ` \u00b7 ${p.errors} mistake(s)`));
    const line = el("div", {});
    for (const entry of p.hits) line.append(tagSpan("hit", "caption tag, predicted")(entry));
    for (const entry of p.missed) line.append(tagSpan("fn", "caption tag, not predicted")(entry));
    for (const entry of p.wrong) line.append(tagSpan("fp", "predicted, not in the caption")(entry));
    if (p.more_wrong) line.append(el("span", { class: "note" }, " and maybe more FP"));
    text.append(line);
    gallery.append(el("div", { class: "card", "data-post": p.id }, image, text));
  }

  // --- the grown vocabulary ---
  const vocabulary = document.getElementById("vocabulary-new");
  if (vocabulary && data.vocabulary) {
    const rows = data.vocabulary.new.slice().sort((a, b) => (tags.ap[b] ?? -1) - (tags.ap[a] ?? -1));
    for (const i of rows)
      vocabulary.append(el("tr", {}, el("td", {}, tags.name[i]), el("td", { class: "number" }, show(tags.train[i])),
        el("td", { class: "number" }, show(tags.validation[i])), el("td", { class: "number" }, show(tags.ap[i], 3)),
        el("td", { class: "number" }, show(tags.f1[i], 3))));
  }
})();
