// Queues: the caller's queue tree with, per resource, what each queue holds
// (allocated), still asks for (pending) and deserves (its fair share of the
// cluster), its guarantee and capability marked; under each queue, its pending
// jobs with the scheduler's reasons.
//
// Data: GET /v1/cluster/queues; when a job or queue changes (the SSE watch of
// both kinds), the tree is read again (debounced) and updated in place, row by row.

import { api, stream } from "./api.js";
import { debounce, esc, fmtAge, fmtBytes, fmtCpu, fmtGpu, h, notice } from "./util.js";

const W = 220;
const BH = 16;

const DIMS = [
  ["gpu_milli", "GPU", (v) => `${fmtGpu(v)} GPU`],
  ["cpu_milli", "CPU", (v) => `${fmtCpu(v)} cores`],
  ["memory", "Memory", (v) => fmtBytes(v)],
];

/** One resource of one queue as a bar: allocated (solid), pending (hatched, after
 * it), deserved (a tick), guarantee (a triangle below), capability (a red end). */
function bar(row, key, fmt, label) {
  const a = row.allocated[key] || 0;
  const p = row.pending[key] || 0;
  const d = row.deserved[key] || 0;
  const g = row.guarantee[key] || 0;
  const c = row.capability ? row.capability[key] : undefined;
  const max = Math.max(1, a + p, d, g, c ?? 0);
  const x = (v) => (Math.min(v, max) / max) * (W - 2) + 1;
  let s = `<svg class="bar" width="${W}" height="${BH + 6}" role="img" aria-label="${esc(`${label}: ${fmt(a)} allocated, ${fmt(p)} pending, ${fmt(d)} deserved${g ? `, ${fmt(g)} guaranteed` : ""}${c !== undefined ? `, capability ${fmt(c)}` : ""}`)}">`;
  s += `<rect x="1" y="1" width="${W - 2}" height="${BH}" fill="#eef1f4" stroke="#8c959f" stroke-width="0.75"/>`;
  s += `<rect data-part="allocated" x="1" y="1" width="${(x(a) - 1).toFixed(1)}" height="${BH}" fill="#1f5fbf"/>`;
  if (p) s += `<rect data-part="pending" x="${x(a).toFixed(1)}" y="1" width="${(x(a + p) - x(a)).toFixed(1)}" height="${BH}" fill="url(#qhatch)" stroke="#8a5a00" stroke-width="0.75"/>`;
  s += `<line data-part="deserved" x1="${x(d).toFixed(1)}" x2="${x(d).toFixed(1)}" y1="0" y2="${BH + 2}" stroke="#1b1f24" stroke-width="2"/>`;
  if (g) s += `<path data-part="guarantee" d="M${x(g).toFixed(1)} ${BH + 1} l-4 5 h8 z" fill="#2b7a3d"/>`;
  if (c !== undefined) s += `<line data-part="capability" x1="${x(c).toFixed(1)}" x2="${x(c).toFixed(1)}" y1="0" y2="${BH + 2}" stroke="#a11a1a" stroke-width="2" stroke-dasharray="3 1"/>`;
  return `${s}</svg>`;
}

function legend() {
  return h("div", { class: "legend", "aria-hidden": "false" },
    ...[
      ['<svg width="16" height="12" aria-hidden="true"><rect width="16" height="12" fill="#1f5fbf"/></svg>', "allocated"],
      ['<svg width="16" height="12" aria-hidden="true"><rect width="16" height="12" fill="url(#qhatch)" stroke="#8a5a00"/></svg>', "pending"],
      ['<svg width="16" height="12" aria-hidden="true"><line x1="8" x2="8" y1="0" y2="12" stroke="#1b1f24" stroke-width="2"/></svg>', "deserved (fair share)"],
      ['<svg width="16" height="12" aria-hidden="true"><path d="M8 4 l-4 6 h8 z" fill="#2b7a3d"/></svg>', "guarantee"],
      ['<svg width="16" height="12" aria-hidden="true"><line x1="8" x2="8" y1="0" y2="12" stroke="#a11a1a" stroke-width="2" stroke-dasharray="3 1"/></svg>', "capability"],
    ].map(([svg, t]) => { const s = h("span", {}); s.innerHTML = `${svg} ${esc(t)}`; return s; }));
}

export function mount(el, ctx) {
  ctx.title("Queues");
  const body = h("tbody", {});
  const empty = h("div", {});
  const rows = new Map();
  let closed = false;
  el.append(
    h("h1", {}, "Queues ", h("span", { class: "sub" }, `of tenant ${ctx.tenant}`)),
    h("p", { class: "muted" }, "Deserved shares are the proportion plugin's division of the cluster among all tenants' queues by weight, guarantee and capability, each capped at what the queue holds and asks for."),
    legend(),
    empty,
    h("table", { id: "queues" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Queue"), ...DIMS.map(([, l]) => h("th", { scope: "col" }, l)), h("th", { scope: "col", class: "num" }, "Running"), h("th", { scope: "col", class: "num" }, "Pending"))),
      body));
  if (!document.getElementById("qhatch")) {
    const defs = h("div", { "aria-hidden": "true" });
    defs.innerHTML = '<svg width="0" height="0" focusable="false"><defs><pattern id="qhatch" patternUnits="userSpaceOnUse" width="4" height="4" patternTransform="rotate(45)"><rect width="4" height="4" fill="#fff3d6"/><rect width="1.5" height="4" fill="#8a5a00"/></pattern></defs></svg>';
    document.body.append(defs);
  }

  function pendingList(r) {
    if (!r.waiting.length) return null;
    const d = h("details", { class: "pending", open: r.waiting.length <= 5 },
      h("summary", {}, `${r.pending_jobs} pending job${r.pending_jobs === 1 ? "" : "s"}${r.waiting.length < r.pending_jobs ? ` (${r.waiting.length} shown here)` : ""}`),
      h("ul", {}, r.waiting.map((j) => h("li", { "data-job": j.name },
        h("a", { href: `/ui/jobs/${encodeURIComponent(j.name)}` }, j.name),
        ` · priority ${j.priority} · waiting ${fmtAge(j.created_at)}${j.admitted ? "" : " · not admitted"}: `,
        h("span", { class: "reason" }, j.reason || "not scheduled yet")))));
    return d;
  }

  function fill(tr, r) {
    const name = h("td", { class: "qname" },
      h("span", { "aria-hidden": "true" }, "\u00a0\u00a0".repeat(r.depth) + (r.depth ? "└ " : "")),
      h("strong", {}, r.name),
      h("span", { class: "muted" }, ` · weight ${r.weight}${r.reclaimable ? "" : " · not reclaimable"}`),
      pendingList(r));
    const cells = DIMS.map(([k, label, fmt]) => {
      const td = h("td", {});
      td.innerHTML = bar(r, k, fmt, `${r.name} ${label}`);
      td.append(h("div", { class: "muted" }, `${fmt(r.allocated[k])} held · ${fmt(r.pending[k])} asked · ${fmt(r.deserved[k])} deserved`));
      return td;
    });
    tr.replaceChildren(name, ...cells, h("td", { class: "num" }, r.running_jobs), h("td", { class: "num" }, r.pending_jobs));
  }

  async function load() {
    let data;
    try {
      data = await api("/v1/cluster/queues");
    } catch (e) {
      empty.replaceChildren(notice(`Could not read the queues: ${e.message}`, "error"));
      return;
    }
    if (closed) return;
    empty.replaceChildren(data.items.length ? "" : notice("No queues yet: create one with `tessera queue create NAME`."));
    const seen = new Set();
    let prev = null;
    for (const r of data.items) {
      seen.add(r.name);
      let tr = rows.get(r.name);
      if (!tr) {
        tr = h("tr", { "data-queue": r.name });
        rows.set(r.name, tr);
      }
      // Open <details> stay open across updates.
      const open = tr.querySelector("details")?.open;
      fill(tr, r);
      if (open !== undefined && tr.querySelector("details")) tr.querySelector("details").open = open;
      // Keep tree order without moving rows that are already in place.
      const want = prev ? prev.nextSibling : body.firstChild;
      if (want !== tr) body.insertBefore(tr, want);
      prev = tr;
    }
    for (const [n, tr] of rows) if (!seen.has(n)) { tr.remove(); rows.delete(n); }
    requestAnimationFrame(() => { window.__console.paints.queues = performance.now(); });
  }
  const again = debounce(load, 300);
  const subs = ["job", "queue"].map((k) => stream((last) => `/v1/watch?kind=${k}${last ? `&after=${last}` : ""}`, {
    onEvent: again,
    onGone: again,
    onState: (s) => ctx.status(s === "live" ? "" : `queues: ${s}`),
  }));
  load();
  return () => { closed = true; for (const s of subs) s.close(); };
}
