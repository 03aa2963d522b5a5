// Cluster: a heat map of every node and every GPU, grouped by network tier (spine,
// rack). A GPU is drawn free, whole, filled to its share (fractions), as its MIG
// instances' memory slices, or hatched when a reservation holds it; coloured by
// tenant or by how much of it is allocated. Hover or focus a GPU for who holds it;
// select a node (click, or arrows and Enter) for its details. The per-model
// fragmentation summary says how many nodes have how many whole GPUs free.
//
// Data: GET /v1/cluster/gpus once, then /v1/cluster/watch: each event replaces one
// node's drawing in place (its position never moves). The first screen of racks is
// drawn at once, the rest right after in short chunks (see `draw`).

import { api, stream } from "./api.js";
import { esc, fmtAge, fmtBytes, fmtCpu, fmtGpu, fmtTime, h, notice, OTHER_TENANT, tenantColor, utilColor, UTIL_STEPS } from "./util.js";

const S = 16; // a GPU cell
const G = 2; // gap between cells
const P = 3; // padding inside a node
const SHARD = "tessera.io/shard";
const CLASSES = "tessera.io/runtime-classes";

function layout(n) {
  const count = Math.max(1, n);
  const cols = count <= 4 ? count : Math.ceil(count / 2);
  return { cols, rows: Math.ceil(count / cols) };
}

function tiers(node) {
  const net = node.net || [];
  if (net.length === 0) return ["no network tier", null];
  if (net.length === 1) return [net[0], null];
  return [net[net.length - 1], net[0]];
}

function holderName(hd) {
  if (!hd) return "";
  if (hd.other || !hd.tenant) return "another tenant";
  return `${hd.tenant}/${hd.job}/${hd.task}`;
}

function held(r) {
  if (!r) return "";
  if (r.other || !r.tenant) return "a gang of another tenant";
  return `${r.tenant}/${r.job}`;
}

/** What one GPU is, in words (tooltip, details, screen readers). */
export function gpuText(node, g) {
  const lines = [`${node.name} · GPU ${g.index}${node.model ? ` · ${node.model}` : ""}${g.nvlink !== undefined ? ` · NVLink ${g.nvlink}` : ""}`];
  if (g.slices) {
    lines.push(`MIG on (${g.slices} memory slices)`);
    for (const m of g.mig || []) {
      const hd = m.holder !== undefined ? node.holders[m.holder] : null;
      lines.push(`  ${m.profile} @${m.start}: ${hd ? `${holderName(hd)} since ${fmtTime(hd.since)}` : m.busy ? "in use" : "idle"}`);
    }
  }
  for (const [i, milli] of g.uses || []) {
    const hd = node.holders[i];
    if (hd.kind === "mig") continue;
    const what = milli >= 1000 ? "whole" : `${Math.round(milli / 10)}% share`;
    lines.push(`${what}: ${holderName(hd)}${hd.state ? ` (${hd.state})` : ""} since ${fmtTime(hd.since)}`);
  }
  if (g.reserved !== undefined) {
    const r = node.reservations[g.reserved];
    lines.push(`reserved for ${held(r)}${r.reason ? `: ${r.reason}` : ""}`);
  }
  if (!g.slices && !(g.uses || []).length && g.reserved === undefined) lines.push("free");
  return lines.join("\n");
}

/** The wire form leaves empty lists out: fill them in once, as a node arrives. */
function norm(n) {
  for (const k of ["gpus", "holders", "reservations", "conditions", "taints", "net"]) n[k] = n[k] || [];
  n.labels = n.labels || {};
  return n;
}

const nodesText = (n) => `${n} node${n === 1 ? "" : "s"}`;

function freeCount(node) {
  return node.gpus.filter((g) => !(g.uses || []).length && g.reserved === undefined && !g.slices).length;
}

/** One node as an SVG string (the heat map is built as one string, then parsed once). */
function nodeSvg(node, o) {
  const { cols, rows } = layout(node.gpus.length);
  const w = P * 2 + cols * (S + G) - G;
  const hgt = P * 2 + rows * (S + G) - G;
  const color = (hd, frac) => (o.color === "util" ? utilColor(frac) : hd.other || !hd.tenant ? OTHER_TENANT : tenantColor(hd.tenant, o.own));
  let cells = "";
  node.gpus.forEach((g, k) => {
    const x = P + (k % cols) * (S + G);
    const y = P + Math.floor(k / cols) * (S + G);
    const uses = g.uses || [];
    const sum = uses.reduce((a, u) => a + u[1], 0);
    let state = "free";
    let body = "";
    if (g.slices) {
      state = "mig";
      body += `<rect x="${x}" y="${y}" width="${S}" height="${S}" fill="#ffffff" stroke="#57606a" stroke-width="0.75"/>`;
      for (const m of g.mig || []) {
        const hd = m.holder !== undefined ? node.holders[m.holder] : null;
        const mx = x + (m.start / g.slices) * S;
        const mw = Math.max(1, (m.size / g.slices) * S - 0.75);
        const fill = hd ? color(hd, 1) : m.busy ? "#8c959f" : "#ffffff";
        const who = hd ? ` data-held="${esc(hd.other ? "other" : `${hd.tenant}/${hd.job}`)}"` : "";
        body += `<rect class="mig" data-mig="${esc(m.profile)}@${m.start}"${who} x="${mx.toFixed(2)}" y="${y + 1}" width="${mw.toFixed(2)}" height="${S - 2}" fill="${fill}" stroke="#57606a" stroke-width="0.5"/>`;
      }
    } else if (uses.length && sum >= 1000 && uses.length === 1) {
      state = "whole";
      body += `<rect x="${x}" y="${y}" width="${S}" height="${S}" fill="${color(node.holders[uses[0][0]], 1)}"/>`;
    } else if (uses.length) {
      state = "share";
      body += `<rect class="c0" x="${x}" y="${y}" width="${S}" height="${S}"/>`;
      let top = y + S;
      for (const [i, milli] of uses) {
        const hh = (Math.min(milli, 1000) / 1000) * S;
        top -= hh;
        body += `<rect x="${x}" y="${top.toFixed(2)}" width="${S}" height="${hh.toFixed(2)}" fill="${color(node.holders[i], Math.min(1, sum / 1000))}"/>`;
      }
    } else {
      body += `<rect class="c0" x="${x}" y="${y}" width="${S}" height="${S}"/>`;
    }
    let res = "";
    if (g.reserved !== undefined) {
      if (state === "free") state = "reserved";
      const r = node.reservations[g.reserved];
      res = ` data-reserved="${esc(r.other ? "other" : `${r.tenant}/${r.job}`)}"`;
      body += `<rect x="${x}" y="${y}" width="${S}" height="${S}" fill="url(#hatch)" stroke="#7a3fa0" stroke-width="1.25"/>`;
    }
    const share = state === "share" ? ` data-share="${sum}"` : "";
    // A free GPU is one element (most cells at scale): fewer to parse and lay out.
    if (state === "free") cells += `<rect class="gpu c0" data-gpu="${g.index}" data-state="free" x="${x}" y="${y}" width="${S}" height="${S}"/>`;
    else cells += `<g class="gpu" data-gpu="${g.index}" data-state="${state}"${share}${res}>${body}</g>`;
  });
  const cls = ["node"];
  if ((node.conditions || []).length || (node.taints || []).some((t) => t.startsWith("tessera.io/device-view-mismatch"))) cls.push("cond");
  if (node.unschedulable) cls.push("unsched");
  const free = freeCount(node);
  const marks = (node.conditions || []).map((c) => c.kind).join(", ");
  const label = `${node.name}: ${node.model ? `${node.gpus.length} × ${node.model}` : "no GPUs"}, ${free} free${node.unschedulable ? ", cordoned" : ""}${marks ? `, ${marks}` : ""}`;
  let mark = "";
  if (cls.includes("cond")) mark = `<circle cx="${w - 4}" cy="4" r="3.5" fill="#c62828"/>`;
  return `<svg class="${cls.join(" ")}" data-node="${esc(node.name)}" width="${w}" height="${hgt}" viewBox="0 0 ${w} ${hgt}" role="button" tabindex="-1" aria-label="${esc(label)}"><rect class="frame" x="0.5" y="0.5" width="${w - 1}" height="${hgt - 1}" rx="2"/>${cells}${mark}</svg>`;
}

function matches(node, f) {
  if (f.model && node.model !== f.model) return false;
  if (f.shard && (node.labels || {})[SHARD] !== f.shard) return false;
  if (f.cls && !((node.labels || {})[CLASSES] || "").split(",").map((s) => s.trim()).includes(f.cls)) return false;
  if (f.label) {
    const [k, v] = f.label.split("=");
    const have = (node.labels || {})[k.trim()];
    if (have === undefined) return false;
    if (v !== undefined && have !== v.trim()) return false;
  }
  if (f.q && !node.name.includes(f.q)) return false;
  if (f.cond && !(node.conditions || []).length && !node.unschedulable && !(node.taints || []).length) return false;
  return true;
}

function legend(o) {
  const sw = (fill, extra = "") => `<svg width="14" height="14" aria-hidden="true"><rect x="0.5" y="0.5" width="13" height="13" fill="${fill}" stroke="#57606a" stroke-width="0.75"${extra}/></svg>`;
  const items = [
    [sw("#eef1f4"), "free"],
    [`<svg width="14" height="14" aria-hidden="true"><rect x="0.5" y="0.5" width="13" height="13" fill="#eef1f4" stroke="#8c959f"/><rect x="0.5" y="7" width="13" height="6.5" fill="${o.color === "util" ? utilColor(0.5) : tenantColor(o.own, o.own)}"/></svg>`, "fraction, filled to its share"],
    [`<svg width="14" height="14" aria-hidden="true"><rect x="0.5" y="0.5" width="13" height="13" fill="#fff" stroke="#57606a"/><rect x="1" y="1.5" width="6" height="11" fill="${o.color === "util" ? utilColor(1) : tenantColor(o.own, o.own)}"/><rect x="7.5" y="1.5" width="5.5" height="11" fill="#fff" stroke="#57606a" stroke-width="0.5"/></svg>`, "MIG instances (slices; white: idle)"],
    [sw("url(#hatch)", ' stroke="#7a3fa0"'), "held by a reservation"],
    [`<svg width="14" height="14" aria-hidden="true"><circle cx="7" cy="7" r="5" fill="#c62828"/></svg>`, "node condition"],
  ];
  if (o.color === "util") {
    items.unshift([UTIL_STEPS.map((c, i) => `<rect x="${i * 10}" y="0" width="10" height="14" fill="${c}"/>`).join("").replace(/^/, '<svg width="50" height="14" aria-hidden="true">') + "</svg>", "allocated 20% … 100%"]);
  } else {
    items.unshift([sw(tenantColor(o.own, o.own)), `${o.own} (yours)`], [sw(OTHER_TENANT), o.all ? "other tenants (each its colour)" : "another tenant"]);
  }
  return items.map(([s, t]) => `<span>${s} ${esc(t)}</span>`).join("");
}

export function mount(el, ctx) {
  ctx.title("Cluster");
  const q = ctx.query;
  const f = {
    model: q.get("model") || "",
    label: q.get("label") || "",
    shard: q.get("shard") || "",
    cls: q.get("class") || "",
    q: q.get("q") || "",
    cond: q.get("conditions") === "1",
  };
  const o = { color: q.get("color") === "util" ? "util" : "tenant", own: ctx.tenant, all: false };
  let selected = q.get("node") || null;
  const nodes = new Map();
  const els = new Map();
  let frag = [];
  let sub = null;
  let closed = false;
  const t0 = performance.now();

  const summary = h("div", { id: "frag" });
  const legendEl = h("div", { class: "legend", id: "legend" });
  const map = h("div", { class: "map", id: "heatmap", role: "region", "aria-label": "GPU heat map: one button per node; arrow keys move, Enter shows details" });
  const tip = h("div", { class: "tip", hidden: true, role: "tooltip", id: "tip" });
  const details = h("aside", { class: "details", id: "details", "aria-label": "Node details" }, h("p", { class: "muted" }, "Select a node (click it, or focus the map and use the arrow keys and Enter) to see its GPUs, who holds them and since when."));
  const counts = h("span", { class: "sub", id: "counts" });
  const selects = {};
  const mkSelect = (id, label, key) => {
    const s = h("select", { id, onchange: () => { f[key] = s.value; ctx.setQuery({ [id]: s.value }); applyFilter(); } });
    selects[key] = s;
    return h("div", { class: "field" }, h("label", { for: id }, label), s);
  };
  const textField = (id, label, key, ph) => {
    const i = h("input", { id, value: f[key], placeholder: ph, oninput: () => { f[key] = i.value.trim(); ctx.setQuery({ [id]: f[key] }); applyFilter(); } });
    return h("div", { class: "field" }, h("label", { for: id }, label), i);
  };
  const colorSel = h("select", { id: "color", onchange: () => { o.color = colorSel.value; ctx.setQuery({ color: o.color === "util" ? "util" : null }); draw(); } },
    h("option", { value: "tenant", selected: o.color === "tenant" }, "tenant"),
    h("option", { value: "util", selected: o.color === "util" }, "utilisation (allocated share)"));
  const condBox = h("input", { type: "checkbox", id: "conditions", checked: f.cond, onchange: () => { f.cond = condBox.checked; ctx.setQuery({ conditions: f.cond ? "1" : null }); applyFilter(); } });
  const toolbar = h("div", { class: "toolbar", role: "search", "aria-label": "Filter nodes" },
    h("div", { class: "field" }, h("label", { for: "color" }, "Colour by"), colorSel),
    mkSelect("model", "GPU model", "model"),
    textField("label", "Label (key=value)", "label", "nvidia.com/gpu.product=H100"),
    mkSelect("shard", "Shard", "shard"),
    mkSelect("class", "Runtime class", "cls"),
    textField("q", "Node name", "q", "node-12"),
    h("div", { class: "field" }, h("label", { for: "conditions" }, "Only nodes with conditions"), condBox));

  el.append(
    h("h1", {}, "Cluster ", counts),
    toolbar,
    h("h2", { id: "frag-h" }, "Fragmentation: free whole GPUs by node"),
    summary,
    h("h2", {}, "GPUs by network tier"),
    h("div", { class: "legend-wrap" }, legendEl),
    h("div", { class: "cluster" }, map, details),
    tip,
  );
  // The hatch pattern the reserved cells use (one per document).
  if (!document.getElementById("hatch")) {
    const defs = h("div", { "aria-hidden": "true", class: "defs" });
    defs.innerHTML = '<svg width="0" height="0" focusable="false"><defs><pattern id="hatch" patternUnits="userSpaceOnUse" width="4" height="4" patternTransform="rotate(45)"><rect width="4" height="4" fill="#efe4f5"/><rect width="2" height="4" fill="#7a3fa0"/></pattern></defs></svg>';
    document.body.append(defs);
  }

  function fillSelect(key, values) {
    const s = selects[key];
    const cur = f[key];
    s.replaceChildren(h("option", { value: "" }, "any"), ...[...values].sort().map((v) => h("option", { value: v, selected: v === cur }, v)));
    s.disabled = values.size === 0 && !cur;
  }

  function facets() {
    const models = new Set();
    const shards = new Set();
    const classes = new Set();
    for (const n of nodes.values()) {
      if (n.model) models.add(n.model);
      const l = n.labels || {};
      if (l[SHARD]) shards.add(l[SHARD]);
      for (const c of (l[CLASSES] || "").split(",")) if (c.trim()) classes.add(c.trim());
    }
    fillSelect("model", models);
    fillSelect("shard", shards);
    fillSelect("cls", classes);
  }

  function drawSummary() {
    if (!frag.length) { summary.replaceChildren(h("p", { class: "muted" }, "No GPU nodes.")); return; }
    summary.replaceChildren(h("table", { class: "frag" },
      h("thead", {}, h("tr", {}, ["GPU model", "Nodes", "GPUs", "Free", "Shared", "MIG", "Reserved", "Free blocks"].map((c, i) => h("th", { class: i > 0 && i < 7 ? "num" : null, scope: "col" }, c)))),
      h("tbody", {}, frag.map((m) => h("tr", { "data-model": m.model },
        h("th", { scope: "row" }, m.model),
        ...[m.nodes, m.gpus, m.free, m.shared, m.mig, m.reserved].map((v) => h("td", { class: "num" }, v)),
        h("td", { class: "blocks" }, m.full ? `${m.text}; ${m.full} full` : m.text))))));
  }

  function groups() {
    const g = new Map();
    for (const n of nodes.values()) {
      const [top, rack] = tiers(n);
      if (!g.has(top)) g.set(top, new Map());
      const racks = g.get(top);
      const r = rack ?? "";
      if (!racks.has(r)) racks.set(r, []);
      racks.get(r).push(n);
    }
    return [...g.entries()].sort((a, b) => a[0].localeCompare(b[0], undefined, { numeric: true }));
  }

  // The map is drawn in two steps: the racks that fill the first screen at once,
  // then the rest in chunks of a few milliseconds each, so that the first paint
  // does not wait for parsing thousands of nodes below the fold. A node not drawn
  // yet is kept current in `nodes`; its chunk draws what it is by then. Counts and
  // filters are worked out from the data, so they are right from the first paint.
  let gen = 0;
  let lists = []; // per div.nodes, in order: { div, names }
  let pending = []; // those not drawn yet
  const later = new Set(); // their nodes' names

  /** Nodes to draw at once: about one and a half screens of them. */
  function firstScreen() {
    return Math.max(200, Math.ceil((window.innerWidth * window.innerHeight) / (80 * 46) * 1.5));
  }

  function register(div) {
    for (const s of div.querySelectorAll("svg.node")) {
      const name = s.dataset.node;
      if (!matches(nodes.get(name), f)) s.classList.add("hidden");
      if (selected === name) s.classList.add("sel");
      els.set(name, s);
    }
  }

  function draw() {
    const start = performance.now();
    const my = ++gen;
    const budget = firstScreen();
    let drawn = 0;
    let html = "";
    const names = [];
    const now = [];
    for (const [top, racks] of groups()) {
      const all = [...racks.values()].flat();
      html += `<section class="tier" data-tier="${esc(top)}"><h3>${esc(top)} <span class="sub" data-count>${nodesText(all.length)}</span></h3>`;
      for (const [rack, list] of [...racks.entries()].sort((a, b) => a[0].localeCompare(b[0], undefined, { numeric: true }))) {
        list.sort((a, b) => a.name.localeCompare(b.name, undefined, { numeric: true }));
        if (rack) html += `<section class="rack" data-rack="${esc(rack)}"><h4 class="sub">${esc(rack)} <span data-count>${nodesText(list.length)}</span></h4>`;
        const at = drawn < budget;
        html += `<div class="nodes">${at ? list.map((n) => nodeSvg(n, o)).join("") : ""}</div>`;
        drawn += at ? list.length : 0;
        names.push(list.map((n) => n.name));
        now.push(at);
        if (rack) html += "</section>";
      }
      html += "</section>";
    }
    map.innerHTML = html || '<p class="muted">No nodes are registered.</p>';
    els.clear();
    later.clear();
    lists = [...map.querySelectorAll("div.nodes")].map((div, i) => ({ div, names: names[i] }));
    pending = lists.filter((_, i) => !now[i]);
    for (const p of pending) for (const n of p.names) later.add(n);
    for (const s of map.querySelectorAll("svg.node")) els.set(s.dataset.node, s);
    legendEl.innerHTML = legend(o);
    applyFilter();
    if (selected) showDetails(selected, false);
    window.__console.paints.clusterBuildMs = performance.now() - start;
    if (pending.length) setTimeout(() => drawLater(my), 0);
    else done();
  }

  function done() {
    requestAnimationFrame(() => { window.__console.paints.clusterComplete = performance.now(); });
  }

  function drawLater(my) {
    if (my !== gen || closed) return;
    const t = performance.now();
    while (pending.length && performance.now() - t < 12) {
      const p = pending.shift();
      p.div.innerHTML = p.names.filter((n) => nodes.has(n)).map((n) => nodeSvg(nodes.get(n), o)).join("");
      for (const n of p.names) later.delete(n);
      register(p.div);
    }
    // The map's one tab stop, when the nodes shown so far had none (a filter that
    // matches only racks drawn late).
    if (!map.querySelector('svg.node[tabindex="0"]')) map.querySelector("svg.node:not(.hidden)")?.setAttribute("tabindex", "0");
    if (pending.length) setTimeout(() => drawLater(my), 0);
    else done();
  }

  function applyFilter() {
    let first = null;
    for (const [name, s] of els) {
      const ok = matches(nodes.get(name), f);
      s.classList.toggle("hidden", !ok);
      if (ok && !first) first = s;
    }
    // Counts from the data: nodes not drawn yet count too.
    let shown = 0;
    const perTier = new Map();
    for (const { div, names } of lists) {
      const n = names.filter((x) => nodes.has(x) && matches(nodes.get(x), f)).length;
      shown += n;
      const rack = div.parentElement.matches("section.rack") ? div.parentElement : null;
      if (rack) {
        rack.hidden = n === 0;
        const c = rack.querySelector(":scope > h4 [data-count]");
        if (c) c.textContent = nodesText(n);
      }
      const tier = div.closest("section.tier");
      perTier.set(tier, (perTier.get(tier) || 0) + n);
    }
    for (const [tier, n] of perTier) {
      tier.hidden = n === 0;
      const c = tier.querySelector(":scope > h3 [data-count]");
      if (c) c.textContent = nodesText(n);
    }
    const gpus = [...nodes.values()].reduce((a, n) => a + n.gpus.length, 0);
    counts.textContent = `${shown} of ${nodes.size} nodes, ${gpus} GPUs`;
    // Roving focus: the map is one tab stop.
    const cur = map.querySelector('svg.node[tabindex="0"]');
    if (!cur || cur.classList.contains("hidden")) {
      cur?.setAttribute("tabindex", "-1");
      first?.setAttribute("tabindex", "0");
    }
    map.tabIndex = shown ? -1 : 0;
  }

  function showDetails(name, focus = true) {
    for (const s of map.querySelectorAll("svg.node.sel")) s.classList.remove("sel");
    const n = nodes.get(name);
    if (!n) { details.replaceChildren(notice(`No node ${name}.`)); return; }
    selected = name;
    els.get(name)?.classList.add("sel");
    const jobLink = (hd) => (hd.other || !hd.tenant ? "another tenant" : hd.tenant === ctx.tenant ? h("a", { href: `/ui/jobs/${encodeURIComponent(hd.job)}` }, `${hd.job}/${hd.task}`) : `${hd.tenant}/${hd.job}/${hd.task}`);
    const gpuItem = (g) => {
      const parts = [h("strong", {}, `GPU ${g.index}`), g.nvlink !== undefined ? ` · NVLink ${g.nvlink}` : ""];
      const uses = (g.uses || []).filter(([i]) => n.holders[i].kind !== "mig");
      const lines = [];
      for (const [i, milli] of uses) {
        const hd = n.holders[i];
        lines.push(h("div", {}, `${milli >= 1000 ? "whole" : `${Math.round(milli / 10)}% share`}: `, jobLink(hd), hd.state ? ` (${hd.state})` : "", h("span", { class: "muted" }, ` since ${fmtTime(hd.since)} (${fmtAge(hd.since)})`)));
      }
      if (g.slices) {
        for (const m of g.mig || []) {
          const hd = m.holder !== undefined ? n.holders[m.holder] : null;
          lines.push(h("div", { "data-mig": `${m.profile}@${m.start}` }, `MIG ${m.profile} @ slice ${m.start}: `, hd ? jobLink(hd) : m.busy ? "in use" : "idle", hd ? h("span", { class: "muted" }, ` since ${fmtTime(hd.since)}`) : ""));
        }
      }
      if (g.reserved !== undefined) {
        const r = n.reservations[g.reserved];
        lines.push(h("div", {}, `reserved for ${held(r)}`, r.reason ? h("span", { class: "muted" }, `: ${r.reason}`) : ""));
      }
      if (!lines.length) lines.push(h("div", { class: "muted" }, "free"));
      return h("li", { "data-gpu": g.index }, h("div", {}, ...parts), ...lines);
    };
    const cpu = n.holders.filter((x) => x.kind === "cpu");
    details.replaceChildren(
      h("h2", {}, n.name),
      h("dl", { class: "kv" },
        h("dt", {}, "GPUs"), h("dd", {}, n.model ? `${n.gpus.length} × ${n.model} (${fmtBytes(n.gpu_memory)})` : "none"),
        h("dt", {}, "Network"), h("dd", {}, (n.net || []).join(" ← ") || "–"),
        h("dt", {}, "CPU"), h("dd", {}, `${fmtCpu(n.cpu_used)} of ${fmtCpu(n.cpu_milli)} cores requested`),
        h("dt", {}, "State"), h("dd", {}, n.unschedulable ? "cordoned (no new tasks)" : "schedulable"),
        (n.taints || []).length ? [h("dt", {}, "Taints"), h("dd", {}, n.taints.join(", "))] : null,
        Object.keys(n.labels || {}).length ? [h("dt", {}, "Labels"), h("dd", {}, Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(", "))] : null),
      (n.conditions || []).length ? h("div", { role: "note" }, h("h3", {}, "Conditions"), h("ul", {}, n.conditions.map((c) => h("li", {}, h("strong", {}, c.kind), c.reason ? ` (${c.reason})` : "", c.message ? `: ${c.message}` : "")))) : null,
      h("h3", {}, "GPUs"),
      h("ul", { class: "gpu-list" }, n.gpus.map(gpuItem)),
      cpu.length ? [h("h3", {}, "CPU-only tasks"), h("ul", {}, cpu.map((hd) => h("li", {}, jobLink(hd))))] : null,
    );
    if (focus) ctx.setQuery({ node: name });
  }

  // Hover: a tooltip for the GPU under the pointer.
  map.addEventListener("mouseover", (e) => {
    const cell = e.target.closest?.(".gpu");
    const svg = e.target.closest?.("svg.node");
    if (!cell || !svg) { tip.hidden = true; return; }
    const n = nodes.get(svg.dataset.node);
    const g = n?.gpus.find((x) => String(x.index) === cell.dataset.gpu);
    if (!g) return;
    tip.textContent = gpuText(n, g);
    tip.hidden = false;
    const r = cell.getBoundingClientRect();
    tip.style.left = `${Math.min(window.innerWidth - 320, r.right + 8)}px`;
    tip.style.top = `${Math.max(4, r.top - 8)}px`;
  });
  map.addEventListener("mouseleave", () => { tip.hidden = true; });
  map.addEventListener("click", (e) => {
    const svg = e.target.closest?.("svg.node");
    if (!svg) return;
    setActive(svg);
    showDetails(svg.dataset.node);
  });
  function setActive(svg) {
    for (const s of map.querySelectorAll('svg.node[tabindex="0"]')) s.setAttribute("tabindex", "-1");
    svg.setAttribute("tabindex", "0");
  }
  map.addEventListener("keydown", (e) => {
    const cur = e.target.closest?.("svg.node");
    if (!cur) return;
    const visible = [...els.values()].filter((s) => !s.classList.contains("hidden"));
    const i = visible.indexOf(cur);
    let next = null;
    if (e.key === "ArrowRight") next = visible[i + 1];
    else if (e.key === "ArrowLeft") next = visible[i - 1];
    else if (e.key === "Home") next = visible[0];
    else if (e.key === "End") next = visible[visible.length - 1];
    else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      const r = cur.getBoundingClientRect();
      const down = e.key === "ArrowDown";
      let best = null;
      let bestD = Infinity;
      for (const s of visible) {
        const b = s.getBoundingClientRect();
        if (down ? b.top <= r.top + 1 : b.top >= r.top - 1) continue;
        const d = Math.abs(b.top - r.top) * 1000 + Math.abs(b.left - r.left);
        if (d < bestD) { bestD = d; best = s; }
      }
      next = best;
    } else if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      showDetails(cur.dataset.node);
      const g = nodes.get(cur.dataset.node);
      tip.hidden = true;
      ctx.status(`${g.name}: details shown`);
      return;
    } else return;
    e.preventDefault();
    if (next) {
      setActive(next);
      next.focus();
      next.scrollIntoView({ block: "nearest" });
    }
  });

  function replaceNode(n) {
    const old = els.get(n.name);
    const prev = nodes.get(n.name);
    nodes.set(n.name, n);
    if (!prev || tiers(prev).join("/") !== tiers(n).join("/")) return false;
    // Not drawn yet: its chunk draws it as it is now.
    if (!old) return later.has(n.name);
    const tpl = document.createElement("template");
    tpl.innerHTML = nodeSvg(n, o);
    const s = tpl.content.firstElementChild;
    s.setAttribute("tabindex", old.getAttribute("tabindex"));
    for (const c of ["hidden", "sel"]) if (old.classList.contains(c)) s.classList.add(c);
    if (!matches(n, f)) s.classList.add("hidden");
    const focused = document.activeElement === old;
    old.replaceWith(s);
    els.set(n.name, s);
    if (focused) s.focus();
    if (selected === n.name) showDetails(n.name, false);
    return true;
  }

  async function load() {
    const tFetch = performance.now();
    let data;
    try {
      data = await api("/v1/cluster/gpus");
    } catch (e) {
      map.replaceChildren(notice(`Could not read the cluster: ${e.message}`, "error"));
      return;
    }
    if (closed) return;
    const tGot = performance.now();
    o.all = data.viewer.all_tenants;
    nodes.clear();
    for (const n of data.nodes) nodes.set(n.name, norm(n));
    frag = data.fragmentation;
    facets();
    drawSummary();
    draw();
    const tDrawn = performance.now();
    const drawnAtOnce = els.size;
    requestAnimationFrame(() => requestAnimationFrame(() => {
      window.__console.paints.cluster = performance.now();
      window.__console.paints.clusterDrawnAtOnce = drawnAtOnce;
      window.__console.paints.clusterDetail = { mountMs: t0, fetchMs: tGot - tFetch, drawMs: tDrawn - tGot, nodes: nodes.size };
    }));
    sub?.close();
    let seq = data.seq;
    sub = stream((last) => `/v1/cluster/watch?after=${last ?? seq}&instance=${encodeURIComponent(data.instance)}`, {
      onState: (s) => ctx.status(s === "live" ? "" : `cluster: ${s}`),
      onEvent: (ev) => {
        if (ev.event === "node") {
          const n = norm(JSON.parse(ev.data));
          const known = els.has(n.name) || later.has(n.name);
          if (!replaceNode(n) || !known) { facets(); draw(); }
          const at = Date.now();
          window.__console.applied.push({ view: "cluster", node: n.name, at });
          requestAnimationFrame(() => { window.__console.applied.push({ view: "cluster", node: n.name, painted: Date.now(), at }); });
        } else if (ev.event === "removed") {
          const { name } = JSON.parse(ev.data);
          nodes.delete(name);
          draw();
        } else if (ev.event === "fragmentation") {
          frag = JSON.parse(ev.data).models;
          drawSummary();
        } else if (ev.event === "reset") {
          sub.close();
          load();
        }
      },
      onGone: () => { if (!closed) load(); },
    });
  }
  load();
  return () => { closed = true; sub?.close(); tip.remove(); };
}
