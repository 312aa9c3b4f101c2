// The step animation, drawn and played in the browser (allreduce_edu.viz.StepAnimation).
//
// Python replays the trace once and sends every step's state in `data` (see animation.py's
// `browser_data`); from then on Play, Pause, the step buttons, the slider, the speed and the
// symbols/numbers switch all run here, with the kernel idle. Nothing is sent back while it plays.
// The same file runs without any kernel in a static page (viz/browser.py wraps it).

const SVG = "http://www.w3.org/2000/svg";
const SPEEDS = [0.5, 1, 1.5, 2, 3, 4, 6];

function svg(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function html(tag, attrs = {}, parent = null, text = "") {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function text(parent, x, y, content, attrs = {}) {
  const node = svg("text", { x, y, ...attrs }, parent);
  node.textContent = content;
  return node;
}

// --- what a cell says: "a0+a1+a2+a3", "a0–3", "4/8": the longest that fits its width -----------
function ranges(ranks) {
  const runs = [];
  for (const r of ranks) {
    if (runs.length && r === runs[runs.length - 1][1] + 1) runs[runs.length - 1][1] = r;
    else runs.push([r, r]);
  }
  return runs.map(([lo, hi]) => (lo === hi ? `${lo}` : `${lo}–${hi}`));
}

function fits(label, width, size) {
  return label.length * size * 0.6 <= width - 6; // 0.6 em: a monospace digit's advance
}

function cellLabel(ranks, name, worldSize, width, size) {
  const candidates = [ranks.map((r) => name + r).join("+"),
                      ranks.length > 1 ? name + ranges(ranks).join(",") : name + ranks[0],
                      `${ranks.length}/${worldSize}`, `${ranks.length}`];
  return candidates.find((c) => fits(c, width, size)) ?? candidates[candidates.length - 1];
}

function valueLabel(value, width, size) {
  const parts = value.split(", ");
  for (let n = parts.length; n >= 1; n--) {
    const label = parts.slice(0, n).join(", ") + (n < parts.length ? "…" : "");
    if (fits(label, width, size)) return label;
  }
  return parts[0].slice(0, Math.max(1, Math.floor((width - 6) / (size * 0.6)) - 1)) + "…";
}

function contrast(hex) {
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255);
  return 0.299 * r + 0.587 * g + 0.114 * b > 0.5 ? "#000" : "#fff";
}

// --- the picture ---------------------------------------------------------------------------------
class Picture {
  constructor(root, data) {
    this.data = data;
    const { width, height } = data;
    this.svg = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, class: "are-picture",
                            role: "img", "aria-label": data.title }, root);
    const defs = svg("defs", {}, this.svg);
    const marker = (id, colour) => {
      const m = svg("marker", { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
                                markerHeight: 7, orient: "auto" }, defs);
      svg("path", { d: "M0,0 L10,5 L0,10 z", fill: colour }, m);
    };
    this.id = `are-${Math.random().toString(36).slice(2, 10)}`; // this picture's own ids on the page
    this.markerId = (tag) => `${this.id}-arrow-${tag}`;
    for (const [tag, colour] of Object.entries(data.phase_colours)) marker(this.markerId(tag), colour);
    marker(this.markerId("other"), data.other_colour);
    marker(this.markerId("edge"), "#b0b0b0");
    this.caption = text(this.svg, 14, 26, "", { class: "are-caption" });
    this.subcaption = text(this.svg, 14, 46, "", { class: "are-subcaption" });
    text(this.svg, width - 14, 26, data.title, { class: "are-title", "text-anchor": "end" });
    this.drawEdges();
    this.cells = this.drawRanks();
    this.arrows = svg("g", { class: "are-arrows" }, this.svg);
    this.drawKey();
  }

  cellBox(rank, lo, hi) { // where chunks lo..hi-1 of a rank sit: {x, y, w}
    const { ranks, box_w, chunks } = this.data;
    const cell = box_w / chunks, left = ranks[rank].x - box_w / 2;
    return { x: left + lo * cell, y: ranks[rank].y - this.data.cell_h / 2, w: (hi - lo) * cell };
  }

  drawEdges() { // the topology, faint, behind the boxes; on a ring an arrowhead halfway shows the way
    const g = svg("g", { class: "are-edges" }, this.svg);
    for (const [a, b, colour] of this.data.edges) { // a colour: a link of one of several trees
      const [p, q] = [this.data.ranks[a], this.data.ranks[b]];
      const mid = { x: (p.x + q.x) / 2, y: (p.y + q.y) / 2 };
      svg("path", { d: `M${p.x},${p.y} L${mid.x},${mid.y} L${q.x},${q.y}`, class: "are-edge",
                    ...(colour ? { style: `stroke: ${colour}; stroke-opacity: 0.6` } : {}),
                    ...(this.data.directed ? { "marker-mid": `url(#${this.markerId("edge")})` } : {}) }, g);
    }
  }

  drawRanks() {
    const { ranks, chunks, cell_h, world_size } = this.data;
    const g = svg("g", { class: "are-ranks" }, this.svg), cells = [];
    ranks.forEach((pos, rank) => {
      text(g, pos.x, pos.y - cell_h / 2 - 8, `rank ${rank}`, { class: "are-rank", "text-anchor": "middle" });
      const row = [];
      for (let c = 0; c < chunks; c++) {
        const box = this.cellBox(rank, c, c + 1);
        const rect = svg("rect", { x: box.x, y: box.y, width: box.w, height: cell_h, class: "are-cell" }, g);
        const label = text(g, box.x + box.w / 2, pos.y + 5, "", { class: "are-cell-text", "text-anchor": "middle" });
        const marks = [], markW = box.w / (world_size + 1);
        for (let r = 0; r < world_size; r++) {
          marks.push(svg("rect", { x: box.x + (r + 0.5) * markW, y: box.y + cell_h + 3, width: markW * 0.8,
                                   height: 4, class: "are-mark" }, g));
        }
        svg("title", {}, rect);
        row.push({ rect, label, marks, box });
      }
      cells.push(row);
    });
    return cells;
  }

  drawKey() { // every count 1..N its own swatch (a continuous bar with labelled ends past 16)
    const { colours, height, world_size } = this.data, y = height - 22;
    const g = svg("g", { class: "are-key" }, this.svg);
    text(g, 14, y + 13, "ranks in a chunk:", { class: "are-key-text" });
    if (world_size <= 16) {
      colours.forEach((colour, i) => {
        svg("rect", { x: 130 + 26 * i, y, width: 24, height: 18, fill: colour }, g);
        text(g, 142 + 26 * i, y + 13, `${i + 1}`, { class: "are-key-text", style: `fill: ${contrast(colour)}`, "text-anchor": "middle" });
      });
    } else {
      const id = `${this.id}-scale`, grad = svg("linearGradient", { id }, svg("defs", {}, g));
      colours.forEach((colour, i) => svg("stop", { offset: i / (colours.length - 1), "stop-color": colour }, grad));
      svg("rect", { x: 150, y, width: 200, height: 18, fill: `url(#${id})` }, g);
      text(g, 144, y + 13, "1", { class: "are-key-text", "text-anchor": "end" });
      text(g, 356, y + 13, `${world_size}`, { class: "are-key-text" });
    }
    const after = world_size <= 16 ? 140 + 26 * world_size : 390;
    text(g, after, y + 13, this.data.key_note, { class: "are-key-text" });
  }

  show(index, numbers) {
    const { steps, chunk_names, colours, world_size } = this.data, state = steps[index];
    const previous = steps[Math.max(index - 1, 0)];
    this.caption.textContent = state.caption;
    this.subcaption.textContent = state.subcaption;
    this.cells.forEach((row, rank) => row.forEach((cell, c) => {
      const ranks = state.held[rank][c], colour = colours[ranks.length - 1];
      cell.rect.setAttribute("fill", colour);
      const changed = index > 0 && ranks.join() !== previous.held[rank][c].join();
      cell.rect.classList.toggle("are-changed", changed);
      const size = 12;
      cell.label.textContent = numbers && state.values
        ? valueLabel(state.values[rank][c], cell.box.w, size)
        : cellLabel(ranks, chunk_names[c], world_size, cell.box.w, size);
      cell.label.setAttribute("fill", contrast(colour));
      cell.rect.firstChild.textContent = `rank ${rank}, chunk ${chunk_names[c]}: data of rank${ranks.length > 1 ? "s" : ""} ${ranks.join(", ")}`
        + (state.values ? ` = ${state.values[rank][c]}` : "");
      cell.marks.forEach((mark, r) => mark.classList.toggle("are-in", ranks.includes(r)));
    }));
    this.arrows.replaceChildren();
    const labelled = state.messages.length <= 2 * world_size;
    for (const m of state.messages) if (m.src !== m.dst) this.drawMessage(m, labelled);
  }

  drawMessage(m, labelled) { // from the chunk that was sent to the chunk it updates
    const { cell_h, phase_colours, other_colour } = this.data;
    const colour = phase_colours[m.tag] ?? other_colour;
    const from = this.cellBox(m.src, m.lo, m.hi), to = this.cellBox(m.dst, m.lo, m.hi);
    const above = to.y < from.y - 1, level = Math.abs(to.y - from.y) < 1;
    const a = { x: from.x + from.w / 2, y: level ? from.y : (above ? from.y : from.y + cell_h) };
    const b = { x: to.x + to.w / 2, y: level ? to.y : (above ? to.y + cell_h + 10 : to.y - 2) };
    // bend to the sender's left; a level arrow arcs up over the row
    const mx = (a.x + b.x) / 2, my = (a.y + b.y) / 2, dx = b.x - a.x, dy = b.y - a.y;
    const bend = level ? -Math.max(28, Math.abs(dx) * 0.25) : 0.18;
    const cx = level ? mx : mx - dy * bend, cy = level ? my + bend : my + dx * bend;
    const g = svg("g", { class: "are-message" }, this.arrows);
    svg("path", { d: `M${a.x},${a.y} Q${cx},${cy} ${b.x},${b.y}`, stroke: colour, class: "are-arrow",
                  "marker-end": `url(#${this.markerId(m.tag in phase_colours ? m.tag : "other")})` }, g);
    svg("title", {}, g).textContent = m.detail;
    if (labelled) { // beside the curve's middle, on its outer side, clear of the line
      const ox = cx - mx, oy = cy - my, norm = Math.hypot(ox, oy) || 1;
      const lx = 0.25 * a.x + 0.5 * cx + 0.25 * b.x + (ox / norm) * 16;
      const ly = 0.25 * a.y + 0.5 * cy + 0.25 * b.y + (oy / norm) * 16 + 4;
      const t = text(g, lx, ly, m.label, { class: "are-arrow-text", fill: colour, "text-anchor": "middle" });
      t.setAttribute("paint-order", "stroke");
    }
  }
}

// --- the controls and the clock --------------------------------------------------------------
function render({ model, el }) {
  const data = model.get("data"), last = data.steps.length - 1;
  let index = Math.min(Math.max(model.get("step"), 0), last), numbers = model.get("mode") === "numbers";
  let speed = model.get("speed"), timer = null;
  const root = html("div", { class: "are-steps", tabindex: "0" }, el);
  const bar = html("div", { class: "are-controls" }, root);
  const play = html("button", { class: "are-play", title: "play from here (space); pause" }, bar, "▶ play");
  const back = html("button", { class: "are-back", title: "previous step (←)" }, bar, "◀ step");
  const forward = html("button", { class: "are-forward", title: "next step (→)" }, bar, "step ▶");
  const slider = html("input", { class: "are-slider", type: "range", min: 0, max: last, step: 1,
                                 value: index, "aria-label": "step" }, bar);
  const readout = html("span", { class: "are-readout" }, bar);
  const options = html("div", { class: "are-controls" }, root);
  html("label", {}, options, "steps/s ");
  const speeds = html("select", { class: "are-speed", title: "steps per second" }, options);
  for (const s of SPEEDS) html("option", { value: s }, speeds, `${s}`).selected = s === speed;
  const modes = {};
  for (const mode of ["symbols", "numbers"]) {
    modes[mode] = html("button", { class: `are-mode are-${mode}`, title: mode === "symbols"
      ? "which ranks each chunk contains (a0+a3)" : (data.has_values ? "the chunk's numbers"
      : "the chunk's numbers: pass values= to enable") }, options, mode);
  }
  modes.numbers.disabled = !data.has_values;
  const picture = new Picture(root, data);

  function show(i) {
    index = Math.min(Math.max(i, 0), last);
    slider.value = index;
    readout.textContent = data.steps[index].readout;
    root.dataset.step = index;
    picture.show(index, numbers);
    modes.symbols.classList.toggle("are-on", !numbers);
    modes.numbers.classList.toggle("are-on", numbers);
    back.disabled = index === 0;
    forward.disabled = index === last;
  }
  function pause() {
    clearTimeout(timer);
    timer = null;
    play.textContent = "▶ play";
    play.classList.remove("are-playing");
  }
  function tick() {
    if (index >= last) return pause(); // the last step stays on screen; Play is released
    show(index + 1);
    timer = setTimeout(tick, 1000 / speed);
  }
  function start() {
    if (index >= last) show(0); // at the end, Play starts over
    play.textContent = "❚❚ pause";
    play.classList.add("are-playing");
    timer = setTimeout(tick, 1000 / speed);
  }
  play.onclick = () => (timer ? pause() : start());
  back.onclick = () => { pause(); show(index - 1); };
  forward.onclick = () => { pause(); show(index + 1); };
  slider.oninput = () => { pause(); show(Number(slider.value)); };
  const fade = () => root.style.setProperty("--are-fade", `${Math.min(250, 400 / speed)}ms`);
  speeds.onchange = () => { speed = Number(speeds.value); fade(); };
  modes.symbols.onclick = () => { numbers = false; show(index); };
  modes.numbers.onclick = () => { numbers = true; show(index); };
  root.onkeydown = (event) => {
    const keys = { " ": () => play.onclick(), ArrowLeft: back.onclick, ArrowRight: forward.onclick };
    if (event.target.tagName !== "INPUT" && keys[event.key]) { event.preventDefault(); keys[event.key](); }
  };
  // Python may move it (anim.step = 3, anim.mode = "numbers", anim.speed = 4): follow
  model.on("change:step", () => { pause(); show(model.get("step")); });
  model.on("change:mode", () => { numbers = model.get("mode") === "numbers"; show(index); });
  model.on("change:speed", () => { speed = model.get("speed"); fade(); });
  fade();
  show(index);
  return () => pause();
}

export default { render };
