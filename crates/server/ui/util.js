// Small helpers shared by the views: a DOM builder (text is always set as text,
// never parsed as HTML), escaping for the SVG strings the heat map builds, and
// formatting of bytes, ages, times and milli-GPUs.

/** Builds an element: h("a", {href: "/ui"}, "text", child, ...). */
export function h(tag, attrs, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Escapes text for an HTML or SVG string. */
export function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

export function fmtBytes(b) {
  if (!b) return "0";
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  let v = b;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return `${v >= 10 || i === 0 ? Math.round(v) : v.toFixed(1)} ${u[i]}`;
}

/** "3 s", "5 min", "2 h", "4 d" since `ms` (epoch milliseconds). */
export function fmtAge(ms, now = Date.now()) {
  if (!ms) return "–";
  const s = Math.max(0, (now - ms) / 1000);
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

export function fmtTime(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** Milliseconds as "850 ms" or "1.2 s". */
export function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  if (ms < 1000) return `${Math.round(ms * 10) / 10} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  return `${(ms / 60000).toFixed(1)} min`;
}

/** Milli-GPU as GPUs: 1000 -> "1", 250 -> "0.25". */
export function fmtGpu(milli) {
  const v = (milli || 0) / 1000;
  return Number.isInteger(v) ? String(v) : v.toFixed(2).replace(/0+$/, "");
}

export function fmtCpu(milli) {
  const v = (milli || 0) / 1000;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

export function fmtMoney(v, currency) {
  if (v === null || v === undefined) return "–";
  const digits = v !== 0 && Math.abs(v) < 0.01 ? 6 : 2;
  return `${v.toFixed(digits)} ${currency || ""}`.trim();
}

// Tenant colours: distinct hues dark enough for white text and for 3:1 against the
// page (graphics contrast), assigned by a stable hash of the name.
const PALETTE = ["#1f5fbf", "#b3471d", "#2b7a3d", "#7a3fa0", "#a3195b", "#0f6e78",
  "#8a5a00", "#4a56a6", "#6b6b1f", "#9c2f2f"];
export const OTHER_TENANT = "#6e7681";

export function tenantColor(name, own) {
  if (!name) return OTHER_TENANT;
  if (own && name === own) return PALETTE[0];
  let hsh = 2166136261;
  for (const ch of name) { hsh ^= ch.codePointAt(0); hsh = Math.imul(hsh, 16777619); }
  return PALETTE[1 + ((hsh >>> 0) % (PALETTE.length - 1))];
}

// Utilisation (share of the GPU allocated), light to dark.
const UTIL = ["#c6dbef", "#9ecae1", "#6baed6", "#3182bd", "#08519c"];
export function utilColor(frac) {
  const i = Math.min(UTIL.length - 1, Math.max(0, Math.ceil(frac * UTIL.length) - 1));
  return UTIL[i];
}
export const UTIL_STEPS = UTIL;

/** Debounces `f` by `ms`. */
export function debounce(f, ms) {
  let t = null;
  return (...a) => {
    clearTimeout(t);
    t = setTimeout(() => f(...a), ms);
  };
}

/** A labelled definition list from [label, value] pairs. */
export function dl(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

/** A message in a view (errors name what failed and what to do). */
export function notice(text, kind = "info") {
  return h("p", { class: `notice ${kind}`, role: kind === "error" ? "alert" : null }, text);
}
