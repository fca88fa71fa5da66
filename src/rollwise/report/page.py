"""The report page's static parts: CSS and the rollout browser's JavaScript, both inlined into the HTML.

The browser reads its data from `<script type="application/json" id="rollout-data">` and builds the group
list, the search filter and the group view with DOM calls (`textContent`, never `innerHTML` with data), so
rollout text cannot inject markup.
"""

from __future__ import annotations

CSS = """
:root { --fg:#111827; --muted:#6b7280; --line:#e5e7eb; --bg:#ffffff; --panel:#f9fafb; --accent:#2563eb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg);
       margin: 0 auto; padding: 16px 24px 48px; max-width: 1440px; }
h1 { font-size: 22px; margin: 4px 0 2px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.muted { color: var(--muted); } code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
.notes { background: #fffbeb; border: 1px solid #fcd34d; border-radius: 6px; padding: 6px 12px; margin: 10px 0; }
.notes li { margin: 2px 0; }
.kpis { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.kpi { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; min-width: 120px; }
.kpi .v { font-size: 20px; font-weight: 600; } .kpi .k { color: var(--muted); font-size: 12px; }
table.card { border-collapse: collapse; margin: 6px 0; } table.card td, table.card th { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
table.card th { background: var(--panel); font-weight: 600; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(470px, 1fr)); gap: 12px; }
figure.plot { margin: 0; background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 8px; }
figure.plot figcaption { font-weight: 600; margin: 0 0 2px 4px; }
figure.plot .desc { color: var(--muted); font-size: 12px; margin: 0 0 4px 4px; }
svg .grid { stroke: #e5e7eb; stroke-width: 1; } svg .axis { stroke: #9ca3af; stroke-width: 1; }
svg .tick { font-size: 10px; fill: #6b7280; } svg .label { font-size: 11px; fill: #374151; } svg .legend { font-size: 11px; fill: #111827; }
svg .seglabel { font-size: 9.5px; fill: #1e3a8a; } svg .leaflabel { font-size: 10.5px; fill: #111827; }
figure.plot.tree { grid-column: 1 / -1; max-width: 680px; } figure.plot.tree svg { max-width: 100%; height: auto; }
#browser { display: grid; grid-template-columns: minmax(280px, 32%) 1fr; gap: 12px; align-items: start; }
#browser-controls { display: flex; gap: 8px; margin-bottom: 6px; }
#search { flex: 1; padding: 6px 8px; border: 1px solid #d1d5db; border-radius: 6px; font-size: 14px; }
#status-filter { padding: 6px; border: 1px solid #d1d5db; border-radius: 6px; }
#groups { max-height: 760px; overflow: auto; border: 1px solid var(--line); border-radius: 8px; }
.group-item { padding: 6px 10px; border-bottom: 1px solid var(--line); cursor: pointer; }
.group-item:hover { background: #eff6ff; } .group-item.active { background: #dbeafe; }
.group-item .gp { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.group-item .gm { color: var(--muted); font-size: 12px; }
#group-view { border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; min-height: 200px; }
.prompt { white-space: pre-wrap; background: var(--panel); border-radius: 6px; padding: 6px 8px; margin: 6px 0 10px; }
.sample { border: 1px solid var(--line); border-radius: 8px; padding: 6px 10px; margin: 8px 0; }
.sample-head { display: flex; flex-wrap: wrap; gap: 12px; font-size: 13px; margin-bottom: 4px; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 600; }
.st-kept { background: #dcfce7; color: #166534; } .st-filtered { background: #e0e7ff; color: #3730a3; }
.st-errored { background: #fee2e2; color: #991b1b; } .st-truncated { background: #fef3c7; color: #92400e; }
.st-aborted { background: #e5e7eb; color: #374151; }
.tokens { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; line-height: 1.7; }
.tok { border-radius: 2px; } .tok.env { color: #6b7280; font-style: italic; background: #f3f4f6; }
.tok.id { margin-right: 3px; padding: 0 2px; }
.scale { display: inline-flex; align-items: center; gap: 6px; font-size: 12px; color: var(--muted); }
.scale span.sw { width: 16px; height: 12px; display: inline-block; border-radius: 2px; border: 1px solid #d1d5db; }
.completion-text { white-space: pre-wrap; font-size: 12.5px; color: #374151; border-top: 1px dashed var(--line); margin-top: 4px; padding-top: 4px; }
"""

JS = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("rollout-data").textContent);
  const groups = data.groups;
  const list = document.getElementById("groups");
  const view = document.getElementById("group-view");
  const search = document.getElementById("search");
  const statusFilter = document.getElementById("status-filter");
  const count = document.getElementById("match-count");
  const MAX_LIST = 400;
  let active = null;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fmt(v, nd) { return (v === null || v === undefined) ? "–" : Number(v).toFixed(nd === undefined ? 3 : nd); }
  function promptText(g) { return g.prompt !== null ? g.prompt : "[" + (g.prompt_ids || []).join(" ") + "]"; }
  // Probability of the sampled token, exp(logprob), as a colour: red (unlikely) to white (certain).
  function shade(lp) {
    if (lp === null || lp === undefined) return "transparent";
    const p = Math.exp(Math.min(0, lp));
    const a = (1 - p) * 0.85;
    return "rgba(220, 38, 38, " + a.toFixed(3) + ")";
  }
  function haystack(g) {
    return (promptText(g) + " " + g.prompt_id + " " + g.group_id).toLowerCase();
  }
  groups.forEach(function (g) { g._hay = haystack(g); });

  function summary(g) {
    const rs = g.samples.map(function (s) { return s.reward; }).filter(function (r) { return r !== null; });
    const mean = rs.length ? rs.reduce(function (a, b) { return a + b; }, 0) / rs.length : null;
    const st = {};
    g.samples.forEach(function (s) { st[s.status] = (st[s.status] || 0) + 1; });
    const parts = Object.keys(st).map(function (k) { return k + " " + st[k]; });
    return "step " + g.step + " · " + g.samples.length + " samples · mean reward " + fmt(mean, 2) + " · " + parts.join(", ");
  }

  function renderList() {
    const q = search.value.trim().toLowerCase();
    const want = statusFilter.value;
    const terms = q ? q.split(/\s+/) : [];
    const matched = groups.filter(function (g) {
      if (want && !g.samples.some(function (s) { return s.status === want; })) return false;
      return terms.every(function (t) { return g._hay.indexOf(t) >= 0; });
    });
    list.replaceChildren();
    matched.slice(0, MAX_LIST).forEach(function (g) {
      const item = el("div", "group-item");
      item.dataset.groupId = g.group_id;
      item.dataset.step = String(g.step);
      if (active === g) item.classList.add("active");
      item.appendChild(el("div", "gp mono", g.prompt_id + " — " + promptText(g).slice(0, 120)));
      item.appendChild(el("div", "gm", summary(g)));
      item.addEventListener("click", function () { openGroup(g); });
      list.appendChild(item);
    });
    count.textContent = "showing " + Math.min(matched.length, MAX_LIST) + " of " + matched.length +
      " matching groups (" + groups.length + " embedded)";
  }

  function tokensOf(s) {
    const box = el("div", "tokens");
    const n = s.lp.length;
    for (let i = 0; i < n; i++) {
      const isEnv = s.mask && s.mask[i] === 0;
      const label = s.tok ? s.tok[i] : String(s.ids[i]);
      const span = el("span", "tok" + (isEnv ? " env" : "") + (s.tok ? "" : " id"), label);
      if (!isEnv) span.style.backgroundColor = shade(s.lp[i]);
      span.title = "token " + s.ids[i] + (isEnv ? " (environment)" : "") + " · logprob " + fmt(s.lp[i]) +
        " · p " + (s.lp[i] === null ? "–" : Math.exp(s.lp[i]).toFixed(3));
      box.appendChild(span);
    }
    if (s.n > n) box.appendChild(el("span", "muted", " … " + (s.n - n) + " more tokens not embedded"));
    return box;
  }

  function openGroup(g) {
    active = g;
    Array.prototype.forEach.call(list.children, function (c) {
      c.classList.toggle("active", c.dataset.groupId === g.group_id && c.dataset.step === String(g.step));
    });
    view.replaceChildren();
    view.dataset.groupId = g.group_id;
    view.appendChild(el("h3", null, "Group " + g.group_id));
    view.appendChild(el("div", "muted", "prompt " + g.prompt_id + " · step " + g.step + " · " + g.samples.length + " samples"));
    view.appendChild(el("div", "prompt mono", promptText(g)));
    const scale = el("div", "scale", "token shading: p(token) = exp(logprob) ");
    [1, 0.5, 0.1, 0.01].forEach(function (p) {
      const sw = el("span", "sw"); sw.style.backgroundColor = shade(Math.log(p)); scale.appendChild(sw);
      scale.appendChild(el("span", null, String(p)));
    });
    view.appendChild(scale);
    g.samples.forEach(function (s) {
      const card = el("div", "sample");
      card.dataset.status = s.status;
      const head = el("div", "sample-head");
      head.appendChild(el("b", null, "#" + s.i));
      head.appendChild(el("span", "badge st-" + s.status, s.status));
      head.appendChild(el("span", "reward", "reward " + fmt(s.reward)));
      head.appendChild(el("span", "advantage", "advantage " + fmt(s.adv)));
      head.appendChild(el("span", "muted", "finish " + (s.finish || "–") + " · " + s.n + " tokens" +
        (s.versions ? " · weights v" + s.versions[0] + (s.versions[1] !== s.versions[0] ? "–" + s.versions[1] : "") : "")));
      const parts = Object.keys(s.parts || {});
      if (parts.length) head.appendChild(el("span", "muted", parts.map(function (k) { return k + "=" + fmt(s.parts[k], 2); }).join(" ")));
      if (s.tree) head.appendChild(el("span", "muted tree-link", s.tree[1] === s.n ? "copy of #" + s.tree[0] :
        "branched from #" + s.tree[0] + " at token " + s.tree[1] + " (" + (s.n - s.tree[1]) + " own tokens)"));
      if (s.reason) head.appendChild(el("span", "muted", "reason: " + s.reason));
      card.appendChild(head);
      card.appendChild(tokensOf(s));
      if (s.text) card.appendChild(el("div", "completion-text", s.text));
      view.appendChild(card);
    });
  }

  search.addEventListener("input", renderList);
  statusFilter.addEventListener("change", renderList);
  renderList();
  if (groups.length) openGroup(groups[0]);
  else view.appendChild(el("div", "muted", "No rollouts embedded."));
})();
"""
