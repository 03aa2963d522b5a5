// The console's shell: login, the tenant a system admin looks at, and the router.
// Each view is a module with `mount(el, ctx)` returning an unmount function; its
// state (filters, the selected node, the tenant) lives in the URL, so a link
// shows someone else the same thing.

import { api, auth, setViewAs, takeKeyFromFragment } from "./api.js";
import { h, notice } from "./util.js";
import * as cluster from "./cluster.js";
import * as queues from "./queues.js";
import * as jobs from "./jobs.js";
import * as agents from "./agents.js";
import * as pools from "./pools.js";

const main = document.getElementById("main");
const whoEl = document.getElementById("who");
const statusEl = document.getElementById("status");
let unmount = null;
let who = null;

/** Timings the browser tests read (first paint of a view, updates applied). */
window.__console = window.__console || { paints: {}, applied: [], errors: [] };
// Script errors are kept too: the browser tests fail on any.
window.addEventListener("error", (e) => window.__console.errors.push(`${e.message} (${e.filename}:${e.lineno})`));
window.addEventListener("unhandledrejection", (e) => window.__console.errors.push(`unhandled: ${e.reason}`));

const routes = [
  [/^\/ui\/?$/, () => ["cluster", cluster.mount, {}]],
  [/^\/ui\/cluster$/, () => ["cluster", cluster.mount, {}]],
  [/^\/ui\/queues$/, () => ["queues", queues.mount, {}]],
  [/^\/ui\/jobs$/, () => ["jobs", jobs.mountList, {}]],
  [/^\/ui\/jobs\/([^/]+)$/, (m) => ["jobs", jobs.mountJob, { name: decodeURIComponent(m[1]) }]],
  [/^\/ui\/sandboxes$/, () => ["sandboxes", agents.mountSandboxes, {}]],
  [/^\/ui\/sessions$/, () => ["sessions", agents.mountSessions, {}]],
  [/^\/ui\/sessions\/([^/]+)$/, (m) => ["sessions", agents.mountSession, { id: decodeURIComponent(m[1]) }]],
  [/^\/ui\/pools$/, () => ["pools", pools.mount, {}]],
];

const RANK = { viewer: 0, developer: 1, operator: 2, admin: 3 };

function status(text) { statusEl.textContent = text || ""; }

/** Navigates inside the console (keeping ?tenant= for system admins). */
export function navigate(path, { replace = false } = {}) {
  const u = new URL(path, location.origin);
  const t = new URLSearchParams(location.search).get("tenant");
  if (t && !u.searchParams.has("tenant")) u.searchParams.set("tenant", t);
  const to = u.pathname + u.search;
  if (replace) history.replaceState(null, "", to);
  else history.pushState(null, "", to);
  render();
}

/** Replaces query parameters of the current URL (no new history entry). */
function setQuery(changes) {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === undefined || v === "") q.delete(k);
    else q.set(k, v);
  }
  const s = q.toString();
  history.replaceState(null, "", location.pathname + (s ? `?${s}` : ""));
}

function loginView(message) {
  document.title = "Sign in · Tessera console";
  const input = h("input", { id: "key", type: "password", autocomplete: "off", required: true, "aria-describedby": "key-help" });
  const form = h("form", {
    onsubmit: async (e) => {
      e.preventDefault();
      auth.set(input.value);
      await start();
    },
  },
  h("label", { for: "key" }, "API key or OIDC token"),
  input,
  h("p", { id: "key-help", class: "muted" },
    "Kept in this tab's session storage only. A key can also be handed in the address: /ui#key=tsk_… (the fragment never reaches the server; the console moves it to session storage and clears it from the address bar)."),
  h("div", {}, h("button", { type: "submit" }, "Sign in")));
  main.replaceChildren(h("section", { class: "login" },
    h("h1", {}, "Sign in to the Tessera console"),
    message ? notice(message, "error") : null,
    form));
  whoEl.replaceChildren();
  input.focus();
}

async function renderWho() {
  const parts = [h("span", {}, `${who.subject} · ${who.role} in `, h("strong", {}, who.tenant))];
  if (who.system_admin) {
    let tenants = [];
    try { tenants = (await api("/v1/tenants")).items.map((t) => t.name); } catch { tenants = []; }
    const cur = new URLSearchParams(location.search).get("tenant") || "";
    const sel = h("select", {
      id: "tenant",
      onchange: () => {
        const q = new URLSearchParams(location.search);
        if (sel.value) q.set("tenant", sel.value); else q.delete("tenant");
        history.replaceState(null, "", location.pathname + (q.toString() ? `?${q}` : ""));
        render();
      },
    },
    h("option", { value: "" }, "all tenants (system admin)"),
    tenants.filter((t) => t !== who.tenant).map((t) => h("option", { value: t, selected: t === cur }, `${t} (read only)`)));
    parts.push(h("label", { for: "tenant" }, "View as"), sel);
  }
  parts.push(h("button", { class: "secondary", type: "button", onclick: () => { auth.clear(); loginView(); } }, "Sign out"));
  whoEl.replaceChildren(...parts);
}

function render() {
  if (unmount) { try { unmount(); } catch (e) { console.error(e); } unmount = null; }
  status("");
  const q = new URLSearchParams(location.search);
  setViewAs(who?.system_admin ? q.get("tenant") : null);
  let found = null;
  for (const [re, f] of routes) {
    const m = location.pathname.match(re);
    if (m) { found = f(m); break; }
  }
  for (const a of document.querySelectorAll("#nav a")) {
    if (found && a.dataset.view === found[0]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (!found) {
    main.replaceChildren(h("h1", {}, "Not found"), notice(`The console has no page at ${location.pathname}. Pick a view above.`, "error"));
    return;
  }
  const [, mount, params] = found;
  const el = h("div", {});
  main.replaceChildren(el);
  const ctx = {
    params,
    query: q,
    setQuery,
    navigate,
    status,
    who,
    tenant: setViewAsTenant(q),
    // Writes need the role, and never happen while a system admin views as a tenant.
    can: (role) => !(who?.system_admin && q.get("tenant")) && RANK[who?.role] >= RANK[role],
    title: (t) => { document.title = `${t} · Tessera console`; },
  };
  unmount = mount(el, ctx) || null;
}

function setViewAsTenant(q) {
  return (who?.system_admin && q.get("tenant")) || who?.tenant;
}

async function start() {
  try {
    who = await api("/v1/whoami");
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      auth.clear();
      loginView(e.status === 401 ? "That key was not accepted: check it and sign in again." : e.message);
    } else {
      main.replaceChildren(notice(`The API did not answer (${e.message}). Is tessera up still running?`, "error"));
    }
    return;
  }
  who.system_admin = who.tenant === "admin" && who.role === "admin";
  // The view first: the header's tenant menu (a list call) fills in beside it.
  render();
  renderWho();
}

// Links inside the console navigate without reloading the page.
document.addEventListener("click", (e) => {
  const a = e.target.closest?.("a[href]");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const u = new URL(a.href, location.href);
  if (u.origin !== location.origin || !u.pathname.startsWith("/ui") || a.target) return;
  e.preventDefault();
  navigate(u.pathname + u.search);
  main.focus({ preventScroll: true });
});
window.addEventListener("popstate", () => render());
// Leaving the page closes the view's streams: a page kept in the back-forward
// cache would otherwise hold its watch connections open, and a browser allows only
// six per server. Coming back from that cache draws the view afresh.
window.addEventListener("pagehide", () => {
  if (unmount) { try { unmount(); } catch (e) { console.error(e); } unmount = null; }
});
window.addEventListener("pageshow", (e) => { if (e.persisted && who) render(); });
auth.onUnauthorized(() => { auth.clear(); loginView("Your key is no longer accepted (revoked or expired): sign in again."); });

takeKeyFromFragment();
if (auth.key()) start(); else loginView();
