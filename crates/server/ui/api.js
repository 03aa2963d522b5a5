// The console's only way to the server: the public API with the caller's key.
//
// The key (an API key or an OIDC token) lives in session storage: it leaves with
// the tab. A key handed in the URL fragment (`/ui#key=…`, which browsers never
// send to the server) is moved there and cleared from the address bar at once.
// Server-sent events are read over fetch, because EventSource cannot send an
// Authorization header (and a key in a query string would land in logs).

const KEY = "tessera.key";
let viewAs = null;
let onUnauthorized = () => {};

/** Moves `#key=…` into session storage and clears it from the address bar. */
export function takeKeyFromFragment() {
  const frag = location.hash;
  if (!frag.startsWith("#key=")) return false;
  const k = decodeURIComponent(frag.slice(5)).trim();
  if (k) sessionStorage.setItem(KEY, k);
  history.replaceState(history.state, "", location.pathname + location.search);
  return Boolean(k);
}

export const auth = {
  key: () => sessionStorage.getItem(KEY),
  set: (k) => sessionStorage.setItem(KEY, k.trim()),
  clear: () => sessionStorage.removeItem(KEY),
  onUnauthorized: (f) => { onUnauthorized = f; },
};

/** For system admins: look at the API as this tenant (read only), or as oneself. */
export function setViewAs(tenant) { viewAs = tenant || null; }
export function viewingAs() { return viewAs; }

function headers(extra = {}) {
  const hd = { ...extra };
  const k = auth.key();
  if (k) hd.Authorization = `Bearer ${k}`;
  if (viewAs) hd["X-Tessera-Tenant"] = viewAs;
  return hd;
}

/** A problem document from the API (RFC 9457), as an Error. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

async function problemOf(r) {
  try { return await r.json(); } catch { return { detail: `${r.status} ${r.statusText}` }; }
}

/** Calls the API: JSON in, JSON (or text) out; a failure throws ApiError. */
export async function api(path, { method = "GET", body, text = false, signal } = {}) {
  const r = await fetch(path, {
    method,
    headers: headers(body !== undefined ? { "Content-Type": "application/json" } : {}),
    body: body !== undefined ? JSON.stringify(body) : undefined,
    signal,
  });
  if (r.status === 401) onUnauthorized();
  if (!r.ok) throw new ApiError(r.status, await problemOf(r));
  if (r.status === 204) return null;
  return text ? r.text() : r.json();
}

/**
 * Follows a server-sent event stream. `url(last)` builds the URL from the id of the
 * last event seen (null at first); each event goes to `onEvent({event, data, id})`.
 * After a dropped connection it reconnects from the last id, waiting longer each
 * time; `onOpen()` runs once the server answered (the stream is live from then on).
 * A 410 (compacted) or a 4xx ends it with `onGone(problem)`: the caller lists again.
 * Returns {close()}.
 */
export function stream(url, { onEvent, onOpen, onGone, onState } = {}) {
  const ctl = { closed: false, abort: null };
  let last = null;
  let wait = 250;
  const run = async () => {
    while (!ctl.closed) {
      const ac = new AbortController();
      ctl.abort = ac;
      try {
        const r = await fetch(url(last), { headers: headers({ Accept: "text/event-stream" }), signal: ac.signal });
        if (r.status === 401) onUnauthorized();
        if (!r.ok) {
          const p = await problemOf(r);
          if (r.status >= 400 && r.status < 500) { onGone?.(new ApiError(r.status, p)); return; }
          throw new ApiError(r.status, p);
        }
        wait = 250;
        onState?.("live");
        onOpen?.();
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let cut;
          while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
            const block = buf.slice(0, cut);
            buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
            const ev = { event: "message", data: "", id: null };
            const data = [];
            for (const line of block.split(/\r?\n/)) {
              if (!line || line.startsWith(":")) continue;
              const i = line.indexOf(":");
              const field = i < 0 ? line : line.slice(0, i);
              const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
              if (field === "event") ev.event = val;
              else if (field === "data") data.push(val);
              else if (field === "id") ev.id = val;
            }
            if (!data.length && ev.event === "message") continue;
            ev.data = data.join("\n");
            if (ev.id !== null) last = ev.id;
            try { onEvent?.(ev); } catch (e) { console.error("console: applying an event failed", e); }
          }
        }
      } catch (e) {
        if (ctl.closed) return;
        onState?.("reconnecting");
        if (e?.status >= 500) console.warn("console: stream failed", e);
      }
      if (ctl.closed) return;
      onState?.("reconnecting");
      await new Promise((res) => setTimeout(res, wait));
      wait = Math.min(wait * 2, 10000);
    }
  };
  run();
  return {
    close() { ctl.closed = true; ctl.abort?.abort(); },
  };
}

/**
 * Lists a kind and keeps it current from `/v1/watch?kind=KIND` without listing
 * again: the watch is opened first, then the list is read; every event (also those
 * that arrived while listing) is merged by resource_version, so nothing is missed
 * and nothing goes back in time. `apply(op, obj)` gets "created" | "updated" |
 * "deleted"; `loaded(items)` the first list; `key(obj)` names an object (its
 * `name` unless told). On 410 (the watch fell behind the change log) it lists again;
 * any other refusal of the watch ends it with `onState("error: …")`.
 */
export function listAndWatch(kind, listPath, { loaded, apply, onState, key = (o) => o.name }) {
  let closed = false;
  let s = null;
  const start = () => {
    const versions = new Map();
    const early = [];
    let opened = false;
    let listed = false;
    const fresh = (o) => {
      const v = versions.get(key(o));
      if (v !== undefined && v >= o.resource_version) return false;
      versions.set(key(o), o.resource_version);
      return true;
    };
    s = stream((last) => `/v1/watch?kind=${encodeURIComponent(kind)}${last ? `&after=${last}` : ""}`, {
      onState,
      onOpen: async () => {
        // A reconnect resumes from the last event: no second list.
        if (opened) return;
        opened = true;
        try {
          const l = await api(listPath);
          if (closed) return;
          for (const o of l.items) versions.set(key(o), o.resource_version);
          loaded(l.items);
          listed = true;
          for (const [op, o] of early.splice(0)) if (fresh(o)) apply(op, o);
        } catch (e) {
          onState?.(`error: ${e.message}`);
        }
      },
      onEvent: (ev) => {
        if (!["created", "updated", "deleted"].includes(ev.event)) return;
        let o;
        try { o = JSON.parse(ev.data); } catch { return; }
        if (!listed) { early.push([ev.event, o]); return; }
        if (fresh(o)) apply(ev.event, o);
      },
      onGone: (err) => {
        if (closed) return;
        s.close();
        // 410: fell behind the change log, list again; any other refusal is final.
        if (err?.status === 410) start();
        else onState?.(`error: ${err?.message || "the watch was refused"}`);
      },
    });
  };
  start();
  return { close() { closed = true; s?.close(); } };
}
