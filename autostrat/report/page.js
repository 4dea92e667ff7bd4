// The report's op graph: groups (layers) drawn collapsed, an op graph drawn inside a group when
// it is opened, a click on an op showing its strategy, layouts, origin, bound and alternatives.
// Reads the JSON in #plan-data (report/data.py). Any error shows in #errors and counts in
// body[data-errors], so a test (and a person) sees a page that did not draw.
"use strict";
(function () {
  const started = performance.now();
  const errorBox = document.getElementById("errors");
  function fail(message) {
    errorBox.hidden = false;
    errorBox.textContent += message + "\n";
    document.body.dataset.errors = String(Number(document.body.dataset.errors || 0) + 1);
  }
  window.addEventListener("error", (event) => fail("error: " + event.message));
  window.addEventListener("unhandledrejection", (event) => fail("error: " + event.reason));

  const data = JSON.parse(document.getElementById("plan-data").textContent);
  const colour = new Map(data.legend.map(([strategy, hex]) => [strategy, hex]));
  const COLUMN = 178, ROW = 34, NODE_W = 158, NODE_H = 24, PAD = 10;
  const largest = Math.max(1, ...data.edges.map((edge) => edge[2]), ...data.groups.map((group) => group.bytes_in));
  const inputsOf = new Map();  // op -> edges into it
  const outputsOf = new Map();
  for (const edge of data.edges) {
    (inputsOf.get(edge[1]) || inputsOf.set(edge[1], []).get(edge[1])).push(edge);
    (outputsOf.get(edge[0]) || outputsOf.set(edge[0], []).get(edge[0])).push(edge);
  }

  function escape(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }
  function bytes(value) {
    const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
    for (const [unit, size] of units) if (Math.abs(value) >= size) return (value / size).toPrecision(3) + " " + unit;
    return value + " B";
  }
  function width(value) {  // edge and flow widths: 1 px for nothing, up to 7 px for the most, on a log scale
    return value > 0 ? 1.5 + 5.5 * Math.log1p(value) / Math.log1p(largest) : 1;
  }
  function shortName(name, group) {
    // "bprop/blocks.0.attn.q/mat_mul" in group blocks.0 -> "∂ attn.q/mat_mul"
    let text = name.replace(/^bprop\//, "∂ ").replace(/^optimizer\//, "update ").replace(group + ".", "");
    return text.length > 24 ? text.slice(0, 11) + "…" + text.slice(-12) : text;
  }

  // The legend: strategies by colour, the most used first.
  const legend = document.getElementById("legend");
  legend.innerHTML = data.legend.slice(0, 12).map(([strategy, hex, count]) =>
    `<span class="key"><i style="background:${hex}"></i>${escape(strategy)} <small>${count}</small></span>`).join("") +
    (data.legend.length > 12 ? `<span class="key"><i style="background:#bab0ac"></i>${data.legend.length - 12} other strategies</span>` : "");

  // The groups, collapsed.
  const graph = document.getElementById("graph");
  graph.innerHTML = data.groups.map((group, number) => {
    const strategies = [...new Set(group.ops.map((op) => data.ops[op].strategy))];
    const strip = strategies.slice(0, 10).map((s) => `<i style="background:${colour.get(s)}" title="${escape(s)}"></i>`).join("");
    const flagged = group.ops.filter((op) => data.ops[op].bound_ratio > 1.5).length;
    return `<details class="group" data-group="${number}"><summary>` +
      `<span class="flow" style="width:${width(group.bytes_in).toFixed(1)}px" title="${escape(bytes(group.bytes_in))} into this group"></span>` +
      `<b>${escape(group.name)}</b> <span class="muted">${group.ops.length} op${group.ops.length === 1 ? "" : "s"} · ` +
      `${bytes(group.bytes_in)} in</span>${flagged ? ` <span class="flag">${flagged} above 1.5× bound</span>` : ""}` +
      `<span class="strip">${strip}</span></summary><div class="body"></div></details>`;
  }).join("");
  graph.addEventListener("toggle", (event) => {
    const box = event.target;
    if (box.open && !box.querySelector("svg")) box.querySelector(".body").innerHTML = groupSvg(Number(box.dataset.group));
  }, true);
  graph.addEventListener("click", (event) => {
    const node = event.target.closest("[data-op]");
    if (node) show(Number(node.dataset.op));
  });

  function position(op) {
    return [PAD + data.ops[op].column * COLUMN, PAD + data.ops[op].row * ROW];
  }
  function groupSvg(number) {
    const group = data.groups[number], members = new Set(group.ops);
    const columns = Math.max(...group.ops.map((op) => data.ops[op].column)) + 1;
    const rows = Math.max(...group.ops.map((op) => data.ops[op].row)) + 1;
    const parts = [];
    for (const op of group.ops) {
      for (const [from, to, sent, tensor] of inputsOf.get(op) || []) {
        if (!members.has(from)) continue;
        const [x1, y1] = position(from), [x2, y2] = position(to);
        const a = [x1 + NODE_W, y1 + NODE_H / 2], b = [x2, y2 + NODE_H / 2], bend = Math.max(20, (b[0] - a[0]) / 2);
        parts.push(`<path class="edge${sent ? " moves" : ""}" d="M${a[0]},${a[1]} C${a[0] + bend},${a[1]} ${b[0] - bend},${b[1]} ${b[0]},${b[1]}" ` +
          `stroke-width="${width(sent).toFixed(2)}"><title>${escape(tensor)}: ${bytes(sent)}</title></path>`);
      }
    }
    for (const op of group.ops) {
      const entry = data.ops[op], [x, y] = position(op);
      const flagged = entry.bound_ratio > 1.5 ? " flagged" : "";
      parts.push(`<g class="op${flagged}" data-op="${op}" transform="translate(${x},${y})">` +
        `<rect width="${NODE_W}" height="${NODE_H}" rx="4" fill="${colour.get(entry.strategy)}"></rect>` +
        `<text x="6" y="16">${escape(shortName(entry.name, group.name))}</text>` +
        `<title>${escape(entry.name)}\n${escape(entry.type)} ${escape(entry.strategy)}</title></g>`);
    }
    const w = PAD * 2 + (columns - 1) * COLUMN + NODE_W, h = PAD * 2 + (rows - 1) * ROW + NODE_H;
    return `<svg class="ops" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img" ` +
      `aria-label="ops of ${escape(group.name)}">${parts.join("")}</svg>`;
  }

  const details = document.getElementById("details");
  function show(op) {
    const entry = data.ops[op];
    for (const node of graph.querySelectorAll(".op.selected")) node.classList.remove("selected");
    for (const node of graph.querySelectorAll(`[data-op="${op}"]`)) node.classList.add("selected");
    const rows = entry.inputs.map((input, index) => {
      const moved = input.bytes === undefined ? "in place" :
        input.shares ? `shares ${escape(input.shares)}` : `${bytes(input.bytes)}: ${escape(input.steps.join(", "))}`;
      return `<tr><td>${index}</td><td>${escape(input.tensor)}<br><small>${escape(input.dtype)}[${input.shape.join(", ")}] ` +
        `${escape(input.kind)}</small></td><td>${input.held ? escape(input.held) + " →<br>" : ""}${escape(input.wanted)}</td>` +
        `<td>${moved}</td></tr>`;
    }).join("");
    const outputs = entry.outputs.map((o) => `<li>${escape(o.tensor)}: ${escape(o.layout)}</li>`).join("");
    const bound = entry.bound_bytes === undefined ? "" :
      `<p class="${entry.bound_ratio > 1.5 ? "flag" : ""}">lower bound: ${bytes(entry.bound_bytes)}; ` +
      `charged to this op: ${bytes(entry.charged)}${entry.bound_ratio === null ? "" : `, ${entry.bound_ratio.toFixed(2)}×`}</p>`;
    const alternatives = (entry.alternatives || []).map((alt) =>
      `<tr><td>${escape(alt.strategy)}</td><td>${alt.delta_bytes === null ? "unreachable" : (alt.delta_bytes > 0 ? "+" : "") + bytes(alt.delta_bytes)}</td></tr>`).join("");
    const users = (outputsOf.get(op) || []).map(([, to, sent]) =>
      `<li><a href="#" data-show="${to}">${escape(data.ops[to].name)}</a> ${sent ? bytes(sent) : ""}</li>`).join("");
    details.innerHTML = `<h3>${escape(entry.name)}</h3>` +
      `<p><span class="swatch" style="background:${colour.get(entry.strategy)}"></span><b>${escape(entry.strategy)}</b> ` +
      `<span class="muted">${escape(entry.type)}, ${escape(entry.phase)}</span></p>` +
      `<p>origin: ${linkOrigin(entry.origin)}</p>${bound}` +
      `<table><tr><th>#</th><th>tensor</th><th>layout</th><th>redistribution</th></tr>${rows}</table>` +
      `<p>outputs:</p><ul>${outputs}</ul>` + (users ? `<p>read by:</p><ul>${users}</ul>` : "") +
      (alternatives ? `<p>alternatives (bytes per device, this op alone changed):</p><table>${alternatives}</table>` :
        "<p class=\"muted\">alternatives: not ranked in this report (too many ops or devices); explain ranks them</p>") +
      `<p class="muted">autostrat explain PLAN.json ${escape(entry.name)}</p>`;
  }
  const index = new Map(data.ops.map((op, number) => [op.name, number]));
  function linkOrigin(origin) {
    const match = origin.match(/^(propagated from|follows|backward of) (.+)$/);
    if (!match || !index.has(match[2])) return escape(origin);
    return `${match[1]} <a href="#" data-show="${index.get(match[2])}">${escape(match[2])}</a>`;
  }
  function reveal(op) {
    const box = graph.querySelector(`details[data-group="${data.ops[op].group}"]`);
    if (!box.open) {
      box.open = true;
      box.querySelector(".body").innerHTML = groupSvg(Number(box.dataset.group));
    }
    show(op);
    const node = box.querySelector(`[data-op="${op}"]`);
    if (node) node.scrollIntoView({block: "center", inline: "center"});
  }
  document.addEventListener("click", (event) => {
    const link = event.target.closest("[data-show], [data-find]");
    if (link) {
      event.preventDefault();
      reveal(link.dataset.show !== undefined ? Number(link.dataset.show) : index.get(link.dataset.find));
    }
  });
  document.getElementById("find").addEventListener("change", (event) => {
    const wanted = event.target.value.trim();
    const found = index.has(wanted) ? index.get(wanted) : data.ops.findIndex((op) => op.name.includes(wanted));
    if (wanted && found >= 0) reveal(found);
  });
  document.getElementById("expand").addEventListener("click", () => {
    for (const box of graph.querySelectorAll("details")) box.open = true;
  });
  document.getElementById("collapse").addEventListener("click", () => {
    for (const box of graph.querySelectorAll("details")) box.open = false;
  });
  // Open the first group that moves bytes (a small plan: every group), so the page shows an op graph at once.
  if (data.ops.length <= 60) {
    for (const box of graph.querySelectorAll("details")) {
      box.open = true;
      box.querySelector(".body").innerHTML = groupSvg(Number(box.dataset.group));
    }
  }
  if (data.groups.length) {
    const first = data.ops.findIndex((op) => op.bytes_in > 0);
    reveal(first >= 0 ? first : 0);
    window.scrollTo(0, 0);
  }
  // When the page was ready (ms since navigation began; the script's own share) and where its
  // parts are drawn, for a reader of the DOM: the browser test and the opening-time benchmark.
  document.body.dataset.readyMs = performance.now().toFixed(1);
  document.body.dataset.scriptMs = (performance.now() - started).toFixed(1);
  const box = (element) => {
    const r = element.getBoundingClientRect();
    return [Math.round(r.left + window.scrollX), Math.round(r.top + window.scrollY), Math.round(r.width), Math.round(r.height)];
  };
  const parts = {summary: document.getElementById("summary"), graph: graph, details: details};
  for (const figure of document.querySelectorAll("figure")) parts[figure.id] = figure;
  document.body.dataset.boxes = JSON.stringify(Object.fromEntries(Object.entries(parts).map(([k, e]) => [k, box(e)])));
})();
