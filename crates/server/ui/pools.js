// Inference pools: per pool its endpoints (health, in-flight, waiting, KV-cache use),
// the gateway's queue, the prefix-cache hit rate, time-to-first-token percentiles,
// and the scaling recommendation with its reasons.
//
// Pools' figures are gauges: the server samples them for this view's watch
// (`/v1/watch?kind=pool`, every half second) and sends a pool only when what it
// shows changed; that pool's card is redrawn in place, the others stay as they are.

import { listAndWatch } from "./api.js";
import { fmtDuration, h, notice } from "./util.js";

const pct = (v) => (v === null || v === undefined ? "–" : `${(v * 100).toFixed(1)}%`);

function ttft(t) {
  if (!t || !t.samples) return "–";
  return `p50 ${fmtDuration(t.p50)} · p90 ${fmtDuration(t.p90)} · p99 ${fmtDuration(t.p99)}`;
}

function card(p) {
  const s = p.stats || {};
  const sc = p.scaling || {};
  const why = Array.isArray(sc.reasons) ? sc.reasons.join("; ") : sc.reason || "";
  return h("section", { class: "card", "data-pool": p.spec.name },
    h("h2", {}, p.spec.name, h("span", { class: "sub" }, ` · model ${p.spec.model}`)),
    h("dl", { class: "kv" },
      h("dt", {}, "In flight"), h("dd", { "data-k": "in_flight" }, String(p.in_flight)),
      h("dt", {}, "Queued at the gateway"), h("dd", { "data-k": "queued" }, String(p.queued)),
      h("dt", {}, "Prefix-cache hit rate"), h("dd", { "data-k": "hit_rate" }, pct(s.prefix_cache_hit_rate)),
      h("dt", {}, "Time to first token"), h("dd", { "data-k": "ttft" }, ttft(s.ttft_ms)),
      h("dt", {}, "Requests seen"), h("dd", { "data-k": "requests" }, String(s.requests ?? 0)),
      h("dt", {}, "Recommended replicas"), h("dd", { "data-k": "recommended" }, h("strong", {}, String(p.recommended_replicas)), why ? h("span", { class: "muted" }, ` (${why})`) : "")),
    h("table", {},
      h("thead", {}, h("tr", {}, ["Endpoint", "Healthy", "Weight", "Outstanding", "Waiting", "Running", "KV cache", "Hit rate", "TTFT p50 / p99", "Failures"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, p.endpoints.map((e) => h("tr", { "data-endpoint": e.url },
        h("th", { scope: "row" }, h("code", {}, e.url)),
        h("td", {}, e.healthy ? (e.probe && e.probe !== "metrics" ? `yes (health: ${e.probe})` : "yes") : h("strong", { title: e.out_of_rotation || "" }, `no: ${e.out_of_rotation || "down"}`)),
        h("td", { class: "num" }, e.weight),
        h("td", { class: "num" }, e.outstanding),
        h("td", { class: "num" }, e.waiting),
        h("td", { class: "num" }, e.running),
        h("td", { class: "num" }, pct(e.kv_util)),
        h("td", { class: "num" }, pct(e.prefix_cache_hit_rate)),
        h("td", { class: "num" }, e.ttft_ms?.samples ? `${fmtDuration(e.ttft_ms.p50)} / ${fmtDuration(e.ttft_ms.p99)}` : "–"),
        h("td", { class: "num" }, e.failures))))));
}

export function mount(el, ctx) {
  ctx.title("Inference pools");
  const list = h("div", { class: "grid2", id: "pools" });
  const msg = h("div", {});
  el.append(h("h1", {}, "Inference pools"), msg, list);
  const cards = new Map();
  const empty = () => msg.replaceChildren(cards.size ? "" : notice("No pools: a system operator registers them with tessera pool create."));
  const put = (p) => {
    const c = card(p);
    const old = cards.get(p.spec.name);
    if (old) old.replaceWith(c); else list.append(c);
    cards.set(p.spec.name, c);
  };
  const painted = () => { window.__console.paints.pools = performance.now(); };
  const sub = listAndWatch("pool", "/v1/pools", {
    key: (p) => p.spec.name,
    loaded: (items) => {
      for (const c of cards.values()) c.remove();
      cards.clear();
      items.forEach(put);
      empty();
      painted();
    },
    apply: (op, p) => {
      if (op === "deleted") { cards.get(p.spec.name)?.remove(); cards.delete(p.spec.name); } else put(p);
      empty();
      painted();
    },
    onState: (st) => { if (st.startsWith("error")) msg.replaceChildren(notice(`Could not read the pools: ${st.slice(7)}`, "error")); },
  });
  return () => sub.close();
}
