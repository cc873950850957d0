// FrogNano review: the page. Hand-written, no framework, no network beyond this server.
// Views: #/ (runs), #/run/ID (a solve, eval or train run). docs/review.md describes them.
"use strict";

const app = document.getElementById("app");
let stopLive = () => {};

// ---------- helpers ----------
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fmtNum = (n) => (n == null ? "" : Number(n).toLocaleString("en-US"));
function fmtSecs(s) {
  if (s == null || isNaN(s)) return "";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 90) return `${s.toFixed(1)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}
function ago(unix) {
  if (!unix) return "";
  const d = Date.now() / 1000 - unix;
  if (d < 60) return "just now";
  if (d < 3600) return `${Math.floor(d / 60)} min ago`;
  if (d < 86400) return `${Math.floor(d / 3600)} h ago`;
  if (d < 86400 * 14) return `${Math.floor(d / 86400)} d ago`;
  return new Date(unix * 1000).toLocaleDateString();
}
const when = (unix) => (unix ? new Date(unix * 1000).toLocaleString() : "");
const runHref = (id) => `#/run/${encodeURIComponent(id)}`;

async function api(path, body) {
  const opts = body === undefined ? {} : { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) };
  let res;
  try {
    res = await fetch(path, opts);
  } catch (e) {
    throw new Error(`the review server does not answer (${e.message}); is frognano review still running?`);
  }
  let data = null;
  try { data = await res.json(); } catch (_) { /* not JSON */ }
  if (!res.ok) throw new Error((data && data.error) || `${res.status} ${res.statusText}`);
  return data;
}

function toast(text) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.classList.add("show");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.remove("show"), 3500);
}

function problemPage(title, why, extra = "") {
  app.innerHTML = `<div class="crumbs"><a href="#/">← All runs</a></div>
    <div class="card problem" id="problem"><h1>${esc(title)}</h1><div class="why">${esc(why)}</div>${extra}</div>`;
}

const EXIT = {
  agent: ["green", "finished"], max_turns: ["amber", "step limit"], max_time: ["amber", "time limit"],
  max_context_len: ["amber", "context full"], max_tokens_per_turn: ["amber", "reply cut"],
  llm_query_error: ["red", "model error"], cancelled: ["", "cancelled"], running: ["blue", "running"],
};
function exitBadge(reason, live) {
  if (live) return `<span class="badge blue live"><span class="dot"></span>running</span>`;
  if (!reason) return "";
  const [cls, label] = EXIT[reason] || ["", reason];
  return `<span class="badge ${cls}" title="exit reason: ${esc(reason)}">${esc(label)}</span>`;
}
function stateBadge(state) {
  if (!state) return `<span class="badge state-badge" data-state="pending">to review</span>`;
  const m = { apply: ["green", "applied"], reject: ["red", "rejected"], send_back: ["violet", "sent back"] }[state.action] || ["", state.action];
  return `<span class="badge ${m[0]} state-badge" data-state="${esc(state.action)}" title="${esc(state.by)}, ${esc(when(state.at_unix))}${state.note ? ": " + esc(state.note) : ""}">${m[1]}</span>`;
}
const kindBadge = (k) => (k === "eval" ? `<span class="badge blue">eval</span>` : k === "train" ? `<span class="badge violet">train</span>` : "");

// ---------- syntax highlighting (small, per line) ----------
const KW = {
  py: "and as assert async await break class continue def del elif else except False finally for from global if import in is lambda None nonlocal not or pass raise return True try while with yield self",
  rs: "as async await break const continue crate dyn else enum extern false fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait true type unsafe use where while Some None Ok Err",
  js: "async await break case catch class const continue default delete do else export extends false finally for function if import in instanceof let new null of return super switch this throw true try typeof undefined var void while yield",
  sh: "if then else elif fi for while do done case esac in function return local export set echo exit",
  go: "break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var nil true false",
  c: "auto break case char const continue default do double else enum extern float for goto if int long register return short signed sizeof static struct switch typedef union unsigned void volatile while bool true false class public private protected new delete namespace template this",
};
const LANG = { py: "py", pyi: "py", rs: "rs", js: "js", ts: "js", jsx: "js", tsx: "js", mjs: "js", json: "js", sh: "sh", bash: "sh", zsh: "sh", go: "go", c: "c", h: "c", cc: "c", cpp: "c", hpp: "c", java: "c", kt: "c", cs: "c", toml: "sh", yaml: "sh", yml: "sh", cfg: "sh", ini: "sh", rb: "py" };
const kwSets = {};
function langOf(path) {
  const name = String(path || "").split("/").pop();
  if (/^(Makefile|Dockerfile)$/.test(name)) return "sh";
  return LANG[name.includes(".") ? name.split(".").pop().toLowerCase() : ""] || null;
}
function highlight(text, lang) {
  if (!lang || text.length > 3000) return esc(text);
  const kws = kwSets[lang] || (kwSets[lang] = new Set(KW[lang].split(" ")));
  const hashComment = lang === "py" || lang === "sh";
  const re = hashComment
    ? /(#.*$)|("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?)|(\b\d[\d_]*(?:\.\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)(\s*\()?/g
    : /(\/\/.*$|\/\*.*?(?:\*\/|$))|("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)'|`(?:[^`\\]|\\.)*`?)|(\b\d[\d_]*(?:\.\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)(\s*\()?/g;
  let out = "", last = 0, m;
  while ((m = re.exec(text))) {
    out += esc(text.slice(last, m.index));
    if (m[1]) out += `<span class="hl-com">${esc(m[1])}</span>`;
    else if (m[2]) out += `<span class="hl-str">${esc(m[2])}</span>`;
    else if (m[3]) out += `<span class="hl-num">${esc(m[3])}</span>`;
    else if (kws.has(m[4])) out += `<span class="hl-kw">${esc(m[4])}</span>${esc(m[5] || "")}`;
    else if (m[5]) out += `<span class="hl-fn">${esc(m[4])}</span>${esc(m[5])}`;
    else out += esc(m[0]);
    last = re.lastIndex;
    if (m[0].length === 0) re.lastIndex++;
  }
  return out + esc(text.slice(last));
}

// ---------- diffs ----------
// Rows of a side-by-side table from numbered lines [{kind, old, new, text}]: runs of - and +
// are paired line by line, context lines sit on both sides.
function sideBySide(lines, lang) {
  const rows = [];
  let dels = [], adds = [];
  const flush = () => {
    const n = Math.max(dels.length, adds.length);
    for (let i = 0; i < n; i++) {
      const d = dels[i], a = adds[i];
      rows.push(`<tr>${d ? `<td class="ln del">${d.old ?? ""}</td><td class="code del">${highlight(d.text, lang)}</td>` : `<td class="ln blank"></td><td class="code blank"></td>`}` +
        `${a ? `<td class="ln add sep">${a.new ?? ""}</td><td class="code add">${highlight(a.text, lang)}</td>` : `<td class="ln blank sep"></td><td class="code blank"></td>`}</tr>`);
    }
    dels = []; adds = [];
  };
  for (const l of lines) {
    if (l.kind === "-") { if (adds.length) flush(); dels.push(l); continue; }
    if (l.kind === "+") { adds.push(l); continue; }
    flush();
    if (l.kind === "@") rows.push(`<tr class="hunk"><td colspan="4">${esc(l.text)}</td></tr>`);
    else if (l.kind === "\\") rows.push(`<tr><td class="ln"></td><td class="code muted" colspan="3">${esc(l.text.trim())}</td></tr>`);
    else rows.push(`<tr><td class="ln">${l.old ?? ""}</td><td class="code">${highlight(l.text, lang)}</td><td class="ln sep">${l.new ?? ""}</td><td class="code">${highlight(l.text, lang)}</td></tr>`);
  }
  flush();
  // Fixed column widths: with table-layout fixed the first row (often a hunk header spanning
  // all four) would otherwise split the width in four equal columns.
  return `<table class="diff"><colgroup><col style="width:48px"><col><col style="width:48px"><col></colgroup>${rows.join("")}</table>`;
}

function fileCard(f) {
  const status = { added: ["green", "new"], deleted: ["red", "deleted"], renamed: ["blue", "renamed"] }[f.status];
  const part = f.parts > 1 ? `<span class="muted">part ${f.part} of ${f.parts}</span>` : "";
  const body = f.binary
    ? `<div class="binary">Binary file: its contents are in patch.diff but not shown here.</div>`
    : f.lines.length === 0
      ? `<div class="binary">No content change (${esc(f.status)}).</div>`
      : sideBySide(f.lines, langOf(f.path));
  return `<div class="diff-file" data-path="${esc(f.path)}">
    <div class="diff-head">${status ? `<span class="badge ${status[0]}">${status[1]}</span>` : ""}
      <span class="path">${f.old_path ? esc(f.old_path) + " → " : ""}${esc(f.path)}</span>${part}
      <span class="stat"><span class="plus">+${f.additions}</span> <span class="minus">−${f.deletions}</span></span></div>${body}</div>`;
}

// Line diff of two texts (an Edit's old_string → new_string), as numbered lines.
function lineDiff(a, b) {
  // A newline that ends both is not a line of its own.
  if (a.endsWith("\n") && b.endsWith("\n")) { a = a.slice(0, -1); b = b.slice(0, -1); }
  const A = a.split("\n"), B = b.split("\n");
  if (A.length * B.length > 4e6) {
    return [...A.map((t, i) => ({ kind: "-", old: i + 1, text: t })), ...B.map((t, i) => ({ kind: "+", new: i + 1, text: t }))];
  }
  const n = A.length, m = B.length;
  const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = A[i] === B[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && A[i] === B[j]) { out.push({ kind: " ", old: i + 1, new: j + 1, text: A[i] }); i++; j++; }
    // Deletions before insertions, so a changed line pairs with its replacement.
    else if (i < n && (j >= m || L[i + 1][j] >= L[i][j + 1])) { out.push({ kind: "-", old: i + 1, text: A[i] }); i++; }
    else { out.push({ kind: "+", new: j + 1, text: B[j] }); j++; }
  }
  return out;
}

// ---------- steps ----------
function mainArg(call) {
  const a = call.arguments;
  if (typeof a !== "object" || a === null) return String(a);
  return a.command ?? a.file_path ?? a.path ?? a.pattern ?? JSON.stringify(a);
}

function callBody(call) {
  const a = call.arguments;
  if (typeof a !== "object" || a === null) return `<pre class="cmd">${esc(a)}</pre>`;
  const path = a.file_path ?? a.path;
  if (call.name === "Edit" && typeof a.old_string === "string" && typeof a.new_string === "string") {
    const extra = a.replace_all ? `<div class="muted" style="padding:4px 10px">replace_all: ${esc(a.replace_all)}</div>` : "";
    return `${extra}<div class="edit-diff">${sideBySide(lineDiff(a.old_string, a.new_string), langOf(path))}</div>`;
  }
  if (call.name === "Write" && typeof a.content === "string") {
    const lines = a.content.replace(/\n$/, "").split("\n").map((t, i) => ({ kind: "+", new: i + 1, text: t }));
    return `<div class="edit-diff">${sideBySide(lines, langOf(path))}</div>`;
  }
  if (call.name === "Bash" && typeof a.command === "string") {
    const rest = Object.entries(a).filter(([k]) => k !== "command");
    return `<pre class="cmd">$ ${highlight(a.command, "sh")}</pre>${rest.length ? argTable(rest) : ""}`;
  }
  const rest = Object.entries(a).filter(([k]) => !(k === "file_path" || (k === "pattern" && call.name === "Glob")));
  return rest.length ? argTable(rest) : "";
}
const argTable = (entries) => `<dl class="args">${entries.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(typeof v === "string" ? v : JSON.stringify(v))}</dd>`).join("")}</dl>`;

function usageLine(u) {
  if (!u) return "";
  const parts = [`model ${fmtSecs(u.model_sec)}`];
  if (u.tools_sec > 0.0005) parts.push(`tools ${fmtSecs(u.tools_sec)}`);
  if (u.prompt_tokens != null) parts.push(`${fmtNum(u.prompt_tokens)} prompt tokens`);
  if (u.completion_tokens != null) parts.push(`${fmtNum(u.completion_tokens)} generated`);
  return `<span class="usage">${parts.join(" · ")}</span>`;
}

function stepCard(s, isLast) {
  const calls = s.calls.map((c, i) => {
    const o = s.observations[i];
    const isErr = o && /^(\w+Error|Unknown tool|PermissionError)/.test(o.text);
    const obs = o ? `<div class="obs${isErr ? " error" : ""}"><div class="obs-label">result</div><pre>${esc(o.text)}</pre></div>` : "";
    return `<div class="call" data-tool="${esc(c.name)}"><div class="call-head"><span class="tool ${esc(c.name)}">${esc(c.name)}</span><span class="call-main">${esc(mainArg(c))}</span></div>${callBody(c)}${obs}</div>`;
  }).join("");
  const before = s.user_before
    ? /^(Your last reply|You replied without a tool call)/.test(s.user_before)
      ? `<div class="comment notice"><b>Notice to the model</b><div>${esc(s.user_before)}</div></div>`
      : `<div class="comment reviewer-comment"><b>Reviewer's comment</b><div>${esc(s.user_before)}</div></div>`
    : "";
  const thinking = s.reasoning ? `<details class="thinking"><summary>Thinking (${fmtNum(s.reasoning.length)} chars)</summary><pre>${esc(s.reasoning)}</pre></details>` : "";
  const said = s.content.trim() ? `<div class="said">${esc(s.content)}</div>` : "";
  const final = s.calls.length === 0;
  return `<div class="step${final ? " final" : ""}" data-step="${s.step}"><div class="num-bubble">${s.step + 1}</div>
    <div class="step-head"><b>Step ${s.step + 1}</b>${final && isLast ? `<span class="badge green">final answer</span>` : ""}${usageLine(s.usage)}</div>
    ${before}${thinking}${said}${calls}</div>`;
}

function stepsHtml(view) {
  const steps = view.steps || [];
  const inh = steps.filter((s) => s.inherited);
  const own = steps.filter((s) => !s.inherited);
  let html = "";
  if (inh.length) {
    html += `<details class="inherited"><summary>Steps 1–${inh.length} come from the run this one continues (<a href="${runHref(view.parent)}">${esc(view.parent)}</a>) — show them</summary>${inh.map((s) => stepCard(s, false)).join("")}</details>`;
  }
  html += own.map((s, i) => stepCard(s, i === own.length - 1)).join("");
  if (!steps.length && !view.live) html += `<div class="empty">No steps recorded.</div>`;
  return html;
}

// ---------- runs list ----------
let listFilter = "all";
// Each render counts itself; one whose data arrives after a newer render started draws nothing
// (otherwise a slow answer for the page just left would overwrite the page now shown).
let renderSeq = 0;
async function showList() {
  const seq = ++renderSeq;
  let data;
  try { data = await api("/api/runs"); } catch (e) { return seq === renderSeq && problemPage("The runs cannot be listed", e.message); }
  if (seq !== renderSeq) return;
  document.getElementById("root").textContent = data.root;
  document.getElementById("reviewer").textContent = `reviewing as ${data.reviewer}`;
  const runs = data.runs;
  const counts = { all: runs.length, pending: runs.filter((r) => r.kind === "solve" && !r.state && !r.live && !r.problem).length };
  const shown = runs.filter((r) => listFilter === "all" || (listFilter === "pending" ? r.kind === "solve" && !r.state && !r.live && !r.problem : r.kind === listFilter));
  const rows = shown.map((r) => {
    const problem = r.problem ? `<div class="badge red" title="${esc(r.problem)}">cannot be read</div>` : "";
    const parent = r.parent ? `<div class="muted" style="font-size:12px">↳ continues <a href="${runHref(r.parent)}" onclick="event.stopPropagation()">${esc(r.parent)}</a></div>` : "";
    const stats = r.stats ? `<div class="muted" style="font-size:12.5px">${esc(r.stats)}</div>` : "";
    const files = r.files.length ? `<div class="files" title="${esc(r.files.join("\n"))}">${esc(r.files.join(", "))}</div>` : r.kind === "solve" && r.exit_reason && !r.live ? `<span class="muted">none</span>` : "";
    return `<tr data-id="${esc(r.id)}" data-kind="${r.kind}">
      <td>${r.kind !== "solve" ? kindBadge(r.kind) : r.live ? exitBadge(null, true) : r.problem && !r.state ? `<span class="muted">—</span>` : stateBadge(r.state)}</td>
      <td><a class="run-title" href="${runHref(r.id)}">${esc(r.title)}</a> ${problem}<div class="run-id">${esc(r.id)}</div>${parent}${stats}</td>
      <td class="muted" style="font-size:12.5px;max-width:220px;overflow-wrap:anywhere">${esc(r.model || "")}</td>
      <td>${r.kind === "solve" ? exitBadge(r.exit_reason, r.live) : r.live ? exitBadge(null, true) : ""}</td>
      <td class="num">${r.steps ?? ""}</td>
      <td>${files}</td>
      <td class="num" title="${esc(when(r.started_unix))}">${esc(ago(r.started_unix))}<div class="muted" style="font-size:12px">${esc(fmtSecs(r.elapsed_sec))}</div></td></tr>`;
  }).join("");
  const filterBtn = (k, label) => `<button class="${listFilter === k ? "on" : ""}" data-filter="${k}">${label}</button>`;
  app.innerHTML = `<div class="list-head"><h1>Runs</h1><span class="muted">${counts.all} in all · ${counts.pending} to review</span><span class="spacer"></span>
    <div class="filters">${filterBtn("all", "All")}${filterBtn("pending", "To review")}${filterBtn("solve", "Solve")}${filterBtn("eval", "Eval")}${filterBtn("train", "Train")}</div></div>
    <div class="card">${runs.length === 0
      ? `<div class="empty"><p><b>No runs here yet.</b></p><p>Runs of <code>frognano solve</code> land in <code>frognano-runs/</code>; point <code>frognano review</code> at that folder, an eval output folder or a train run.</p></div>`
      : `<table class="runs" id="runs-table"><thead><tr><th style="width:110px">Review</th><th>Run</th><th>Model</th><th>Exit</th><th>Steps</th><th>Files changed</th><th>When</th></tr></thead><tbody>${rows || `<tr><td colspan="7" class="empty">Nothing matches this filter.</td></tr>`}</tbody></table>`}</div>`;
  app.querySelectorAll("tr[data-id]").forEach((tr) => tr.addEventListener("click", (e) => { if (e.target.tagName !== "A") location.hash = runHref(tr.dataset.id); }));
  app.querySelectorAll("[data-filter]").forEach((b) => b.addEventListener("click", () => { listFilter = b.dataset.filter; showList(); }));
  if (runs.some((r) => r.live)) {
    const t = setTimeout(() => { if (location.hash === "" || location.hash === "#/") showList(); }, 2500);
    stopLive = () => clearTimeout(t);
  }
}

// ---------- one solve run ----------
async function showRun(id) {
  const seq = ++renderSeq;
  let view;
  try { view = await api(`/api/run?id=${encodeURIComponent(id)}`); } catch (e) { return seq === renderSeq && problemPage("This run cannot be shown", e.message); }
  if (seq !== renderSeq) return;
  if (view.kind === "eval") return showEval(view);
  if (view.kind === "train") return showTrain(view);
  if (view.problem && !view.starting) {
    const files = view.files_present && view.files_present.length ? `<p class="muted">Files in <span class="mono">${esc(view.path)}</span>: <span class="mono">${esc(view.files_present.join(", "))}</span></p>` : `<p class="muted">The folder <span class="mono">${esc(view.path || id)}</span> is empty.</p>`;
    const summary = view.summary_md ? `<h2 style="margin-top:16px">summary.md</h2><pre class="issue">${esc(view.summary_md)}</pre>` : "";
    return problemPage("This run cannot be shown", view.problem, files + summary);
  }
  const facts = [
    ["Model", view.model], ["Repository", view.info && view.info.repo], ["Base commit", view.info && view.info.base_commit && view.info.base_commit.slice(0, 12)],
    ["Started", view.info && when(view.info.started_unix)], ["Context", view.context_tokens != null ? `${fmtNum(view.context_tokens)} tokens` : null],
    ["Folder", view.path],
  ].filter(([, v]) => v);
  const parent = view.parent ? `<div class="alert amber" style="margin-top:10px">Continues <a href="${runHref(view.parent)}">${esc(view.parent)}</a>${view.info && view.info.parent ? `, sent back with: “${esc(view.info.parent.comment)}”` : ""}</div>` : "";
  const children = (view.children || []).length ? `<div class="muted" style="margin-top:8px;font-size:13px">Sent back as ${view.children.map((c) => `<a href="${runHref(c)}">${esc(c)}</a>`).join(", ")}</div>` : "";
  const problems = (view.problems || []).map((p) => `<div class="alert amber">${esc(p)}</div>`).join("");
  const err = view.error ? `<div class="alert red">${esc(view.error)}</div>` : "";
  app.innerHTML = `<div class="crumbs"><a href="#/">← All runs</a> <span class="muted">/ ${esc(view.id)}</span></div>
  <div class="run-layout"><div>
    <div class="card section"><h1 id="run-title">${esc(view.title)}</h1>
      <div class="chips" id="run-chips"></div>${parent}${err}</div>
    <div class="card section"><h2>Issue</h2><pre class="issue" id="issue">${esc(view.issue)}</pre></div>
    <div class="card" style="margin-bottom:18px"><div class="section" style="margin:0;padding-bottom:8px"><h2 style="margin:0">Trajectory</h2></div>
      <div id="steps">${stepsHtml(view)}</div><div id="running"></div></div>
    <div class="card section" id="patch-section"><h2>Patch</h2><div id="patch"><p class="muted">Loading…</p></div></div>
  </div>
  <aside class="side"><div class="card section panel" id="decide"></div>
    <div class="card section"><h2>Run</h2><dl class="facts">${facts.map(([k, v]) => `<dt>${k}</dt><dd>${esc(v)}</dd>`).join("")}</dl>${children}${problems}</div>
  </aside></div>`;
  renderChips(view);
  renderDecide(view);
  loadPatch(view, 1);
  if (view.live) followLive(view);
}

function renderChips(view) {
  const steps = (view.steps || []).length;
  const tokens = (view.steps || []).reduce((a, s) => a + ((s.usage && s.usage.completion_tokens) || 0), 0);
  document.getElementById("run-chips").innerHTML = [
    exitBadge(view.exit_reason, view.live), stateBadge(view.state),
    `<span class="badge">${view.n_steps ?? steps} steps</span>`,
    view.elapsed_sec ? `<span class="badge">${fmtSecs(view.elapsed_sec)}</span>` : "",
    tokens ? `<span class="badge">${fmtNum(tokens)} tokens generated</span>` : "",
  ].join("");
}

function renderDecide(view) {
  const box = document.getElementById("decide");
  const history = (view.decisions || []).slice().reverse().map((d) => {
    const label = { apply: "Applied", apply_refused: "Apply refused", reject: "Rejected", send_back: "Sent back" }[d.action] || d.action;
    return `<li data-action="${esc(d.action)}"><b>${label}</b> <span class="muted">by ${esc(d.by)}, ${esc(ago(d.at_unix))}</span>${d.note ? `<div class="note">${esc(d.note)}</div>` : ""}${d.outcome && d.action !== "reject" ? `<div class="muted note">${esc(d.outcome)}</div>` : ""}</li>`;
  }).join("");
  const applied = view.state && view.state.action === "apply";
  const busy = view.live;
  const canApply = view.has_patch && view.info && !busy && !applied;
  const canSend = view.info && !busy;
  box.innerHTML = `<h2>Decision</h2>
    ${busy ? `<div class="alert amber">The run is still going; decide once it has finished.</div>` : ""}
    <div class="act"><button class="btn primary wide" id="apply-btn" ${canApply ? "" : "disabled"}>${applied ? "Applied ✓" : "Apply patch to the repository"}</button>
      <div class="muted" style="font-size:12px;margin-top:4px">${view.info ? `Runs <code>git apply --check</code> in ${esc(view.info.repo)} first.` : ""}${view.has_patch || busy ? "" : " The run changed nothing."}</div></div>
    <div class="act"><label for="sendback-comment">Send back: the comment becomes the agent's next message, and it goes on where it stopped</label>
      <textarea id="sendback-comment" placeholder="e.g. Also handle an empty list, and add a test for it." ${canSend ? "" : "disabled"}></textarea>
      <div class="row"><button class="btn" id="sendback-btn" ${canSend ? "" : "disabled"}>Send back to the agent</button></div></div>
    <div class="act"><label for="reject-note">Reject, with a note</label>
      <textarea id="reject-note" placeholder="Why this patch should not be merged" ${busy ? "disabled" : ""}></textarea>
      <div class="row"><button class="btn danger" id="reject-btn" ${busy ? "disabled" : ""}>Reject</button></div></div>
    <div id="decision-msg"></div>
    ${history ? `<h2 style="margin-top:16px">History</h2><ul class="history" id="history">${history}</ul>` : ""}`;
  const msg = (cls, text) => { const box = document.getElementById("decision-msg"); if (box) box.innerHTML = `<div class="alert ${cls}" id="decision-${cls === "red" ? "error" : "ok"}">${esc(text)}</div>`; };
  const act = async (btn, path, body, done) => {
    btn.disabled = true;
    try { const r = await api(path, body); await done(r); } catch (e) { msg("red", e.message); btn.disabled = false; }
  };
  document.getElementById("apply-btn").onclick = (e) => act(e.target, "/api/apply", { id: view.id }, async (r) => { toast(r.decision.outcome); await showRun(view.id); msg("green", `Applied: ${r.decision.outcome}`); });
  document.getElementById("reject-btn").onclick = (e) => act(e.target, "/api/reject", { id: view.id, note: document.getElementById("reject-note").value }, async () => { toast("Rejected"); await showRun(view.id); });
  document.getElementById("sendback-btn").onclick = (e) => act(e.target, "/api/send-back", { id: view.id, comment: document.getElementById("sendback-comment").value }, async (r) => { toast("Sent back: the agent goes on in a new run"); location.hash = runHref(r.new_run); });
}

async function loadPatch(view, page) {
  const box = document.getElementById("patch");
  if (!view.has_patch) { box.innerHTML = `<p class="muted">${view.live ? "The patch is taken when the run ends." : "The run changed nothing (patch.diff is empty)."}</p>`; return; }
  let p;
  try { p = await api(`/api/patch?id=${encodeURIComponent(view.id)}&page=${page}`); } catch (e) { box.innerHTML = `<div class="alert red">${esc(e.message)}</div>`; return; }
  const pager = p.pages > 1
    ? `<div class="pager" id="pager"><button class="btn" data-page="${p.page - 1}" ${p.page <= 1 ? "disabled" : ""}>← Previous</button><span>page ${p.page} of ${p.pages} (${fmtNum(p.total_lines)} diff lines)</span><button class="btn" data-page="${p.page + 1}" ${p.page >= p.pages ? "disabled" : ""}>Next →</button></div>`
    : "";
  box.innerHTML = `<div class="diff-toolbar"><b>${p.total_files} file${p.total_files === 1 ? "" : "s"} changed</b><span class="plus">+${fmtNum(p.additions)}</span><span class="minus">−${fmtNum(p.deletions)}</span></div>${pager}${p.files.map(fileCard).join("")}${pager}`;
  box.querySelectorAll("[data-page]").forEach((b) => b.addEventListener("click", () => { loadPatch(view, Number(b.dataset.page)); document.getElementById("patch-section").scrollIntoView(); }));
}

// Server-sent events: new steps as the run's checkpoints are written, then `done`.
function followLive(view) {
  const running = document.getElementById("running");
  running.innerHTML = `<div class="running-note live"><span class="dot"></span>The agent is working; new steps appear here as they happen.</div>`;
  const src = new EventSource(`/api/events?id=${encodeURIComponent(view.id)}&page=${(view.steps || []).length}`);
  stopLive = () => src.close();
  const stepsBox = document.getElementById("steps");
  src.addEventListener("steps", (e) => {
    const d = JSON.parse(e.data);
    // The first steps of a run that has just started (and those it inherits from the run it
    // continues) need the whole page: its title, issue and parent are known only now.
    if (d.steps.length && (!(view.steps || []).length || d.steps.some((s) => s.inherited))) {
      src.close();
      showRun(view.id);
      return;
    }
    view.steps = (view.steps || []).concat(d.steps);
    view.n_steps = d.n_steps;
    if (d.steps.length) {
      stepsBox.querySelectorAll(".empty").forEach((n) => n.remove());
      stepsBox.insertAdjacentHTML("beforeend", d.steps.map((s) => stepCard(s, false)).join(""));
    }
    renderChips(view);
  });
  src.addEventListener("done", () => { src.close(); showRun(view.id); });
  src.addEventListener("failed", (e) => { src.close(); running.innerHTML = `<div class="alert red" style="margin:12px">${esc(JSON.parse(e.data).error)}</div>`; });
}

// ---------- eval ----------
function showEval(view) {
  const inst = view.instances || [];
  const ids = new Set(inst.map((i) => i.instance_id));
  const resolvedIds = new Set(inst.filter((i) => i.resolved).map((i) => i.instance_id));
  const errors = inst.filter((i) => String(i.status || "").startsWith("error")).length;
  const statusBadge = (i) => i.resolved ? `<span class="badge green">resolved</span>` : String(i.status || "").startsWith("error") ? `<span class="badge amber" title="${esc(i.error || "")}">error</span>` : `<span class="badge red">${esc(i.status || "failed")}</span>`;
  const report = view.report ? `<div class="card section"><h2>Run report</h2><dl class="facts">${Object.entries(view.report).filter(([, v]) => typeof v !== "object").map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("")}</dl></div>` : "";
  app.innerHTML = `<div class="crumbs"><a href="#/">← All runs</a> <span class="muted">/ ${esc(view.id)}</span></div>
    <h1>${esc(view.title)}</h1><p class="muted mono">${esc(view.path)}</p>
    <div class="stat-row"><div class="card stat"><div class="big">${resolvedIds.size} / ${ids.size}</div><div class="lbl">instances resolved</div></div>
      <div class="card stat"><div class="big">${ids.size ? Math.round((100 * resolvedIds.size) / ids.size) : 0}%</div><div class="lbl">resolve rate</div></div>
      <div class="card stat"><div class="big">${inst.length}</div><div class="lbl">attempts</div></div>
      <div class="card stat"><div class="big">${errors}</div><div class="lbl">errors</div></div></div>
    ${(view.problems || []).map((p) => `<div class="alert amber">${esc(p)}</div>`).join("")}
    <div class="card" style="margin-bottom:18px"><table class="runs" id="eval-table"><thead><tr><th>Status</th><th>Instance</th><th>Attempt</th><th>Time</th></tr></thead><tbody>
    ${inst.map((i, n) => `<tr data-n="${n}" data-instance="${esc(i.instance_id)}"><td>${statusBadge(i)}</td><td class="mono">${esc(i.instance_id)}</td><td class="num">${i.attempt ?? 0}</td><td class="num">${fmtSecs(i.seconds)}</td></tr>`).join("")}
    </tbody></table></div>${report}`;
  app.querySelectorAll("#eval-table tr[data-n]").forEach((tr) => tr.addEventListener("click", async () => {
    const next = tr.nextElementSibling;
    if (next && next.classList.contains("inst-detail")) { next.remove(); return; }
    const i = inst[Number(tr.dataset.n)];
    const row = document.createElement("tr");
    row.className = "inst-detail";
    row.innerHTML = `<td colspan="4"><p class="muted">Loading…</p></td>`;
    tr.after(row);
    try {
      const d = await api(`/api/eval-instance?id=${encodeURIComponent(view.id)}&instance=${encodeURIComponent(i.instance_id)}&attempt=${i.attempt ?? 0}`);
      const rep = d.report && d.report[i.instance_id];
      const tests = rep && rep.tests_status ? Object.entries(rep.tests_status).map(([k, v]) => `<div><b>${esc(k)}</b>: <span class="plus">${(v.success || []).length} pass</span>, <span class="minus">${(v.failure || []).length} fail</span>${(v.failure || []).length ? `<div class="mono muted">${esc(v.failure.join("\n"))}</div>` : ""}</div>`).join("") : "";
      row.innerHTML = `<td colspan="4">${i.error ? `<div class="alert amber">${esc(i.error)}</div>` : ""}${tests ? `<h2>Tests</h2>${tests}` : ""}
        ${d.patch_files && d.patch_files.files.length ? `<h2 style="margin-top:12px">Patch</h2>${d.patch_files.files.map(fileCard).join("")}` : ""}
        ${d.test_output != null ? `<h2 style="margin-top:12px">Test log</h2><pre class="test-log">${esc(d.test_output)}</pre>` : `<p class="muted">No test log${d.logs_dir ? " in " + esc(d.logs_dir) : ""}.</p>`}
        ${d.report ? `<h2 style="margin-top:12px">report.json</h2><pre>${esc(JSON.stringify(d.report, null, 2))}</pre>` : ""}</td>`;
    } catch (e) { row.innerHTML = `<td colspan="4"><div class="alert red">${esc(e.message)}</div></td>`; }
  }));
}

// ---------- train ----------
const SERIES = [
  ["reward_mean", "Reward", "#22a06b"], ["solve_rate", "Solve rate", "#2563eb"], ["loss", "Loss", "#c2410c"],
  ["band_mass", "Band mass (tasks with 0.1 < p̂ < 0.9)", "#7c3aed"], ["usable_fraction", "Usable groups", "#0891b2"], ["grad_norm", "Gradient norm", "#b45309"],
];
function chart(rows, key, label, color) {
  const pts = rows.map((r) => [Number(r.step), Number(r[key])]).filter(([x, y]) => isFinite(x) && isFinite(y));
  if (!pts.length) return "";
  const W = 400, H = 180, L = 42, R = 10, T = 10, B = 22;
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  if (y0 > 0 && y0 < (y1 - y0)) y0 = 0;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R), Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const path = pts.map(([x, y], i) => `${i ? "L" : "M"}${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join("");
  const area = `${path}L${X(pts[pts.length - 1][0]).toFixed(1)},${Y(y0)}L${X(pts[0][0]).toFixed(1)},${Y(y0)}Z`;
  const ticks = [y0, (y0 + y1) / 2, y1].map((v) => `<line class="axis" x1="${L}" x2="${W - R}" y1="${Y(v)}" y2="${Y(v)}"/><text class="tick" x="${L - 6}" y="${Y(v) + 3}" text-anchor="end">${+v.toPrecision(3)}</text>`).join("");
  const xt = [x0, x1].map((v) => `<text class="tick" x="${X(v)}" y="${H - 6}" text-anchor="middle">${v}</text>`).join("");
  const dots = pts.length <= 60 ? pts.map(([x, y]) => `<circle cx="${X(x).toFixed(1)}" cy="${Y(y).toFixed(1)}" r="2.2" fill="${color}"/>`).join("") : "";
  const last = pts[pts.length - 1][1];
  return `<div class="card chart" data-metric="${key}"><h3>${esc(label)}</h3><div class="last">step ${pts[pts.length - 1][0]}: ${+last.toPrecision(4)}</div>
    <svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none">${ticks}${xt}<path class="area" d="${area}" fill="${color}"/><path class="series" d="${path}" stroke="${color}"/>${dots}</svg></div>`;
}
function showTrain(view) {
  const rows = view.metrics || [];
  const last = rows[rows.length - 1] || {};
  const live = Date.now() / 1000 - (view.modified_unix || 0) < 120;
  app.innerHTML = `<div class="crumbs"><a href="#/">← All runs</a> <span class="muted">/ ${esc(view.id)}</span></div>
    <h1>${esc(view.title)} ${live ? `<span class="badge blue live"><span class="dot"></span>training</span>` : ""}</h1><p class="muted mono">${esc(view.path)}</p>
    <div class="stat-row"><div class="card stat"><div class="big">${rows.length}</div><div class="lbl">steps</div></div>
      <div class="card stat"><div class="big">${last.reward_mean != null ? (+last.reward_mean).toFixed(3) : "–"}</div><div class="lbl">last reward</div></div>
      <div class="card stat"><div class="big">${last.solve_rate != null ? (100 * last.solve_rate).toFixed(1) + "%" : "–"}</div><div class="lbl">last solve rate</div></div>
      <div class="card stat"><div class="big">${last.pool_size ?? "–"}</div><div class="lbl">tasks in the pool</div></div></div>
    ${(view.problems || []).map((p) => `<div class="alert amber">${esc(p)}</div>`).join("")}
    ${rows.length ? `<div class="charts" id="charts">${SERIES.map(([k, l, c]) => chart(rows, k, l, c)).join("")}</div>` : `<div class="card empty">No metrics yet: metrics.jsonl gets a line after each training step.</div>`}`;
  if (live) {
    const t = setTimeout(() => { if (location.hash === runHref(view.id)) showRun(view.id); }, 3000);
    stopLive = () => clearTimeout(t);
  }
}

// ---------- routing ----------
function route() {
  stopLive();
  stopLive = () => {};
  const h = location.hash || "#/";
  const m = h.match(/^#\/run\/(.+)$/);
  window.scrollTo(0, 0);
  if (m) showRun(decodeURIComponent(m[1]));
  else showList();
}
window.addEventListener("hashchange", route);
route();
