// Sandboxes and sessions: lists with state, runtime class, node, age and cost; a
// session's page with its trace as a waterfall (invoke_agent → chat →
// execute_tool, with durations), its tool-ledger entries, history events, memory
// keys, and its cost broken down (tokens, GPU-seconds, CPU-seconds, tool fees),
// with kill.
//
// Both lists follow the SSE watch (`/v1/watch?kind=sandbox|session`) after one list
// call: a change redraws its own row in place, a new row goes where its start time
// puts it, and no other row is touched or moves. Ages and times left count on the
// page's clock, without asking the server. A session's page reads its details again
// when that session's record changes (an invocation, a kill), not on a timer.

import { api, listAndWatch, stream } from "./api.js";
import { debounce, dl, esc, fmtAge, fmtBytes, fmtDuration, fmtMoney, fmtTime, h, notice } from "./util.js";

const OP_COLOR = { invoke_agent: "#1f5fbf", chat: "#2b7a3d", execute_tool: "#b3471d" };

/**
 * A <tbody> of rows kept by key: `reset(items)` draws a list, `put(item)` redraws
 * one row where it is when what it shows changed (or inserts a new one in `order`),
 * `remove(key)` takes one out. Rows of other items are never replaced.
 */
function keyedRows(tbody, { key, row, order }) {
  const items = new Map();
  const draw = (it) => {
    const tr = row(it);
    tr.dataset.key = key(it);
    return tr;
  };
  const rowOf = (k) => [...tbody.children].find((tr) => tr.dataset.key === k);
  return {
    items,
    reset(list) {
      items.clear();
      for (const it of list) items.set(key(it), it);
      tbody.replaceChildren(...[...items.values()].sort(order).map(draw));
    },
    put(it) {
      const k = key(it);
      const fresh = draw(it);
      const old = items.has(k) ? rowOf(k) : null;
      items.set(k, it);
      if (old) { if (!sameRow(old, fresh)) old.replaceWith(fresh); return; }
      const next = [...tbody.children].find((tr) => order(it, items.get(tr.dataset.key)) < 0);
      tbody.insertBefore(fresh, next || null);
    },
    remove(k) {
      items.delete(k);
      rowOf(k)?.remove();
    },
  };
}

/** Whether two rows show the same, their counting cells aside (a write nobody sees, such as a lease renewal, redraws nothing). */
function sameRow(a, b) {
  const [x, y] = [a.cloneNode(true), b.cloneNode(true)];
  for (const r of [x, y]) for (const c of r.querySelectorAll("[data-since],[data-until]")) c.textContent = "";
  return x.isEqualNode(y);
}

/** Cells with `data-since` (an age) or `data-until` (time left), in ms since the epoch, kept counting. */
function ticking(el) {
  const t = setInterval(() => {
    if (document.hidden) return;
    const now = Date.now();
    for (const c of el.querySelectorAll("[data-since]")) c.textContent = fmtAge(Number(c.dataset.since), now);
    for (const c of el.querySelectorAll("[data-until]")) c.textContent = fmtDuration(Math.max(0, Number(c.dataset.until) - now));
  }, 1000);
  return () => clearInterval(t);
}

function pill(s) { return h("span", { class: `pill phase-${s}` }, s); }

export function mountSandboxes(el, ctx) {
  ctx.title("Sandboxes");
  const tbody = h("tbody", {});
  const msg = h("div", {});
  el.append(
    h("h1", {}, "Sandboxes ", h("span", { class: "sub" }, `of tenant ${ctx.tenant}`)),
    msg,
    h("table", { id: "sandboxes" },
      h("thead", {}, h("tr", {}, ["Sandbox", "State", "Template", "Runtime class", "Node", "Age", "Ends in", "Limits", "Network"].map((c) => h("th", { scope: "col" }, c)))),
      tbody));
  const rows = keyedRows(tbody, {
    key: (s) => s.sandbox_id,
    order: (a, b) => a.started_at - b.started_at || a.sandbox_id.localeCompare(b.sandbox_id),
    row: (s) => h("tr", {},
      h("th", { scope: "row" }, h("code", {}, s.sandbox_id)),
      h("td", {}, pill(s.state)),
      h("td", {}, s.template || "base"),
      h("td", {}, s.runtime_class || "standard"),
      h("td", {}, s.node || (s.state === "paused" ? "– (on disk)" : "this server")),
      h("td", { "data-since": s.started_at * 1000 }, fmtAge(s.started_at * 1000)),
      s.end_at ? h("td", { "data-until": s.end_at * 1000 }, fmtDuration(Math.max(0, s.end_at * 1000 - Date.now()))) : h("td", {}, "–"),
      h("td", {}, s.limits ? `${fmtBytes(s.limits.memory_bytes)}, ${s.limits.cpu_millis ? `${s.limits.cpu_millis / 1000} CPU` : "no CPU limit"}` : "–"),
      h("td", {}, s.network?.mode || "none")),
  });
  const empty = () => msg.replaceChildren(rows.items.size ? "" : notice("No sandboxes: create one with POST /v1/sandboxes or tessera sandbox remote create."));
  const painted = () => { window.__console.paints.sandboxes = performance.now(); };
  const sub = listAndWatch("sandbox", "/v1/sandboxes", {
    key: (s) => s.sandbox_id,
    loaded: (items) => { rows.reset(items); empty(); painted(); },
    apply: (op, s) => {
      if (op === "deleted") rows.remove(s.sandbox_id); else rows.put(s);
      empty();
      painted();
    },
    onState: (st) => {
      if (!st.startsWith("error")) return;
      const off = st.includes("sandboxes are off");
      msg.replaceChildren(notice(off ? "Sandboxes are off on this server (start it with tessera up --sandboxes)." : `Could not read the sandboxes: ${st.slice(7)}`, off ? "info" : "error"));
    },
  });
  const stopClock = ticking(tbody);
  return () => { sub.close(); stopClock(); };
}

export function mountSessions(el, ctx) {
  ctx.title("Sessions");
  const q = ctx.query;
  let sub = null;
  const stateSel = h("select", { id: "state", onchange: () => { ctx.setQuery({ state: stateSel.value }); follow(); } },
    ["", "starting", "active", "idle", "ended", "failed", "killed"].map((s) => h("option", { value: s, selected: s === (q.get("state") || "") }, s || "any")));
  const tbody = h("tbody", {});
  const msg = h("div", {});
  const costs = new Map();
  let currency = "";
  el.append(
    h("h1", {}, "Sessions ", h("span", { class: "sub" }, `of tenant ${ctx.tenant}`)),
    h("div", { class: "toolbar" }, h("div", { class: "field" }, h("label", { for: "state" }, "State"), stateSel)),
    msg,
    h("table", { id: "sessions" },
      h("thead", {}, h("tr", {}, ["Session", "Runtime", "State", "Sandbox", "Runtime class", "Node", "Age", "Invocations", "Cost"].map((c) => h("th", { scope: "col" }, c)))),
      tbody));
  const rows = keyedRows(tbody, {
    key: (s) => s.id,
    order: (a, b) => b.created_at_ms - a.created_at_ms || a.id.localeCompare(b.id),
    row: (s) => h("tr", {},
      h("th", { scope: "row" }, h("a", { href: `/ui/sessions/${encodeURIComponent(s.id)}` }, s.id)),
      h("td", {}, `${s.runtime} v${s.version}`),
      h("td", {}, pill(s.state)),
      h("td", {}, s.sandbox ? h("code", {}, s.sandbox) : "–"),
      h("td", {}, s.runtime_class || "standard"),
      h("td", {}, s.node || (s.sandbox ? "this server" : "–")),
      h("td", { title: fmtTime(s.created_at_ms), "data-since": s.created_at_ms }, fmtAge(s.created_at_ms)),
      h("td", { class: "num" }, s.invocations),
      h("td", { class: "num" }, costs.has(s.id) ? fmtMoney(costs.get(s.id), currency) : "–")),
  });
  // A session's cost is read when it is first shown and after its invocations or
  // state change (what usage follows), one session at a time.
  async function cost(s) {
    try {
      const u = await api(`/v1/usage?session=${encodeURIComponent(s.id)}`);
      currency = u.currency;
      costs.set(s.id, u.session_totals?.cost ?? 0);
      const now = rows.items.get(s.id);
      if (now) rows.put(now);
    } catch { /* keep the last figure */ }
  }
  const wanted = () => (stateSel.value ? stateSel.value.split(",") : null);
  const empty = () => msg.replaceChildren(rows.items.size ? "" : notice("No sessions: they start with POST /v1/runtimes/NAME/invocations."));
  const painted = () => { window.__console.paints.sessions = performance.now(); };
  function follow() {
    sub?.close();
    const st = stateSel.value;
    sub = listAndWatch("session", `/v1/sessions${st ? `?state=${st}` : ""}`, {
      key: (s) => s.id,
      loaded: (items) => {
        rows.reset(items);
        empty();
        painted();
        // The most recent fifty.
        [...rows.items.values()].sort((a, b) => b.created_at_ms - a.created_at_ms).slice(0, 50).forEach(cost);
      },
      apply: (op, s) => {
        const before = rows.items.get(s.id);
        const w = wanted();
        if (op === "deleted" || (w && !w.includes(s.state))) rows.remove(s.id);
        else {
          rows.put(s);
          if (!before || before.invocations !== s.invocations || before.state !== s.state) cost(s);
        }
        empty();
        painted();
      },
      onState: (x) => { if (x.startsWith("error")) msg.replaceChildren(notice(`Could not read the sessions: ${x.slice(7)}`, "error")); },
    });
  }
  follow();
  const stopClock = ticking(tbody);
  return () => { sub?.close(); stopClock(); };
}

/** Spans in tree order (depth first), each with its depth. */
function flatten(tree, depth = 0, out = []) {
  for (const n of tree) {
    out.push({ span: n.span, depth });
    flatten(n.children || [], depth + 1, out);
  }
  return out;
}

/** The trace as a waterfall: one row per span, a bar from its start for its duration. */
export function waterfall(tree) {
  const rows = flatten(tree);
  if (!rows.length) return h("p", { class: "muted" }, "No spans recorded yet.");
  const t0 = Math.min(...rows.map((r) => r.span.start_ms));
  const t1 = Math.max(...rows.map((r) => r.span.start_ms + r.span.duration_ms));
  const total = Math.max(1, t1 - t0);
  const LW = 300;
  const BW = 560;
  const RH = 22;
  const W = LW + BW + 90;
  let s = `<svg class="waterfall" id="waterfall" width="${W}" height="${rows.length * RH + 24}" role="img" aria-label="${esc(`Trace waterfall: ${rows.length} spans over ${fmtDuration(total)}`)}">`;
  s += `<text x="${LW}" y="12" class="dur">0</text><text x="${LW + BW}" y="12" text-anchor="end" class="dur">${esc(fmtDuration(total))}</text>`;
  rows.forEach((r, i) => {
    const sp = r.span;
    const y = 20 + i * RH;
    const x = LW + ((sp.start_ms - t0) / total) * BW;
    const w = Math.max(2, (sp.duration_ms / total) * BW);
    const fill = OP_COLOR[sp.operation] || "#6e7681";
    s += `<g class="span" data-order="${i}" data-span="${esc(sp.span_id)}" data-op="${esc(sp.operation)}" data-depth="${r.depth}" data-start="${sp.start_ms}">`;
    s += `<title>${esc(`${sp.operation} ${sp.name}: ${fmtDuration(sp.duration_ms)} from +${fmtDuration(sp.start_ms - t0)}${sp.cost ? `, cost ${sp.cost}` : ""}`)}</title>`;
    s += `<text class="label" x="${4 + r.depth * 14}" y="${y + 14}">${esc(`${sp.operation} · ${sp.name}`.slice(0, 44))}</text>`;
    s += `<rect x="${x.toFixed(1)}" y="${y + 3}" width="${w.toFixed(1)}" height="${RH - 8}" fill="${fill}" rx="2"/>`;
    s += `<text x="${Math.min(LW + BW + 4, x + w + 4).toFixed(1)}" y="${y + 14}" class="dur">${esc(fmtDuration(sp.duration_ms))}</text>`;
    s += "</g>";
  });
  s += "</svg>";
  const wrap = h("div", { class: "waterfall-wrap" });
  wrap.innerHTML = s;
  return wrap;
}

const KIND_LABEL = {
  tokens_in: "input tokens", tokens_out: "output tokens", tokens_cached: "cached input tokens",
  gpu_seconds: "GPU-seconds", cpu_seconds: "CPU-seconds", memory_gb_seconds: "memory GB-seconds", tool_fee: "tool fees",
};

export function mountSession(el, ctx) {
  const id = ctx.params.id;
  ctx.title(`Session ${id}`);
  const msg = h("div", {});
  const head = h("div", {});
  const actions = h("div", { class: "actions" });
  const traceEl = h("div", { id: "trace" });
  const ledgerEl = h("div", { id: "ledger" });
  const historyEl = h("div", { id: "history" });
  const memoryEl = h("div", { id: "memory" });
  const costEl = h("div", { id: "cost" });
  el.append(
    h("p", {}, h("a", { href: "/ui/sessions" }, "← Sessions")),
    h("h1", {}, "Session ", h("span", { id: "session-id" }, id)),
    msg, head, actions,
    h("h2", {}, "Trace"), traceEl,
    h("div", { class: "grid2" },
      h("section", { class: "card" }, h("h2", {}, "Cost"), costEl),
      h("section", { class: "card" }, h("h2", {}, "Memory keys"), memoryEl)),
    h("h2", {}, "Tool ledger"), ledgerEl,
    h("h2", {}, "History"), historyEl);
  let closed = false;

  async function loadAll() {
    let s;
    try {
      s = await api(`/v1/sessions/${encodeURIComponent(id)}`);
    } catch (e) {
      msg.replaceChildren(notice(e.status === 404 ? `No session ${id} in tenant ${ctx.tenant}.` : `Could not read the session: ${e.message}`, "error"));
      return;
    }
    if (closed) return;
    head.replaceChildren(dl([
      ["State", pill(s.state)],
      ["Runtime", `${s.runtime} v${s.version}`],
      ["Sandbox", s.sandbox || "–"],
      ["Node", s.node || (s.sandbox ? "this server" : "–")],
      ["Started", `${fmtTime(s.created_at_ms)} (${fmtAge(s.created_at_ms)} ago)`],
      ["Invocations", String(s.invocations)],
      ["Restarts", String(s.restarts)],
      s.reason ? ["Reason", s.reason] : null,
    ]));
    actions.replaceChildren();
    if (["starting", "active", "idle"].includes(s.state) && ctx.can("developer")) {
      actions.append(h("button", { type: "button", class: "danger", id: "kill", onclick: async () => {
        try {
          await api(`/v1/sessions/${encodeURIComponent(id)}/kill`, { method: "POST", body: { reason: `killed from the console by ${ctx.who.subject}` } });
          ctx.status(`session ${id} killed`);
          loadAll();
        } catch (e) { msg.replaceChildren(notice(`Kill failed: ${e.message}`, "error")); }
      } }, "Kill session"));
    }
    const [trace, ledger, history, memory, usage, prices] = await Promise.allSettled([
      api(`/v1/sessions/${encodeURIComponent(id)}/trace`),
      api(`/v1/ledger?session_id=${encodeURIComponent(id)}`),
      api(`/v1/sessions/${encodeURIComponent(id)}/history?limit=200`),
      api(`/v1/sessions/${encodeURIComponent(id)}/memory`),
      api(`/v1/usage?session=${encodeURIComponent(id)}`),
      api("/v1/usage/prices"),
    ]);
    if (closed) return;
    traceEl.replaceChildren(trace.status === "fulfilled" ? waterfall(trace.value.tree || []) : notice(`trace: ${trace.reason.message}`, "error"));
    if (ledger.status === "fulfilled") {
      const items = ledger.value.items;
      ledgerEl.replaceChildren(items.length ? h("table", { id: "ledger-table" },
        h("thead", {}, h("tr", {}, ["Call", "Tool", "State", "Attempts", "When", "Note"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, items.map((e) => h("tr", { "data-entry": e.id },
          h("th", { scope: "row" }, h("code", {}, e.tool_call_id)),
          h("td", {}, e.tool),
          h("td", {}, pill(e.state)),
          h("td", { class: "num" }, e.attempts),
          h("td", {}, fmtTime(e.created_at_ms)),
          h("td", {}, e.error || e.note || ""))))) : h("p", { class: "muted" }, "No tool calls."));
    } else ledgerEl.replaceChildren(notice(`ledger: ${ledger.reason.message}`, "error"));
    if (history.status === "fulfilled") {
      const items = history.value.items;
      historyEl.replaceChildren(items.length ? h("ol", { class: "timeline" }, items.map((e) => h("li", {},
        e.at_ms ? h("time", {}, fmtTime(e.at_ms)) : null,
        h("code", {}, JSON.stringify(e.value ?? e).slice(0, 300))))) : h("p", { class: "muted" }, "No history entries."));
    } else historyEl.replaceChildren(notice(`history: ${history.reason.message}`, "error"));
    if (memory.status === "fulfilled") {
      const keys = memory.value.keys;
      memoryEl.replaceChildren(keys.length ? h("ul", {}, keys.map((k) => h("li", {}, h("code", {}, typeof k === "string" ? k : k.key)))) : h("p", { class: "muted" }, "No memory keys."));
    } else memoryEl.replaceChildren(notice(`memory: ${memory.reason.message}`, "error"));
    if (usage.status === "fulfilled") {
      const tot = usage.value.session_totals || { quantities: {}, cost: 0 };
      const price = prices.status === "fulfilled" ? prices.value.prices : {};
      const cur = usage.value.currency;
      const rows = Object.entries(tot.quantities || {}).map(([k, qn]) => h("tr", { "data-kind": k },
        h("th", { scope: "row" }, KIND_LABEL[k] || k),
        h("td", { class: "num" }, Number.isInteger(qn) ? qn : qn.toFixed(3)),
        h("td", { class: "num" }, price[k] !== undefined ? fmtMoney(qn * price[k], cur) : "–")));
      costEl.replaceChildren(h("table", { id: "cost-table" },
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Usage"), h("th", { scope: "col", class: "num" }, "Quantity"), h("th", { scope: "col", class: "num" }, "Cost"))),
        h("tbody", {}, rows),
        h("tfoot", {}, h("tr", {}, h("th", { scope: "row" }, "Total"), h("td", {}), h("td", { class: "num", id: "cost-total" }, fmtMoney(tot.cost, cur))))));
    } else costEl.replaceChildren(notice(`usage: ${usage.reason.message}`, "error"));
    window.__console.paints.session = performance.now();
  }
  // Read again when this session's record changes (an invocation began or ended, a
  // kill, its sandbox released), at most every half second.
  const again = debounce(() => { if (!closed) loadAll(); }, 500);
  // Read once the watch is open, so that no change between the read and the watch
  // is missed; after a 410 (it fell behind) the watch is opened again and read again.
  let sub = null;
  const watch = () => {
    sub = stream((last) => `/v1/watch?kind=session${last ? `&after=${last}` : ""}`, {
      onOpen: () => loadAll(),
      onEvent: (ev) => {
        try { if (JSON.parse(ev.data).id === id) again(); } catch { /* not a session */ }
      },
      onGone: (err) => { if (!closed && err?.status === 410) { sub.close(); watch(); } },
    });
  };
  watch();
  return () => { closed = true; sub.close(); };
}
