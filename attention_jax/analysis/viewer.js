// attention_jax's viewer: the head view and the pattern grid, drawn on canvases from the data the
// Python side embeds (attention_jax/viewer.py). No network, no libraries. State the tests read is
// kept in data- attributes: data-lines (lines drawn), data-strongest (the key the hovered query
// reads most, or the query that reads the hovered key most), data-shown (the enlarged pattern).
function attentionViewer(root, d) {
  const T = d.T, L = d.layers, H = d.heads;
  const raw = atob(d.data), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  const q = new Uint16Array(bytes.buffer), per = d.causal ? T * (T + 1) / 2 : T * T;
  const w = (l, h, i, j) => d.causal ? (j > i ? 0 : q[(l * H + h) * per + i * (i + 1) / 2 + j] / 65535)
                                     : q[(l * H + h) * per + i * T + j] / 65535;
  const mean = (l, i, j) => { let s = 0; for (let h = 0; h < H; h++) s += w(l, h, i, j); return s / H; };
  // viridis, a polynomial fit (perceptually even, readable in greyscale and by colour-blind readers)
  const C = [[0.2777, 0.0054, 0.3341], [0.1051, 1.4046, 1.3846], [-0.3309, 0.2148, 0.0951], [-4.6342, -5.7991, -19.3324],
             [6.2283, 14.1799, 56.6906], [4.7764, -13.7451, -65.3530], [-5.4355, 4.6459, 26.3124]];
  const viridis = t => [0, 1, 2].map(c => { let v = 0; for (let k = 6; k >= 0; k--) v = v * t + C[k][c];
                                                     return Math.round(255 * Math.min(1, Math.max(0, v))); });
  const el = (tag, attrs = {}, text) => { const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
  root.style.cssText = "font: 13px system-ui, sans-serif; color: #222; max-width: 980px";
  root.appendChild(el("div", {style: "font-weight: 600; margin-bottom: 6px"}, `${d.title}: ${L} block(s) x ${H} head(s), ${T} tokens`));
  const bar = root.appendChild(el("div", {class: "ajv-controls", style: "margin-bottom: 8px"}));
  bar.append("block ");
  const layerSel = bar.appendChild(el("select", {class: "ajv-layer"}));
  for (let l = 0; l < L; l++) layerSel.appendChild(el("option", {value: l}, String(l)));
  bar.append(" head ");
  const headSel = bar.appendChild(el("select", {class: "ajv-head"}));
  headSel.appendChild(el("option", {value: "all"}, "all, averaged"));
  for (let h = 0; h < H; h++) headSel.appendChild(el("option", {value: h}, String(h)));
  const tabs = [bar.appendChild(el("button", {class: "ajv-tab", "data-view": "head", style: "margin-left: 12px"}, "head view")),
                bar.appendChild(el("button", {class: "ajv-tab", "data-view": "grid"}, "pattern grid"))];
  // What each view shows and what a pointer does there, said on the page (the tests read it).
  const help = root.appendChild(el("div", {class: "ajv-help", style: "color: #555; margin-bottom: 6px"}));
  const helps = {head: "Left: each token as a query (where it looks from); right: each token as a key. A line's " +
                       "weight is the attention. Hover a token on the left to see where it looks, on the right to " +
                       "see what looks at it.",
                 grid: "One pattern per block and head: row = query, column = key. Click one to enlarge it; hover " +
                       "the enlarged one to read a weight."};
  // --- the head view: queries on the left, keys on the right, lines between ---
  const headView = root.appendChild(el("div", {class: "ajv-headview",
    style: "position: relative; max-height: 560px; overflow-y: auto; border: 1px solid #ddd; padding: 4px"}));
  const row = 18, width = 190, gap = 220;
  const cols = [0, 1].map(side => headView.appendChild(el("div", {class: side ? "ajv-keys" : "ajv-queries",
    style: `position: absolute; top: 4px; ${side ? `left: ${width + gap}px; text-align: left` : `left: 0; text-align: right`}; width: ${width}px`})));
  const lines = headView.appendChild(el("canvas", {class: "ajv-lines", width: gap, height: T * row,
    style: `position: absolute; top: 4px; left: ${width}px`}));
  headView.appendChild(el("div", {style: `height: ${T * row + 4}px`}));
  const label = t => t.replace(/\n/g, "\u23ce").replace(/ /g, "\u2423");
  const spans = cols.map(col => d.tokens.map((t, i) => col.appendChild(el("div", {class: "ajv-token", "data-i": i,
    style: `height: ${row}px; line-height: ${row}px; white-space: pre; overflow: hidden; cursor: default; padding: 0 4px`}, label(t)))));
  const ctx = lines.getContext("2d");
  const weightOf = (i, j) => { const l = +layerSel.value; return headSel.value === "all" ? mean(l, i, j) : w(l, +headSel.value, i, j); };
  function draw(hover) {  // hover: {side: 0 query | 1 key, i}, or null for every line (short texts only)
    ctx.clearRect(0, 0, gap, T * row);
    spans.flat().forEach(s => s.style.background = "");
    let n = 0, best = -1, bestW = -1;
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
      if (hover && (hover.side ? j !== hover.i : i !== hover.i)) continue;
      if (!hover && T > 64) continue;
      const a = weightOf(i, j);
      if (hover && a > bestW) { bestW = a; best = hover.side ? i : j; }
      if (a < 0.01) continue;
      const [r, g, b] = viridis(a);
      ctx.strokeStyle = `rgba(${r},${g},${b},${hover ? Math.max(0.25, a) : a * 0.8})`;
      ctx.lineWidth = hover ? 1 + 3 * a : 1;
      ctx.beginPath(); ctx.moveTo(0, (i + 0.5) * row); ctx.lineTo(gap, (j + 0.5) * row); ctx.stroke();
      n++;
      if (hover) spans[1 - hover.side][hover.side ? i : j].style.background = `rgba(${r},${g},${b},0.35)`;
    }
    if (hover) spans[hover.side][hover.i].style.background = "#ffd54f";
    lines.dataset.lines = n;
    lines.dataset.strongest = best;
  }
  spans.forEach((col, side) => col.forEach((s, i) => {
    s.addEventListener("mouseenter", () => draw({side, i}));
    s.addEventListener("mouseleave", () => draw(null));
  }));
  // --- the pattern grid: one small heatmap per block and head; click to enlarge, hover to read ---
  const grid = root.appendChild(el("div", {class: "ajv-grid", style: "display: none"}));
  const image = (l, h) => { const img = new ImageData(T, T);
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) { const [r, g, b] = viridis(w(l, h, i, j)), k = 4 * (i * T + j);
      img.data[k] = r; img.data[k + 1] = g; img.data[k + 2] = b; img.data[k + 3] = 255; }
    const c = el("canvas", {width: T, height: T}); c.getContext("2d").putImageData(img, 0, 0); return c; };
  const table = grid.appendChild(el("div", {style: `display: grid; grid-template-columns: repeat(${H}, 76px); gap: 4px`}));
  const big = grid.appendChild(el("div", {class: "ajv-big", style: "display: none; margin-top: 10px"}));
  const bigTitle = big.appendChild(el("div", {class: "ajv-big-title", style: "font-weight: 600"}));
  const side = Math.min(560, Math.max(280, 4 * T));
  const bigCanvas = big.appendChild(el("canvas", {class: "ajv-big-canvas", width: side, height: side,
    style: "border: 1px solid #ccc; image-rendering: pixelated; cursor: crosshair"}));
  const tip = big.appendChild(el("div", {class: "ajv-tip", style: "height: 20px; font-family: monospace"}));
  function enlarge(l, h) {
    const b = bigCanvas.getContext("2d"); b.imageSmoothingEnabled = false;
    b.drawImage(image(l, h), 0, 0, side, side);
    bigTitle.textContent = `block ${l}, head ${h}: row = query, column = key`;
    big.style.display = ""; big.dataset.shown = `${l},${h}`; root.dataset.shown = `${l},${h}`;
  }
  bigCanvas.addEventListener("mousemove", e => {
    const box = bigCanvas.getBoundingClientRect(), [l, h] = (big.dataset.shown || "0,0").split(",").map(Number);
    const i = Math.min(T - 1, Math.floor((e.clientY - box.top) / box.height * T)), j = Math.min(T - 1, Math.floor((e.clientX - box.left) / box.width * T));
    tip.textContent = `query ${i} '${label(d.tokens[i])}' -> key ${j} '${label(d.tokens[j])}': ${w(l, h, i, j).toFixed(4)}`;
  });
  for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
    const cell = table.appendChild(el("div", {class: "ajv-cell", "data-l": l, "data-h": h, title: `block ${l}, head ${h}`,
      style: "cursor: pointer; text-align: center; font-size: 10px"}));
    const c = cell.appendChild(image(l, h)); c.style.cssText = "width: 72px; height: 72px; image-rendering: pixelated";
    cell.appendChild(el("div", {}, `${l}.${h}`));
    cell.addEventListener("click", () => enlarge(l, h));
  }
  function show(which) { headView.style.display = which === "head" ? "" : "none"; grid.style.display = which === "grid" ? "" : "none";
    help.textContent = helps[which];
    root.dataset.view = which; tabs.forEach(t => t.style.fontWeight = t.dataset.view === which ? "700" : "400"); }
  tabs.forEach(t => t.addEventListener("click", () => show(t.dataset.view)));
  layerSel.addEventListener("change", () => draw(null)); headSel.addEventListener("change", () => draw(null));
  show("head"); draw(null);
  root.dataset.ready = "1";
}

// The patching view: a sweep's values as a heatmap, rows = blocks, columns = positions or heads (a
// [layer, head, position] sweep: one block at a time, chosen in a select). Blue below zero, red above,
// white at zero, on one scale for the whole sweep; hover a cell to read it. State the tests read:
// data-cells (cells drawn), and the tip's text.
function patchingViewer(root, d) {
  const el = (tag, attrs = {}, text) => { const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
  const three = d.shape.length === 3, L = d.shape[0];
  const at = (idx) => { let flat = 0; for (let k = 0; k < idx.length; k++) flat = flat * d.shape[k] + idx[k]; return d.values[flat]; };
  let big = 1e-12;   // a loop, not Math.max(...values): a large sweep's values overflow the call stack as arguments
  for (const v of d.values) big = Math.max(big, Math.abs(v));
  const colour = v => { const t = Math.min(1, Math.abs(v) / big), c = Math.round(255 * (1 - t));
    return v >= 0 ? `rgb(255,${c},${c})` : `rgb(${c},${c},255)`; };
  root.style.cssText = "font: 13px system-ui, sans-serif; color: #222; max-width: 980px";
  root.appendChild(el("div", {style: "font-weight: 600; margin-bottom: 6px"},
    `${d.title}: ${d.method} patching of ${d.hook}, ${d.axes.join(" x ")}; scale ±${big.toPrecision(3)}`));
  const bar = root.appendChild(el("div", {style: "margin-bottom: 6px"}));
  let layerSel = null;
  if (three) { bar.append("block "); layerSel = bar.appendChild(el("select", {class: "ajp-layer"}));
    for (let l = 0; l < L; l++) layerSel.appendChild(el("option", {value: l}, String(l))); }
  const tip = bar.appendChild(el("span", {class: "ajp-tip", style: "margin-left: 12px; font-family: monospace"}, "hover a cell"));
  const grid = root.appendChild(el("div", {class: "ajp-grid"}));
  const names = (axis, n) => (axis === "position" && d.labels) ? d.labels.map(String) : Array.from({length: n}, (_, i) => `${axis} ${i}`);
  function draw() {
    grid.textContent = "";
    const rowsAxis = three ? d.axes[1] : d.axes[0], colsAxis = three ? d.axes[2] : d.axes[1];
    const R = three ? d.shape[1] : d.shape[0], Cn = three ? d.shape[2] : d.shape[1], l = three ? +layerSel.value : null;
    const colNames = names(colsAxis, Cn), rowNames = names(rowsAxis, R);
    const table = grid.appendChild(el("table", {style: "border-collapse: collapse"}));
    const head = table.appendChild(el("tr")); head.appendChild(el("th"));
    colNames.forEach(n => head.appendChild(el("th", {style: "font-weight: 400; font-size: 10px; padding: 0 2px; white-space: pre"}, n)));
    let cells = 0;
    for (let r = 0; r < R; r++) {
      const tr = table.appendChild(el("tr"));
      tr.appendChild(el("th", {style: "font-weight: 400; text-align: right; padding-right: 4px"}, three ? rowNames[r] : `block ${r}`));
      for (let c = 0; c < Cn; c++) {
        const v = three ? at([l, r, c]) : at([r, c]);
        const td = tr.appendChild(el("td", {class: "ajp-cell", "data-r": r, "data-c": c,
          style: `width: 22px; height: 22px; background: ${colour(v)}; border: 1px solid #eee`}));
        td.addEventListener("mouseenter", () => { tip.textContent =
          `${three ? `block ${l}, ` : ""}${three ? rowNames[r] : `block ${r}`}, ${colNames[c]}: ${v.toFixed(4)}`; });
        cells++;
      }
    }
    root.dataset.cells = String(cells);
  }
  if (layerSel) layerSel.addEventListener("change", draw);
  draw();
  root.dataset.ready = "1";
}

function circuitViewer(root, d) {
  const SVG = "http://www.w3.org/2000/svg";
  const el = (tag, attrs = {}, text) => { const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
  const sv = (tag, attrs = {}) => { const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; };
  // A post-norm model's LayerNorms are nodes too: each below its sub-layer's column, on a row of their own.
  const norms = d.nodes.some(n => /\.ln[12]$/.test(n)), rows = Math.max(1, d.heads) + (norms ? 1 : 0);
  const place = n => {   // [column, row] of a node: embed, then each block's heads (or mixer) and FFN, then the logits
    if (n === "embed") return [0, -1];
    if (n === "logits") return [2 * d.blocks + 1, -1];
    const [b, part] = n.split("."); const i = +b;
    if (part === "ln1" || part === "ln2") return [2 * i + (part === "ln1" ? 1 : 2), rows - 1];
    return part === "ffn" ? [2 * i + 2, -1] : [2 * i + 1, part.startsWith("h") ? +part.slice(1) : -1];
  };
  const W = 110 * (2 * d.blocks + 2) + 40, H = 46 * rows + 60, middle = (norms ? rows - 2 : rows - 1) / 2;
  const xy = n => { const [c, r] = place(n); return [40 + 110 * c, 30 + 46 * (r < 0 ? middle : r)]; };
  let big = 1e-12;
  for (const e of d.edges) big = Math.max(big, Math.abs(e.effect));
  root.style.cssText = "font: 13px system-ui, sans-serif; color: #222; max-width: 980px";
  root.appendChild(el("div", {style: "font-weight: 600; margin-bottom: 6px"},
    `${d.title}: ${d.edges.length} of ${d.total} edges (${d.method}); width |effect|, scale ±${big.toPrecision(3)}`));
  const tip = root.appendChild(el("div", {class: "ajc-tip", style: "font-family: monospace; margin-bottom: 4px"},
    "hover an edge: sender -> receiver input, the metric's change with it patched"));
  root.appendChild(el("div", {style: "font-size: 11px; color: #555"},
    "blue: patching it lowers the metric, orange: raises it; into a head: query solid, key dashed, value dotted"));
  const svg = root.appendChild(sv("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`}));
  const dash = {q: "", k: "6 3", v: "2 3"}, offset = {q: -7, k: 0, v: 7};
  for (const e of d.edges) {
    const [x1, y1] = xy(e.from), [x2, y2] = xy(e.to), w = 0.8 + 5 * Math.abs(e.effect) / big;
    const line = svg.appendChild(sv("line", {class: "ajc-edge", "data-edge": e.name, x1: x1 + 9, y1,
      x2: x2 - 9, y2: y2 + (offset[e.role] || 0), stroke: e.effect < 0 ? "#2166ac" : "#e08214",
      "stroke-width": w, "stroke-dasharray": dash[e.role] || "", "stroke-opacity": 0.75}));
    line.addEventListener("mouseenter", () => { tip.textContent = `${e.name}: ${e.effect.toFixed(4)}`; });
  }
  for (const n of d.nodes) {
    const [x, y] = xy(n), g = svg.appendChild(sv("g", {class: "ajc-node", "data-node": n}));
    g.appendChild(sv("circle", {cx: x, cy: y, r: 9, fill: "#fff", stroke: "#333"}));
    const label = g.appendChild(sv("text", {x, y: y - 13, "text-anchor": "middle", "font-size": 11}));
    label.textContent = n;
  }
  root.dataset.edges = String(d.edges.length);
  root.dataset.ready = "1";
}
