// Jobs: the tenant's jobs (phase, queue, tasks bound, age, why it waits), kept
// current by the SSE watch; and a job's page: its tasks (node, GPUs, MIG instance,
// state), its events as a timeline, its log tail (follow), cancel and delete.
//
// The list is drawn in windows (only the rows in view exist), newest first; a row
// keeps its place when the job changes, and when new jobs arrive above the rows in
// view the list scrolls by as many rows, so nothing under the reader's eyes moves.

import { api, listAndWatch, stream } from "./api.js";
import { debounce, dl, fmtAge, fmtGpu, fmtTime, h, notice } from "./util.js";

const ROW = 32; // px, as .scroller td height + border

function phasePill(p) {
  return h("span", { class: `pill phase-${p || "pending"}` }, p || "pending");
}

function bound(j) {
  const tasks = j.spec?.tasks?.length || 0;
  const st = j.status?.tasks || {};
  const n = Object.values(st).filter((t) => t.node && t.state !== "evicted").length;
  return `${n}/${tasks}`;
}

function gpuAsk(t) {
  const g = t.gpu;
  if (!g || g === "none") return "–";
  if (g.whole) return `${g.whole.count} GPU`;
  if (g.shared) return `${fmtGpu(g.shared.milli)} GPU share`;
  if (g.mig) return `MIG ${g.mig.profile}`;
  return JSON.stringify(g);
}

function reasonOf(j) {
  return j.status?.pending_reason || j.status?.reason || j.status?.message || "";
}

export function mountList(el, ctx) {
  ctx.title("Jobs");
  const q = ctx.query;
  const f = { phase: q.get("phase") || "", queue: q.get("queue") || "", q: q.get("q") || "" };
  const jobs = new Map();
  let order = [];
  let visible = [];
  const scroller = h("div", { class: "scroller", id: "jobs-scroll", tabindex: "0", role: "region", "aria-label": "Jobs" });
  const tbody = h("tbody", {});
  const table = h("table", { id: "jobs" },
    h("colgroup", {}, h("col", { width: "22%" }), h("col", { width: "10%" }), h("col", { width: "12%" }), h("col", { width: "8%" }), h("col", { width: "8%" }), h("col", {})),
    h("thead", {}, h("tr", {}, ["Job", "Phase", "Queue", "Tasks", "Age", "Reason"].map((c) => h("th", { scope: "col" }, c)))),
    tbody);
  scroller.append(table);
  const count = h("span", { class: "sub", id: "job-count" });
  const phaseSel = h("select", { id: "phase", onchange: () => { f.phase = phaseSel.value; ctx.setQuery({ phase: f.phase }); refilter(); } },
    ["", "pending", "running", "succeeded", "failed", "cancelled"].map((p) => h("option", { value: p, selected: p === f.phase }, p || "any")));
  const queueIn = h("input", { id: "queue", value: f.queue, oninput: () => { f.queue = queueIn.value.trim(); ctx.setQuery({ queue: f.queue }); refilter(); } });
  const textIn = h("input", { id: "q", value: f.q, placeholder: "name", oninput: () => { f.q = textIn.value.trim(); ctx.setQuery({ q: f.q }); refilter(); } });
  const msg = h("div", {});
  el.append(
    h("h1", {}, "Jobs ", count),
    h("div", { class: "toolbar", role: "search", "aria-label": "Filter jobs" },
      h("div", { class: "field" }, h("label", { for: "phase" }, "Phase"), phaseSel),
      h("div", { class: "field" }, h("label", { for: "queue" }, "Queue"), queueIn),
      h("div", { class: "field" }, h("label", { for: "q" }, "Name contains"), textIn)),
    msg,
    scroller);

  const keep = (j) => (!f.phase || (j.status?.phase || "pending") === f.phase)
    && (!f.queue || j.spec?.queue === f.queue)
    && (!f.q || j.name.includes(f.q));
  const newer = (a, b) => (b.created_at || 0) - (a.created_at || 0) || a.name.localeCompare(b.name);

  function refilter() {
    order = [...jobs.values()].sort(newer);
    visible = order.filter(keep);
    paint();
  }

  function row(j) {
    return h("tr", { "data-job": j.name },
      h("td", {}, h("a", { href: `/ui/jobs/${encodeURIComponent(j.name)}` }, j.name)),
      h("td", {}, phasePill(j.status?.phase)),
      h("td", {}, j.spec?.queue || ""),
      h("td", { class: "num" }, bound(j)),
      h("td", { title: fmtTime(j.created_at) }, fmtAge(j.created_at)),
      h("td", { class: "reason", title: reasonOf(j) }, reasonOf(j)));
  }

  function paint() {
    count.textContent = `${visible.length} of ${jobs.size}`;
    const top = scroller.scrollTop;
    const height = scroller.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW) - 10);
    const last = Math.min(visible.length, Math.ceil((top + height) / ROW) + 10);
    const before = h("tr", { class: "spacer", "aria-hidden": "true" }, h("td", { colspan: 6 }));
    const after = h("tr", { class: "spacer", "aria-hidden": "true" }, h("td", { colspan: 6 }));
    before.firstChild.style.height = `${first * ROW}px`;
    after.firstChild.style.height = `${(visible.length - last) * ROW}px`;
    tbody.replaceChildren(before, ...visible.slice(first, last).map(row), after);
  }
  scroller.addEventListener("scroll", () => requestAnimationFrame(paint));

  const repaint = debounce(paint, 50);
  const sub = listAndWatch("job", "/v1/jobs", {
    onState: (s) => ctx.status(s === "live" ? "" : `jobs: ${s}`),
    loaded: (items) => {
      jobs.clear();
      for (const j of items) jobs.set(j.name, j);
      refilter();
      msg.replaceChildren(items.length ? "" : notice("No jobs yet: submit one with `tessera job submit -f job.yaml`."));
      requestAnimationFrame(() => { window.__console.paints.jobs = performance.now(); });
    },
    apply: (op, j) => {
      const known = jobs.has(j.name);
      if (op === "deleted") jobs.delete(j.name);
      else jobs.set(j.name, j);
      if (known && op !== "deleted") {
        // In place: same position, new content.
        const i = visible.findIndex((x) => x.name === j.name);
        if (i >= 0) visible[i] = j;
        const oi = order.findIndex((x) => x.name === j.name);
        if (oi >= 0) order[oi] = j;
        const tr = tbody.querySelector(`tr[data-job="${CSS.escape(j.name)}"]`);
        if (tr) tr.replaceWith(row(j));
      } else {
        // A new (or removed) job: rows above the view shift the view with them.
        const anchor = Math.floor(scroller.scrollTop / ROW);
        const firstName = visible[anchor]?.name;
        refilter();
        if (firstName && scroller.scrollTop > 0) {
          const ni = visible.findIndex((x) => x.name === firstName);
          if (ni >= 0) scroller.scrollTop += (ni - anchor) * ROW;
        }
      }
      window.__console.applied.push({ view: "jobs", job: j.name, at: Date.now() });
      repaint();
    },
  });
  return () => sub.close();
}

export function mountJob(el, ctx) {
  const name = ctx.params.name;
  ctx.title(`Job ${name}`);
  let job = null;
  let closed = false;
  let follow = ctx.query.get("follow") === "1";
  let task = ctx.query.get("task") || "";
  let logTimer = null;
  const head = h("div", {});
  const tasksEl = h("div", {});
  const eventsEl = h("ol", { class: "timeline", id: "timeline" });
  const logEl = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "Log tail" }, "…");
  const taskSel = h("select", { id: "log-task", onchange: () => { task = taskSel.value; ctx.setQuery({ task }); loadLog(); } });
  const followBox = h("input", { type: "checkbox", id: "follow", checked: follow, onchange: () => { follow = followBox.checked; ctx.setQuery({ follow: follow ? "1" : null }); schedule(); } });
  const actions = h("div", { class: "actions" });
  const msg = h("div", {});
  el.append(
    h("p", {}, h("a", { href: "/ui/jobs" }, "← Jobs")),
    h("h1", {}, "Job ", h("span", { id: "job-name" }, name)),
    msg, head, actions,
    h("h2", {}, "Tasks"), tasksEl,
    h("h2", {}, "Events"), eventsEl,
    h("h2", {}, "Log tail"),
    h("div", { class: "toolbar" },
      h("div", { class: "field" }, h("label", { for: "log-task" }, "Task"), taskSel),
      h("div", { class: "field" }, h("label", { for: "follow" }, "Follow"), followBox)),
    logEl);

  function drawActions() {
    actions.replaceChildren();
    if (!job) return;
    const final = ["succeeded", "failed", "cancelled"].includes(job.status?.phase);
    if (!ctx.can("developer")) {
      actions.append(h("span", { class: "muted" }, "Cancelling and deleting need the developer role (and are off while a system admin views as a tenant)."));
      return;
    }
    if (!final) {
      actions.append(h("button", { type: "button", id: "cancel", onclick: async () => {
        try { job = await api(`/v1/jobs/${encodeURIComponent(name)}/cancel`, { method: "POST" }); draw(); ctx.status(`job ${name} cancelled`); } catch (e) { msg.replaceChildren(notice(`Cancel failed: ${e.message}`, "error")); }
      } }, "Cancel job"));
    }
    const del = h("button", { type: "button", class: "danger", id: "delete", onclick: () => {
      del.replaceWith(h("span", { role: "group", "aria-label": "Confirm delete" }, `Delete ${name} and its logs? `,
        h("button", { type: "button", class: "danger", id: "delete-yes", onclick: async () => {
          try {
            await api(`/v1/jobs/${encodeURIComponent(name)}`, { method: "DELETE" });
            ctx.navigate("/ui/jobs");
          } catch (e) { msg.replaceChildren(notice(`Delete failed: ${e.message}`, "error")); drawActions(); }
        } }, "Delete"), " ",
        h("button", { type: "button", class: "secondary", onclick: drawActions }, "Keep it")));
    } }, "Delete job…");
    actions.append(del);
  }

  function draw() {
    if (!job) return;
    const st = job.status || {};
    head.replaceChildren(dl([
      ["Phase", phasePill(st.phase)],
      ["Queue", job.spec.queue],
      ["Priority", String(job.spec.priority ?? 0)],
      ["Kind", job.spec.kind || "batch"],
      ["Submitted", `${fmtTime(job.created_at)} (${fmtAge(job.created_at)} ago)`],
      st.started_at ? ["Started", fmtTime(st.started_at)] : null,
      st.finished_at ? ["Finished", fmtTime(st.finished_at)] : null,
      reasonOf(job) ? ["Reason", h("span", { class: "reason", id: "job-reason" }, reasonOf(job))] : null,
      ["Admitted", st.admitted ? "yes" : "no"],
    ]));
    const rows = job.spec.tasks.map((t) => {
      const s = (st.tasks || {})[t.name] || {};
      const mig = s.mig ? `${s.mig.profile} @ slice ${s.mig.start}` : t.gpu?.mig ? `${t.gpu.mig.profile} (instance not named)` : "–";
      return h("tr", { "data-task": t.name },
        h("th", { scope: "row" }, t.name),
        h("td", {}, s.node ? h("a", { href: `/ui/cluster?node=${encodeURIComponent(s.node)}` }, s.node) : h("span", { class: "muted" }, "not bound")),
        h("td", {}, gpuAsk(t)),
        h("td", {}, (s.gpus || []).length ? s.gpus.join(", ") : "–"),
        h("td", {}, s.node ? mig : "–"),
        h("td", {}, s.state || (s.node ? "bound" : "pending")),
        h("td", { class: "reason" }, [s.reason, s.message, s.preemptor ? `preempted by ${s.preemptor}` : null].filter(Boolean).join(" · ")));
    });
    tasksEl.replaceChildren(h("table", { id: "tasks" },
      h("thead", {}, h("tr", {}, ["Task", "Node", "Asks", "GPUs", "MIG instance", "State", "Why"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows)));
    if (!taskSel.options.length) {
      taskSel.replaceChildren(h("option", { value: "" }, "all tasks"), ...job.spec.tasks.map((t) => h("option", { value: t.name, selected: t.name === task }, t.name)));
    }
    drawActions();
  }

  function addEvent(e) {
    if (eventsEl.querySelector(`[data-event="${CSS.escape(e.name)}"]`)) return;
    const li = h("li", { "data-event": e.name, "data-at": e.at },
      h("time", { datetime: new Date(e.at).toISOString() }, fmtTime(e.at)),
      h("strong", {}, e.reason), " ", e.message);
    // Oldest first; a late event goes to its place.
    const after = [...eventsEl.children].find((x) => Number(x.dataset.at) > e.at);
    eventsEl.insertBefore(li, after || null);
  }

  async function loadLog() {
    try {
      const t = await api(`/v1/jobs/${encodeURIComponent(name)}/logs${task ? `?task=${encodeURIComponent(task)}` : ""}`, { text: true });
      const lines = t.split("\n");
      logEl.textContent = lines.slice(-400).join("\n") || "(no output yet)";
      if (follow) logEl.scrollTop = logEl.scrollHeight;
    } catch (e) {
      logEl.textContent = `(no log: ${e.message})`;
    }
  }

  function schedule() {
    clearTimeout(logTimer);
    const final = ["succeeded", "failed", "cancelled"].includes(job?.status?.phase);
    if (follow && !closed) {
      // The log has no stream in the API: its tail is read again every 2 s while
      // following (and once more after the job ends).
      logTimer = setTimeout(async () => { await loadLog(); if (!final) schedule(); }, 2000);
    }
  }

  async function load() {
    try {
      job = await api(`/v1/jobs/${encodeURIComponent(name)}`);
    } catch (e) {
      msg.replaceChildren(notice(e.status === 404 ? `No job ${name} in tenant ${ctx.tenant}.` : `Could not read the job: ${e.message}`, "error"));
      return;
    }
    draw();
    try {
      const ev = await api(`/v1/cluster/events?object=${encodeURIComponent(`job/${name}`)}`);
      for (const e of ev.items) addEvent(e);
      if (!ev.items.length) eventsEl.replaceChildren(h("li", { class: "muted" }, "no events yet"));
    } catch (e) {
      eventsEl.replaceChildren(h("li", {}, `events unavailable: ${e.message}`));
    }
    loadLog();
    schedule();
    requestAnimationFrame(() => { window.__console.paints.job = performance.now(); });
  }
  const jobSub = stream((last) => `/v1/watch?kind=job${last ? `&after=${last}` : ""}`, {
    onEvent: (ev) => {
      const o = JSON.parse(ev.data);
      if (o.name !== name) return;
      if (ev.event === "deleted") { msg.replaceChildren(notice(`Job ${name} was deleted.`)); return; }
      if (job && o.resource_version <= job.resource_version) return;
      job = o;
      draw();
    },
  });
  const evSub = stream((last) => `/v1/watch?kind=event${last ? `&after=${last}` : ""}`, {
    onEvent: (ev) => {
      const e = JSON.parse(ev.data);
      if (e.object !== `job/${name}`) return;
      eventsEl.querySelector("li.muted")?.remove();
      addEvent(e);
    },
  });
  load();
  return () => { closed = true; clearTimeout(logTimer); jobSub.close(); evSub.close(); };
}
