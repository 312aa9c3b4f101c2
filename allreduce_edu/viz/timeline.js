// The per-rank timeline of a real run, in the browser (allreduce_edu.viz.Timeline).
//
// One lane per rank: sends above the line (coloured by phase), receives below (light while the rank
// waits for the message, dark while it takes it in). Hover a bar for its step, chunk, bytes and
// times. Python sends the bars once in `data`; hovering never talks to the kernel.

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function niceStep(span, count) { // 1, 2 or 5 times a power of ten, about `count` ticks
  const raw = span / count, power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
}

function render({ model, el }) {
  const data = model.get("data");
  const left = 70, right = 16, top = 44, lane = 46, width = 900;
  const rows = Math.ceil(data.legend.length / 5), bottom = top + lane * data.ranks.length;
  const height = bottom + 48 + 18 * rows;
  const root = document.createElement("div");
  root.className = "are-timeline";
  root.style.position = "relative";
  el.appendChild(root);
  const picture = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, class: "are-picture",
                               role: "img", "aria-label": data.title }, root);
  const tip = document.createElement("div");
  tip.className = "are-tip";
  tip.style.display = "none";
  root.appendChild(tip);
  svg("text", { x: left, y: 22, class: "are-caption" }, picture).textContent = data.title;

  const span = Math.max(data.span_ms, 1e-3), x = (t) => left + (t / span) * (width - left - right);
  const row = new Map(data.ranks.map((r, i) => [r, top + i * lane]));
  const step = niceStep(span, 8);
  for (let t = 0; t <= span + 1e-9; t += step) { // the time axis and its grid
    svg("line", { x1: x(t), x2: x(t), y1: top - 4, y2: top + lane * data.ranks.length, stroke: "#e4e4e4" }, picture);
    svg("text", { x: x(t), y: top + lane * data.ranks.length + 16, "text-anchor": "middle",
                  class: "are-key-text" }, picture).textContent = `${+t.toFixed(6)}`;
  }
  svg("text", { x: left + (width - left - right) / 2, y: top + lane * data.ranks.length + 34,
                "text-anchor": "middle", class: "are-key-text" }, picture).textContent = "time since the first message (ms)";
  for (const [rank, y] of row) {
    svg("text", { x: left - 8, y: y + lane / 2 + 4, "text-anchor": "end", class: "are-rank" }, picture).textContent = `rank ${rank}`;
    svg("line", { x1: left, x2: width - right, y1: y + lane / 2, y2: y + lane / 2, stroke: "#999" }, picture);
  }
  for (const bar of data.bars) {
    const y = row.get(bar.rank) + (bar.kind === "send" ? 4 : lane / 2 + 2);
    const rect = svg("rect", { x: x(bar.t0), y, width: Math.max(x(bar.t1) - x(bar.t0), 1.5),
                               height: lane / 2 - 6, fill: bar.colour, class: `are-bar are-${bar.kind}` }, picture);
    rect.dataset.detail = bar.detail;
    rect.addEventListener("mouseenter", () => { tip.textContent = bar.detail; tip.style.display = "block"; });
    rect.addEventListener("mousemove", (event) => {
      const box = root.getBoundingClientRect();
      tip.style.left = `${event.clientX - box.left + 12}px`;
      tip.style.top = `${event.clientY - box.top + 12}px`;
    });
    rect.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  }
  data.legend.forEach(([label, colour], i) => { // the key, under the axis
    const lx = left + 160 * (i % 5), ly = bottom + 58 + 18 * Math.floor(i / 5);
    svg("rect", { x: lx, y: ly - 10, width: 12, height: 12, fill: colour }, picture);
    svg("text", { x: lx + 16, y: ly, class: "are-key-text" }, picture).textContent = label;
  });
}

export default { render };
