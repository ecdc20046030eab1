// The skillbox console (SPEC §10): a single page over the HTTP API, with hash routes.
// Everything from the server is shown through textContent or escaped HTML: skill content is
// untrusted input.

const $ = (sel, root = document) => root.querySelector(sel);
const main = () => $("#main");

// ---------- session (the tab's session storage only) ----------
const session = {
  get token() { return sessionStorage.getItem("skillbox.token"); },
  get workspace() { return sessionStorage.getItem("skillbox.workspace"); },
  set(token, workspace) {
    sessionStorage.setItem("skillbox.token", token);
    if (workspace) sessionStorage.setItem("skillbox.workspace", workspace);
  },
  setWorkspace(ws) { sessionStorage.setItem("skillbox.workspace", ws); },
  clear() { sessionStorage.removeItem("skillbox.token"); sessionStorage.removeItem("skillbox.workspace"); },
};
let who = null; // {role, workspace, box_available}

const ROLES = ["reader", "author", "runner", "admin"];
const isServerAdmin = () => who && who.role === "admin" && who.workspace == null;
function can(role) {
  if (!who) return false;
  if (role === "server-admin") return isServerAdmin();
  return ROLES.indexOf(who.role) >= ROLES.indexOf(role);
}

// ---------- API ----------
class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "http_" + status;
    this.body = e;
  }
}

async function api(method, path, body, opts = {}) {
  const headers = { Authorization: `Bearer ${opts.token || session.token}` };
  let payload;
  if (body !== undefined) { headers["Content-Type"] = "application/json"; payload = JSON.stringify(body); }
  const r = await fetch(path, { method, headers, body: payload, signal: opts.signal });
  if (opts.raw && r.ok) return r;
  // A JSON answer straight from the bytes (no intermediate string: the skills list of a big
  // workspace is hundreds of KiB).
  if (r.ok && (r.headers.get("content-type") || "").startsWith("application/json")) return r.json();
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = null; }
  if (!r.ok) {
    if (r.status === 401 && !opts.token) { signOut("Your token was refused (unauthorized): sign in again."); }
    throw new ApiError(r.status, json);
  }
  return json;
}
const ws = (path) => `/v1/workspaces/${encodeURIComponent(session.workspace)}/${path}`;
const enc = (s) => encodeURIComponent(s);
const encPath = (p) => p.split("/").map(encodeURIComponent).join("/");

// ---------- rendering helpers ----------
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
function render(...nodes) { const m = main(); m.replaceChildren(...nodes); }
function flash(message, kind = "success") {
  const f = $("#flash");
  f.replaceChildren(h("div", { class: kind }, message));
  clearTimeout(flash.t);
  flash.t = setTimeout(() => f.replaceChildren(), 6000);
}
function errorBox(e) {
  const msg = e instanceof ApiError ? `${e.code}: ${e.message}` : String(e.message || e);
  return h("div", { class: "error", role: "alert" }, msg);
}
function when(ms) {
  if (!ms) return "—";
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}
function ago(ms) {
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}
function size(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1048576).toFixed(1)} MiB`;
}
const shortDigest = (d) => (d || "").replace(/^sha256:/, "").slice(0, 12);
function stateBadge(r, current) {
  const out = [h("span", { class: `badge ${r.state}` }, r.state)];
  if (r.revision === current) out.unshift(h("span", { class: "badge current" }, "current"), " ");
  return out;
}

// ---------- sign-in ----------
function signOut(message) {
  session.clear();
  who = null;
  location.hash = "#/signin";
  if (message) setTimeout(() => flash(message, "error"), 0);
}

async function pageSignin() {
  const err = h("div");
  const token = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: true });
  const form = h("form", { class: "card signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("p", { class: "muted" }, "Paste a skillbox token. It is kept in this tab only (session storage)."),
    h("div", { class: "field" }, h("label", { for: "token" }, "Token"), token),
    err,
    h("button", { type: "submit", class: "primary" }, "Sign in"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    err.replaceChildren();
    const t = token.value.trim();
    if (!t) return;
    try {
      const me = await api("GET", "/v1/whoami", undefined, { token: t });
      if (me.role === "node") throw new ApiError(403, { error: { code: "forbidden", message: "a node token cannot use the console" } });
      session.set(t, me.workspace);
      who = me;
      location.hash = "#/";
    } catch (e) {
      const message = e.status === 401
        ? "This token was refused (unauthorized). Check that you copied it whole: tokens are shown once, when they are created."
        : (e instanceof ApiError ? `${e.code}: ${e.message}` : `The server cannot be reached: ${e.message}`);
      err.replaceChildren(h("div", { class: "error", role: "alert", id: "signin-error" }, message));
    }
  });
  render(form);
  token.focus();
}

// ---------- header ----------
async function setupHeader() {
  $("#nav").hidden = !who;
  $("#who").hidden = !who;
  if (!who) return;
  for (const a of document.querySelectorAll("#nav a[data-needs]")) a.hidden = !can(a.dataset.needs);
  $("#who-text").textContent = `${who.role}${who.workspace ? " · " + who.workspace : " (server)"}`;
  const picker = $("#workspace-picker");
  if (isServerAdmin()) {
    picker.hidden = false;
    if (!picker.dataset.loaded) {
      picker.dataset.loaded = "1";
      const filled = fillPicker(picker);
      // The page waits for the list only when it must pick the workspace from it.
      if (!session.workspace) await filled;
    }
  } else {
    picker.hidden = true;
  }
}

async function fillPicker(picker) {
  // The server admin's workspaces, and switching between them.
  let names = [];
  try { names = (await api("GET", "/v1/admin/workspaces")).workspaces; } catch { names = []; }
  if (!session.workspace) session.setWorkspace(names[0] || "default");
  if (!names.includes(session.workspace)) names.unshift(session.workspace);
  picker.replaceChildren(...names.map((n) => h("option", { value: n, selected: n === session.workspace }, n)),
    h("option", { value: "__other" }, "Other workspace…"));
  picker.addEventListener("change", () => {
    let v = picker.value;
    if (v === "__other") {
      v = (prompt("Workspace name") || "").trim();
      if (!v) { picker.value = session.workspace; return; }
      picker.insertBefore(h("option", { value: v }, v), picker.lastChild);
      picker.value = v;
    }
    session.setWorkspace(v);
    route();
  });
}

// ---------- skills ----------
// The rows of a first screenful: drawn and painted first; the rest follow in the next task,
// so a workspace of thousands of skills shows its list as fast as one of fifty.
const FIRST_ROWS = 60;
const skillRow = (s) => `<tr><td><a href="#/skills/${esc(enc(s.name))}">${esc(s.name)}</a></td>` +
  `<td class="opt">${esc(s.description || "")}</td><td class="num">r${s.current_revision}</td>` +
  `<td class="opt" title="${esc(when(s.updated_at))}">${esc(ago(s.updated_at))}</td></tr>`;

async function pageSkills(params, early) {
  const q = params.get("q") || "";
  const search = h("input", { type: "search", id: "search", value: q, placeholder: "Search by name or description", "aria-label": "Search skills" });
  const count = h("span", { class: "muted", id: "skill-count" });
  const body = h("tbody");
  render(
    h("div", { class: "row" }, h("h1", { class: "grow" }, "Skills"),
      can("author") ? h("a", { class: "button", href: "#/publish" }, "Publish a skill") : null),
    h("div", { class: "row" }, search, count),
    h("table", { id: "skills" },
      h("colgroup", {}, h("col", { class: "name" }), h("col", { class: "opt" }), h("col", { class: "num" }), h("col", { class: "opt when" })),
      h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", { class: "opt" }, "Description"), h("th", { class: "num" }, "Current"), h("th", { class: "opt" }, "Last change"))),
      body));
  let skills;
  try { skills = (await (early || api("GET", ws("skills")))).skills; } catch (e) { main().append(errorBox(e)); return; }
  // (The server lists them by name.)
  let drawn = 0; // the latest draw: a later one (a keystroke) drops an earlier one's rest
  const draw = (mark) => {
    const n = ++drawn;
    const term = search.value.trim().toLowerCase();
    const shown = term ? skills.filter((s) => s.name.toLowerCase().includes(term) || (s.description || "").toLowerCase().includes(term)) : skills;
    // One string, one parse per part.
    body.innerHTML = shown.slice(0, FIRST_ROWS).map(skillRow).join("") ||
      `<tr><td colspan="4" class="muted">${skills.length ? "No skill matches." : "No skills yet."}</td></tr>`;
    count.textContent = `${shown.length} of ${skills.length}`;
    requestAnimationFrame(() => {
      setTimeout(() => {
        if (n !== drawn) return;
        if (mark) mark("skills-painted");
        if (shown.length > FIRST_ROWS) body.insertAdjacentHTML("beforeend", shown.slice(FIRST_ROWS).map(skillRow).join(""));
        if (mark) requestAnimationFrame(() => setTimeout(() => mark("skills-complete"), 0));
      }, 0);
    });
  };
  // For scripts/bench-console: the first rows are in the document, then painted (the frame
  // after), then every row is painted.
  draw((mark) => performance.mark(mark));
  performance.mark("skills-listed");
  search.addEventListener("input", () => {
    draw();
    history.replaceState(null, "", search.value ? `#/?q=${enc(search.value)}` : "#/");
  });
}

async function pageSkill(name) {
  render(h("p", { class: "muted" }, "Loading…"));
  let detail, revisions;
  try {
    [detail, revisions] = await Promise.all([
      api("GET", ws(`skills/${enc(name)}`)),
      api("GET", ws(`skills/${enc(name)}/revisions`)).then((r) => r.revisions),
    ]);
  } catch (e) { render(h("h1", {}, name), errorBox(e)); return; }
  const current = detail.current_revision;
  const status = h("div", { id: "skill-status" });
  const rows = revisions.slice().sort((a, b) => b.revision - a.revision).map((r) => {
    const actions = [];
    if (can("author") && r.revision !== current && r.state === "available") {
      actions.push(h("button", {
        type: "button", "data-rollback": r.revision,
        onclick: () => rollback(name, r.revision, current, status),
      }, r.revision < current ? `Roll back to r${r.revision}` : `Make r${r.revision} current`));
    }
    if (can("admin") && r.state === "available") {
      actions.push(" ", h("button", { type: "button", class: "danger", onclick: () => revoke(name, r.revision, status) }, "Revoke"));
    }
    return h("tr", { "data-revision": r.revision },
      h("td", {}, h("a", { href: `#/skills/${enc(name)}/r/${r.revision}` }, `r${r.revision}`)),
      h("td", {}, stateBadge(r, current), r.state_reason ? h("div", { class: "muted" }, r.state_reason) : null),
      h("td", { class: "opt" }, r.publisher),
      h("td", { class: "opt", title: when(r.published_at) }, ago(r.published_at)),
      h("td", { class: "opt mono", title: r.digest }, shortDigest(r.digest)),
      h("td", { class: "num opt" }, size(r.size)),
      h("td", {}, actions));
  });
  const fm = detail.frontmatter || {};
  render(
    h("p", {}, h("a", { href: "#/" }, "Skills"), " / ", name),
    h("div", { class: "row" },
      h("h1", { class: "grow" }, name),
      h("span", {}, "Current: ", h("strong", { id: "current-revision" }, `r${current}`)),
      can("admin") ? h("button", { type: "button", class: "danger", onclick: () => deleteSkill(name) }, "Delete skill") : null),
    h("p", {}, detail.description || fm.description || ""),
    status,
    h("h2", {}, "Revisions"),
    h("table", { id: "revisions" },
      h("thead", {}, h("tr", {}, h("th", {}, "Revision"), h("th", {}, "State"), h("th", { class: "opt" }, "Publisher"),
        h("th", { class: "opt" }, "Published"), h("th", { class: "opt" }, "Digest"), h("th", { class: "num opt" }, "Size"), h("th", {}, "Actions"))),
      h("tbody", {}, rows)));
}

async function rollback(name, revision, base, status) {
  status.replaceChildren();
  try {
    const moved = await api("PUT", ws(`skills/${enc(name)}/current`), { revision, base_revision: base });
    await pageSkill(name);
    flash(`${name}: current is now r${moved.current_revision}.`);
  } catch (e) {
    if (e.code === "revision_conflict") {
      status.replaceChildren(h("div", { class: "error", role: "alert", id: "conflict" },
        `Conflict: the current revision moved to r${e.body.current_revision} since this page was loaded (it showed r${base}). Nothing was changed. `,
        h("button", { type: "button", onclick: () => pageSkill(name) }, "Reload")));
    } else {
      status.replaceChildren(errorBox(e));
    }
  }
}

async function revoke(name, revision, status) {
  const reason = prompt(`Revoke ${name} r${revision}? Runs pinned to it stop reading and executing it at once. Reason:`);
  if (!reason) return;
  try {
    await api("POST", ws(`skills/${enc(name)}/revisions/${revision}/revoke`), { reason });
    await pageSkill(name);
    flash(`${name} r${revision} revoked.`);
  } catch (e) { status.replaceChildren(errorBox(e)); }
}

async function deleteSkill(name) {
  if (!confirm(`Delete ${name}? New runs can no longer activate it; runs that pinned it keep working.`)) return;
  try {
    await api("DELETE", ws(`skills/${enc(name)}`));
    location.hash = "#/";
    flash(`${name} deleted.`);
  } catch (e) { main().append(errorBox(e)); }
}

// ---------- revision ----------
async function fetchFile(name, rev, path) {
  const r = await api("GET", ws(`skills/${enc(name)}/revisions/${rev}/files/${encPath(path)}`), undefined, { raw: true });
  return new Uint8Array(await r.arrayBuffer());
}
function asText(bytes) {
  if (bytes.includes(0)) return null;
  try { return new TextDecoder("utf-8", { fatal: true }).decode(bytes); } catch { return null; }
}

function fileTree(manifest, onPick, selected) {
  const root = {};
  for (const f of manifest) {
    const parts = f.path.split("/");
    let node = root;
    parts.slice(0, -1).forEach((p) => { node[p + "/"] = node[p + "/"] || {}; node = node[p + "/"]; });
    node[parts[parts.length - 1]] = f;
  }
  const build = (node) => h("ul", {}, Object.keys(node).sort((a, b) => (b.endsWith("/") - a.endsWith("/")) || a.localeCompare(b)).map((k) => {
    const v = node[k];
    if (k.endsWith("/")) return h("li", {}, h("details", { open: true }, h("summary", {}, k), build(v)));
    return h("li", {}, h("a", {
      href: "#", "data-path": v.path, "aria-current": v.path === selected ? "true" : null,
      onclick: (ev) => { ev.preventDefault(); onPick(v.path); },
    }, k), v.executable ? h("span", { class: "muted", title: "executable" }, " *") : null);
  }));
  return h("nav", { class: "tree", "aria-label": "Files" }, build(root));
}

function splitFrontmatter(text) {
  const m = text.match(/^---\r?\n([\s\S]*?)\r?\n---\r?\n?([\s\S]*)$/);
  return m ? m[2] : text;
}

// A small Markdown renderer: headings, paragraphs, lists, quotes, fenced code, inline code,
// emphasis, links (http/https/relative only). Input is escaped first.
function markdown(src) {
  const inline = (s) => esc(s)
    .replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*]+)\*/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\(([^)\s]+)\)/g, (m, t, u) => /^(https?:\/\/|[\w./-]+$)/.test(u) && !/^javascript:/i.test(u)
      ? `<a href="${u}" rel="noopener noreferrer" target="_blank">${t}</a>` : m);
  const out = [];
  const lines = src.split(/\r?\n/);
  let i = 0, para = [], list = null;
  const flushPara = () => { if (para.length) out.push(`<p>${inline(para.join(" "))}</p>`); para = []; };
  const flushList = () => { if (list) out.push(`<${list.tag}>${list.items.map((x) => `<li>${inline(x)}</li>`).join("")}</${list.tag}>`); list = null; };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^```(.*)$/);
    if (fence) {
      flushPara(); flushList();
      const code = [];
      i++;
      while (i < lines.length && !lines[i].startsWith("```")) code.push(lines[i++]);
      out.push(`<pre><code>${esc(code.join("\n"))}</code></pre>`);
      i++;
      continue;
    }
    let m;
    if ((m = line.match(/^(#{1,6})\s+(.*)$/))) { flushPara(); flushList(); const n = Math.min(m[1].length + 1, 6); out.push(`<h${n}>${inline(m[2])}</h${n}>`); }
    else if ((m = line.match(/^\s*[-*+]\s+(.*)$/))) { flushPara(); if (!list || list.tag !== "ul") { flushList(); list = { tag: "ul", items: [] }; } list.items.push(m[1]); }
    else if ((m = line.match(/^\s*\d+[.)]\s+(.*)$/))) { flushPara(); if (!list || list.tag !== "ol") { flushList(); list = { tag: "ol", items: [] }; } list.items.push(m[1]); }
    else if ((m = line.match(/^>\s?(.*)$/))) { flushPara(); flushList(); out.push(`<blockquote>${inline(m[1])}</blockquote>`); }
    else if (!line.trim()) { flushPara(); flushList(); }
    else { flushList(); para.push(line.trim()); }
    i++;
  }
  flushPara(); flushList();
  return out.join("\n");
}

function frontmatterTable(fm) {
  const rows = Object.entries(fm || {}).map(([k, v]) => h("tr", {}, h("th", { scope: "row" }, k),
    h("td", {}, typeof v === "string" ? v : h("code", {}, JSON.stringify(v)))));
  return h("table", { class: "frontmatter", "aria-label": "Frontmatter" }, h("tbody", {}, rows));
}

async function pageRevision(name, rev, params) {
  render(h("p", { class: "muted" }, "Loading…"));
  let detail, revisions, skill;
  try {
    [detail, revisions, skill] = await Promise.all([
      api("GET", ws(`skills/${enc(name)}/revisions/${rev}`)),
      api("GET", ws(`skills/${enc(name)}/revisions`)).then((r) => r.revisions),
      api("GET", ws(`skills/${enc(name)}`)).catch(() => ({ current_revision: null })),
    ]);
  } catch (e) { render(h("h1", {}, `${name} r${rev}`), errorBox(e)); return; }
  const file = params.get("file") || (detail.manifest.some((f) => f.path === "SKILL.md") ? "SKILL.md" : (detail.manifest[0] || {}).path);
  const view = h("section", { id: "file-view", "aria-live": "polite" });
  const pick = (p) => { history.replaceState(null, "", `#/skills/${enc(name)}/r/${detail.revision}?file=${enc(p)}`); showFile(p); };
  const treeHolder = h("div");
  const others = revisions.filter((r) => r.revision !== detail.revision).sort((a, b) => b.revision - a.revision);
  const against = h("select", { id: "diff-against", "aria-label": "Compare with revision" },
    others.map((r) => h("option", { value: r.revision }, `r${r.revision}`)));
  async function showFile(path) {
    treeHolder.replaceChildren(fileTree(detail.manifest, pick, path));
    const entry = detail.manifest.find((f) => f.path === path);
    if (!entry) { view.replaceChildren(h("p", { class: "muted" }, "No file.")); return; }
    view.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    try {
      const bytes = await fetchFile(name, detail.revision, path);
      const text = asText(bytes);
      const head = h("div", { class: "row" }, h("h2", { class: "grow mono" }, path),
        h("span", { class: "muted" }, `${size(entry.size)}${entry.executable ? " · executable" : ""}`),
        h("button", { type: "button", onclick: () => download(bytes, path) }, "Download"));
      if (text === null) {
        view.replaceChildren(head, h("p", { id: "binary-file" }, `Binary file, ${size(entry.size)} (${entry.size} bytes). Download it to look inside.`));
      } else if (path === "SKILL.md") {
        const body = h("div", { class: "markdown card", id: "skill-md" });
        body.innerHTML = markdown(splitFrontmatter(text));
        const raw = h("details", {}, h("summary", {}, "Source"), h("pre", {}, h("code", {}, text)));
        view.replaceChildren(head, h("h3", {}, "Frontmatter"), frontmatterTable(detail.frontmatter), body, raw);
      } else {
        view.replaceChildren(head, h("pre", { id: "file-text" }, h("code", {}, text)));
      }
    } catch (e) { view.replaceChildren(errorBox(e)); }
  }
  render(
    h("p", {}, h("a", { href: "#/" }, "Skills"), " / ", h("a", { href: `#/skills/${enc(name)}` }, name), " / ", `r${detail.revision}`),
    h("div", { class: "row" },
      h("h1", { class: "grow" }, `${name} r${detail.revision}`),
      h("span", {}, stateBadge(detail, skill.current_revision)),
      others.length ? h("span", { class: "row" }, h("label", { for: "diff-against" }, "Diff against"), against,
        h("button", { type: "button", id: "diff-go", onclick: () => { location.hash = `#/skills/${enc(name)}/diff/${against.value}/${detail.revision}`; } }, "Compare")) : null),
    h("p", { class: "muted mono", title: detail.digest }, `${detail.digest} · ${detail.manifest.length} files · ${size(detail.size)} · by ${detail.publisher} · ${when(detail.published_at)}`),
    h("div", { class: "split" }, treeHolder, view));
  if (file) showFile(file); else treeHolder.replaceChildren(fileTree(detail.manifest, pick, null));
}

function download(bytes, path) {
  const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
  const a = h("a", { href: url, download: path.split("/").pop() });
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// ---------- diff ----------
// Line diff by longest common subsequence (Myers' greedy algorithm), as a list of
// {op: " " | "-" | "+", a, b, text}.
function diffLines(a, b) {
  const n = a.length, m = b.length, max = n + m;
  const v = new Int32Array(2 * max + 2), trace = [];
  let found = false;
  for (let d = 0; d <= max && !found; d++) {
    trace.push(v.slice());
    for (let k = -d; k <= d; k += 2) {
      let x = (k === -d || (k !== d && v[max + k - 1] < v[max + k + 1])) ? v[max + k + 1] : v[max + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) { x++; y++; }
      v[max + k] = x;
      if (x >= n && y >= m) { found = true; break; }
    }
  }
  const ops = [];
  let x = n, y = m;
  for (let d = trace.length - 1; d >= 0; d--) {
    const vv = trace[d], k = x - y;
    const prevK = (k === -d || (k !== d && vv[max + k - 1] < vv[max + k + 1])) ? k + 1 : k - 1;
    const px = vv[max + prevK], py = px - prevK;
    while (x > px && y > py) { x--; y--; ops.push({ op: " ", a: x, b: y, text: a[x] }); }
    if (d > 0) { if (x === px) { y--; ops.push({ op: "+", a: x, b: y, text: b[y] }); } else { x--; ops.push({ op: "-", a: x, b: y, text: a[x] }); } }
  }
  return ops.reverse();
}

function unifiedView(ops, context = 3) {
  const keep = ops.map(() => false);
  ops.forEach((o, i) => { if (o.op !== " ") for (let j = Math.max(0, i - context); j <= Math.min(ops.length - 1, i + context); j++) keep[j] = true; });
  const rows = [];
  let skipped = false;
  ops.forEach((o, i) => {
    if (!keep[i]) { skipped = true; return; }
    if (skipped || rows.length === 0) rows.push(h("tr", { class: "hunk" }, h("td", { class: "ln" }, "…"), h("td", { class: "ln" }, ""), h("td", {}, `@@ line ${o.a + 1} @@`)));
    skipped = false;
    const cls = o.op === "+" ? "add" : o.op === "-" ? "del" : "";
    rows.push(h("tr", { class: cls }, h("td", { class: "ln" }, o.op !== "+" ? o.a + 1 : ""), h("td", { class: "ln" }, o.op !== "-" ? o.b + 1 : ""),
      h("td", {}, `${o.op} ${o.text}`)));
  });
  return h("table", { class: "diff unified" }, h("tbody", {}, rows));
}

function sideBySideView(ops) {
  const rows = [];
  let i = 0;
  while (i < ops.length) {
    if (ops[i].op === " ") { const o = ops[i++]; rows.push(h("tr", {}, h("td", { class: "ln" }, o.a + 1), h("td", {}, o.text), h("td", { class: "ln" }, o.b + 1), h("td", {}, o.text))); continue; }
    const dels = [], adds = [];
    while (i < ops.length && ops[i].op !== " ") (ops[i].op === "-" ? dels : adds).push(ops[i++]);
    for (let j = 0; j < Math.max(dels.length, adds.length); j++) {
      const d = dels[j], a = adds[j];
      rows.push(h("tr", {}, h("td", { class: "ln" }, d ? d.a + 1 : ""), h("td", { class: d ? "del" : "" }, d ? d.text : ""),
        h("td", { class: "ln" }, a ? a.b + 1 : ""), h("td", { class: a ? "add" : "" }, a ? a.text : "")));
    }
  }
  return h("table", { class: "diff side" }, h("colgroup", {}, h("col", { class: "ln-col" }), h("col"), h("col", { class: "ln-col" }), h("col")), h("tbody", {}, rows));
}

async function pageDiff(name, from, to, params) {
  render(h("p", { class: "muted" }, "Loading…"));
  let a, b;
  try {
    [a, b] = await Promise.all([api("GET", ws(`skills/${enc(name)}/revisions/${from}`)), api("GET", ws(`skills/${enc(name)}/revisions/${to}`))]);
  } catch (e) { render(h("h1", {}, `${name}: r${from} → r${to}`), errorBox(e)); return; }
  const mode = params.get("view") === "side" ? "side" : "unified";
  const byPath = (m) => new Map(m.map((f) => [f.path, f]));
  const am = byPath(a.manifest), bm = byPath(b.manifest);
  const paths = [...new Set([...am.keys(), ...bm.keys()])].sort();
  const changes = paths.map((p) => {
    const x = am.get(p), y = bm.get(p);
    const kind = !x ? "added" : !y ? "removed" : x.sha256 !== y.sha256 ? "modified" : (x.executable !== y.executable ? "mode" : "same");
    return { path: p, kind, x, y };
  }).filter((c) => c.kind !== "same");
  const toggle = h("div", { class: "row", role: "group", "aria-label": "Diff layout" },
    h("a", { class: "button", href: `#/skills/${enc(name)}/diff/${from}/${to}`, "aria-pressed": mode === "unified" ? "true" : "false" }, "Unified"),
    h("a", { class: "button", href: `#/skills/${enc(name)}/diff/${from}/${to}?view=side`, "aria-pressed": mode === "side" ? "true" : "false" }, "Side by side"));
  const summary = h("table", { id: "diff-summary" }, h("thead", {}, h("tr", {}, h("th", {}, "File"), h("th", {}, "Change"), h("th", { class: "num" }, "Lines"))),
    h("tbody", {}, changes.length ? [] : h("tr", {}, h("td", { colspan: 3, class: "muted" }, "The two revisions have the same files."))));
  const files = h("div", { id: "diff-files" });
  render(
    h("p", {}, h("a", { href: "#/" }, "Skills"), " / ", h("a", { href: `#/skills/${enc(name)}` }, name), " / diff"),
    h("h1", {}, `${name}: `, h("a", { href: `#/skills/${enc(name)}/r/${from}` }, `r${from}`), " → ", h("a", { href: `#/skills/${enc(name)}/r/${to}` }, `r${to}`)),
    toggle, h("h2", {}, `${changes.length} file${changes.length === 1 ? "" : "s"} changed`), summary, files);
  for (const c of changes) {
    const stat = h("td", { class: "num" }, "");
    summary.tBodies[0].append(h("tr", {}, h("td", {}, h("a", { href: `#diff-${enc(c.path)}`, class: "mono", onclick: (ev) => { ev.preventDefault(); document.getElementById(`diff-${c.path}`)?.scrollIntoView(); } }, c.path)),
      h("td", {}, h("span", { class: `badge ${c.kind === "mode" ? "modified" : c.kind}` }, c.kind === "mode" ? "mode changed" : c.kind)), stat));
    const section = h("section", { class: "card", id: `diff-${c.path}` }, h("h3", { class: "mono" }, c.path));
    files.append(section);
    try {
      const [ab, bb] = await Promise.all([c.x ? fetchFile(name, from, c.path) : new Uint8Array(), c.y ? fetchFile(name, to, c.path) : new Uint8Array()]);
      const at = asText(ab), bt = asText(bb);
      if (at === null || bt === null) { section.append(h("p", { class: "muted" }, `Binary file: ${size(ab.length)} → ${size(bb.length)}`)); continue; }
      const split = (t) => (t === "" ? [] : t.replace(/\n$/, "").split("\n"));
      const al = split(at), bl = split(bt);
      if (al.length * bl.length > 25e6) { section.append(h("p", { class: "muted" }, "Too large to diff here: download both revisions.")); continue; }
      const ops = diffLines(al, bl);
      const adds = ops.filter((o) => o.op === "+").length, dels = ops.filter((o) => o.op === "-").length;
      stat.textContent = `+${adds} −${dels}`;
      section.append(mode === "side" ? sideBySideView(ops) : unifiedView(ops));
    } catch (e) { section.append(errorBox(e)); }
  }
}

// ---------- publish ----------
// A POSIX ustar archive of {path, bytes, mode} entries (folders chosen in the browser).
function tarOf(entries) {
  const enc8 = new TextEncoder();
  const blocks = [];
  const field = (buf, off, len, str) => { const b = enc8.encode(str); buf.set(b.subarray(0, len), off); };
  const octal = (n, len) => n.toString(8).padStart(len - 1, "0") + "\0";
  for (const e of entries) {
    let name = e.path, prefix = "";
    if (enc8.encode(name).length > 100) { const cut = name.lastIndexOf("/", 154); prefix = name.slice(0, cut); name = name.slice(cut + 1); }
    const hdr = new Uint8Array(512);
    field(hdr, 0, 100, name);
    field(hdr, 100, 8, octal(e.mode, 8));
    field(hdr, 108, 8, octal(0, 8));
    field(hdr, 116, 8, octal(0, 8));
    field(hdr, 124, 12, octal(e.bytes.length, 12));
    field(hdr, 136, 12, octal(0, 12));
    field(hdr, 148, 8, "        ");
    hdr[156] = 48; // '0': a regular file
    field(hdr, 257, 6, "ustar\0");
    field(hdr, 263, 2, "00");
    field(hdr, 345, 155, prefix);
    const sum = hdr.reduce((s, x) => s + x, 0);
    field(hdr, 148, 8, sum.toString(8).padStart(6, "0") + "\0 ");
    blocks.push(hdr, e.bytes);
    const pad = (512 - (e.bytes.length % 512)) % 512;
    if (pad) blocks.push(new Uint8Array(pad));
  }
  blocks.push(new Uint8Array(1024));
  return new Blob(blocks, { type: "application/x-tar" });
}

// What the CLI leaves out of a package it packs (SPEC §3's default excludes), and the
// package's `.skillignore` lines (simple gitignore patterns: `*`, `?`, a trailing `/`).
const ALWAYS_EXCLUDED = [".git/", "__pycache__/", "node_modules/", ".venv/", ".DS_Store"];
function excluded(path, ignore) {
  const parts = path.split("/");
  if (parts.some((p) => ALWAYS_EXCLUDED.includes(p + "/") || ALWAYS_EXCLUDED.includes(p))) return true;
  if (parts.some((p) => p.endsWith(".pyc"))) return true;
  return ignore.some((pat) => {
    const re = new RegExp("^(.*/)?" + pat.replace(/\/$/, "").replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, "[^/]*").replace(/\?/g, "[^/]") + "(/.*)?$");
    return re.test(path);
  });
}

async function pageablePackage(files) {
  // A folder: the browser gives paths as "<folder>/<path>"; the folder is the package root.
  const list = [...files];
  const root = (list[0].webkitRelativePath || list[0].name).split("/")[0];
  const strip = (f) => (f.webkitRelativePath || f.name).split("/").slice(1).join("/");
  const ignoreFile = list.find((f) => strip(f) === ".skillignore");
  const ignore = ignoreFile ? (await ignoreFile.text()).split(/\r?\n/).map((l) => l.trim()).filter((l) => l && !l.startsWith("#")) : [];
  const entries = [];
  for (const f of list.sort((a, b) => strip(a).localeCompare(strip(b)))) {
    const path = strip(f);
    if (!path || excluded(path, ignore)) continue;
    const bytes = new Uint8Array(await f.arrayBuffer());
    // A browser does not tell file modes: scripts are made executable by their names.
    const executable = /\.(sh|py|rb|pl|bash)$/.test(path) || (path.startsWith("scripts/") && !path.includes("."));
    entries.push({ path, bytes, mode: executable ? 0o755 : 0o644 });
  }
  return { name: root, blob: tarOf(entries), type: "application/x-tar", label: `${root}/ (${entries.length} files)` };
}

function archiveOf(file) {
  const n = file.name.toLowerCase();
  const type = n.endsWith(".zip") ? "application/zip" : (n.endsWith(".tar.gz") || n.endsWith(".tgz")) ? "application/gzip" : n.endsWith(".tar") ? "application/x-tar" : null;
  const name = file.name.replace(/\.(zip|tar\.gz|tgz|tar)$/i, "").replace(/-r?\d+$/, "");
  return { name, blob: file, type, label: `${file.name} (${size(file.size)})` };
}

function pagePublish() {
  let chosen = null;
  const nameInput = h("input", { type: "text", id: "skill-name", required: true, pattern: "[a-z0-9]+(-[a-z0-9]+)*", autocomplete: "off" });
  const fileInput = h("input", { type: "file", id: "archive-file", accept: ".zip,.tar.gz,.tgz,.tar" });
  const folderInput = h("input", { type: "file", id: "folder", webkitdirectory: true, multiple: true });
  const picked = h("p", { id: "picked", class: "muted" }, "Nothing chosen yet.");
  const progress = h("progress", { id: "upload-progress", max: 100, value: 0, hidden: true, "aria-label": "Upload progress" });
  const result = h("div", { id: "publish-result", "aria-live": "polite" });
  const button = h("button", { type: "submit", class: "primary", id: "publish-button" }, "Publish");
  const choose = (c) => {
    chosen = c;
    picked.textContent = c.type ? `Chosen: ${c.label}` : `${c.label}: not a .zip, .tar.gz or .tar archive`;
    if (!nameInput.value && c.name) nameInput.value = c.name.toLowerCase();
  };
  fileInput.addEventListener("change", () => fileInput.files[0] && choose(archiveOf(fileInput.files[0])));
  folderInput.addEventListener("change", async () => folderInput.files.length && choose(await pageablePackage(folderInput.files)));
  const drop = h("div", { class: "drop", id: "drop", tabindex: 0, role: "button", "aria-label": "Drop a .zip or .tar.gz here, or press Enter to choose a file",
    onkeydown: (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); fileInput.click(); } } },
    "Drop a .zip or .tar.gz here");
  drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (ev) => { ev.preventDefault(); drop.classList.remove("over"); const f = ev.dataTransfer.files[0]; if (f) choose(archiveOf(f)); });
  const form = h("form", { class: "card", "aria-labelledby": "publish-title" },
    h("h1", { id: "publish-title" }, "Publish a revision"),
    h("div", { class: "field" }, h("label", { for: "skill-name" }, "Skill name"), nameInput,
      h("span", { class: "muted" }, "Lowercase letters, digits and single hyphens; it must match the package's frontmatter name.")),
    drop,
    h("div", { class: "row" },
      h("div", { class: "field" }, h("label", { for: "archive-file" }, "…or choose an archive"), fileInput),
      h("div", { class: "field" }, h("label", { for: "folder" }, "…or choose a folder"), folderInput)),
    picked, progress, result, button);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    result.replaceChildren();
    const name = nameInput.value.trim();
    if (!chosen || !chosen.type) { result.replaceChildren(h("div", { class: "error", role: "alert" }, "Choose a .zip, .tar.gz or .tar archive, or a folder.")); return; }
    if (!name) { result.replaceChildren(h("div", { class: "error", role: "alert" }, "Name the skill.")); return; }
    button.disabled = true;
    try {
      let base = 0;
      try { base = (await api("GET", ws(`skills/${enc(name)}`))).current_revision; } catch (e) { if (e.code !== "not_found" && e.code !== "skill_deleted") throw e; }
      const published = await upload(ws(`skills/${enc(name)}/revisions?base_revision=${base}`), chosen, progress);
      flash(`Published ${published.name} r${published.revision}.`);
      location.hash = `#/skills/${enc(published.name)}/r/${published.revision}`;
    } catch (e) {
      const problems = (e.body && e.body.problems) || [];
      result.replaceChildren(errorBox(e), problems.length ? h("table", { id: "problems" },
        h("thead", {}, h("tr", {}, h("th", {}, "File"), h("th", {}, "Field"), h("th", {}, "Problem"))),
        h("tbody", {}, problems.map((p) => h("tr", {}, h("td", { class: "mono" }, p.path || "—"), h("td", { class: "mono" }, p.field || "—"), h("td", {}, p.message))))) : null);
    } finally { button.disabled = false; }
  });
  render(form);
}

function upload(url, chosen, progress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", url);
    xhr.setRequestHeader("Authorization", `Bearer ${session.token}`);
    xhr.setRequestHeader("Content-Type", chosen.type);
    progress.hidden = false; progress.value = 0;
    xhr.upload.onprogress = (ev) => { if (ev.lengthComputable) progress.value = Math.round((100 * ev.loaded) / ev.total); };
    xhr.onload = () => {
      progress.value = 100;
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch { body = null; }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body); else reject(new ApiError(xhr.status, body));
    };
    xhr.onerror = () => reject(new Error("the upload failed: the server could not be reached"));
    xhr.send(chosen.blob);
  });
}

// ---------- runs ----------
async function pageRuns() {
  const body = h("tbody");
  const status = h("div");
  render(h("div", { class: "row" }, h("h1", { class: "grow" }, "Live runs"), h("span", { class: "muted" }, "Refreshes every 5 s")), status,
    h("table", { id: "runs" }, h("thead", {}, h("tr", {}, h("th", {}, "Run"), h("th", { class: "opt" }, "Authorized"), h("th", {}, "Pins"),
      h("th", {}, "Lease left"), h("th", { class: "opt" }, "Sandbox"), h("th", {}, ""))), body));
  const load = async () => {
    let runs;
    try { runs = (await api("GET", ws("runs"))).runs; } catch (e) { status.replaceChildren(errorBox(e)); return; }
    status.replaceChildren();
    body.replaceChildren(...(runs.length ? runs.map((r) => h("tr", { "data-run": r.run_id },
      h("td", { class: "mono" }, r.run_id, h("div", { class: "muted" }, `started ${ago(r.created_at)}`)),
      h("td", { class: "opt" }, r.authorized_skills.join(", ") || "all"),
      h("td", {}, r.activations.length ? h("ul", {}, r.activations.map((p) => h("li", {},
        h("a", { href: `#/skills/${enc(p.skill)}/r/${p.revision}` }, `${p.skill} r${p.revision}`), " ", h("span", { class: "mono muted", title: p.digest }, shortDigest(p.digest))))) : h("span", { class: "muted" }, "none")),
      h("td", {}, `${Math.max(0, Math.round((r.expires_at - Date.now()) / 1000))} s`),
      h("td", { class: "opt" }, r.node ? `node ${r.node}` : r.sandbox || "—"),
      h("td", {}, h("button", { type: "button", class: "danger", onclick: async () => {
        if (!confirm(`Finish run ${r.run_id}? Its pins and sandbox are released.`)) return;
        try { await api("DELETE", ws(`runs/${enc(r.run_id)}`)); flash(`Run ${r.run_id} finished.`); load(); } catch (e) { status.replaceChildren(errorBox(e)); }
      } }, "Finish")))) : [h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No live runs."))]));
  };
  await load();
  const timer = setInterval(() => { if (location.hash.startsWith("#/runs")) load(); else clearInterval(timer); }, 5000);
}

// ---------- events ----------
let eventsAbort = null;
async function pageEvents() {
  const kinds = ["skill.published", "skill.current_moved", "skill.deleted", "revision.revoked", "revision.collected"];
  const kind = h("select", { id: "event-kind" }, h("option", { value: "" }, "All kinds"), kinds.map((k) => h("option", { value: k }, k)));
  const skill = h("input", { type: "search", id: "event-skill", placeholder: "Skill name" });
  const state = h("span", { class: "muted", id: "stream-state" }, "connecting…");
  const list = h("ul", { id: "events" });
  const items = [];
  const matches = (e) => (!kind.value || e.kind === kind.value) && (!skill.value.trim() || String(e.data.skill || "").includes(skill.value.trim()));
  const redraw = () => list.replaceChildren(...items.filter(matches).map((e) => e.el));
  kind.addEventListener("change", redraw);
  skill.addEventListener("input", redraw);
  render(h("div", { class: "row" }, h("h1", { class: "grow" }, "Events"), state),
    h("div", { class: "row" }, h("label", { for: "event-kind" }, "Kind"), kind, h("label", { for: "event-skill" }, "Skill"), skill),
    h("div", { class: "events", "aria-live": "polite" }, list));
  const add = (e, live) => {
    const d = e.data || {};
    const what = d.revision !== undefined ? ` r${d.revision}` : d.current_revision !== undefined ? ` → r${d.current_revision}` : "";
    e.el = h("li", { class: live ? "new" : "", "data-seq": e.seq, "data-kind": e.kind },
      h("span", { class: "badge" }, e.kind), " ",
      d.skill ? h("a", { href: `#/skills/${enc(d.skill)}` }, d.skill) : "", what,
      h("span", { class: "muted", title: e.at ? when(e.at) : null }, `  #${e.seq}${e.at ? " · " + ago(e.at) : ""}`),
      h("details", {}, h("summary", {}, "data"), h("pre", {}, JSON.stringify(d, null, 2))));
    items.unshift(e);
    if (matches(e)) list.prepend(e.el);
  };
  if (eventsAbort) eventsAbort.abort();
  const abort = new AbortController();
  eventsAbort = abort;
  let after = 0, backlog = true;
  while (!abort.signal.aborted) {
    try {
      const r = await api("GET", ws(`events?after=${after}`), undefined, { raw: true, signal: abort.signal });
      state.textContent = "live";
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      // The backlog arrives at once; later events are live.
      setTimeout(() => { backlog = false; }, 500);
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, cut); buf = buf.slice(cut + 2);
          const ev = { seq: 0, kind: "message", data: {} };
          let data = "";
          for (const line of frame.split("\n")) {
            if (line.startsWith("id:")) ev.seq = Number(line.slice(3).trim());
            else if (line.startsWith("event:")) ev.kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (!data) continue;
          // The frame's data is the whole event: {seq, kind, at, data}.
          try { const whole = JSON.parse(data); ev.data = whole.data || {}; ev.at = whole.at; } catch { ev.data = { raw: data }; }
          after = Math.max(after, ev.seq);
          add(ev, !backlog);
        }
      }
    } catch (e) {
      if (abort.signal.aborted) return;
      state.textContent = `reconnecting (${e.message})…`;
    }
    await new Promise((res) => setTimeout(res, 1000));
  }
}

// ---------- admin ----------
async function pageAdmin() {
  const tokenResult = h("div", { id: "token-result" });
  const tokWs = h("input", { type: "text", id: "token-workspace", value: session.workspace || "" });
  const tokRole = h("select", { id: "token-role" }, ["reader", "author", "runner", "admin", "node"].map((r) => h("option", { value: r }, r)));
  const gcOut = h("div", { id: "gc-result" });
  const fsckOut = h("div", { id: "fsck-result" });
  const nodesOut = h("div", { id: "nodes" });
  const metricsOut = h("div", { id: "metrics" });
  const tokenForm = h("form", { class: "card", "aria-labelledby": "tokens-title" }, h("h2", { id: "tokens-title" }, "Tokens"),
    h("div", { class: "row" }, h("div", { class: "field" }, h("label", { for: "token-workspace" }, "Workspace"), tokWs),
      h("div", { class: "field" }, h("label", { for: "token-role" }, "Role"), tokRole),
      h("button", { type: "submit", class: "primary" }, "Create token")), tokenResult);
  tokenForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = tokRole.value === "node" ? { role: "node" } : { workspace: tokWs.value.trim(), role: tokRole.value };
    try {
      const t = await api("POST", "/v1/admin/tokens", body);
      tokenResult.replaceChildren(h("p", {}, "Copy it now: it is shown once and stored only as a hash."),
        h("div", { class: "token-once mono", id: "new-token" }, t.token),
        h("button", { type: "button", onclick: () => navigator.clipboard && navigator.clipboard.writeText(t.token) }, "Copy"));
    } catch (e) { tokenResult.replaceChildren(errorBox(e)); }
  });
  const gc = async (dry) => {
    if (!dry && !confirm("Collect unreferenced revisions and content now?")) return;
    gcOut.replaceChildren(h("p", { class: "muted" }, "Working…"));
    try {
      const r = await api("POST", "/v1/admin/gc", { dry_run: dry });
      gcOut.replaceChildren(h("p", {}, `${dry ? "Would collect" : "Collected"} ${r.revisions.length} revision(s), ${r.blobs_removed} blob(s), ${size(r.bytes_freed)}; ${r.runs_expired} run(s) expired.`),
        r.revisions.length ? h("ul", {}, r.revisions.map((x) => h("li", {}, `${x.workspace}/${x.skill} r${x.revision}`))) : null);
    } catch (e) { gcOut.replaceChildren(errorBox(e)); }
  };
  const fsck = async () => {
    fsckOut.replaceChildren(h("p", { class: "muted" }, "Verifying every stored object…"));
    try {
      const r = await api("POST", "/v1/admin/fsck", {});
      fsckOut.replaceChildren(h("p", { class: r.ok ? "success" : "error" }, `${r.ok ? "OK" : "Problems found"}: ${r.blobs_checked} blobs, ${r.trees_checked} trees, ${r.revisions_checked} revisions checked.`),
        r.problems.length ? h("table", {}, h("tbody", {}, r.problems.map((p) => h("tr", {}, h("td", { class: "mono" }, p.object), h("td", {}, p.message))))) : null);
    } catch (e) { fsckOut.replaceChildren(errorBox(e)); }
  };
  render(h("h1", {}, "Administration"), tokenForm,
    h("section", { class: "card", "aria-labelledby": "gc-title" }, h("h2", { id: "gc-title" }, "Garbage collection"),
      h("div", { class: "row" }, h("button", { type: "button", id: "gc-dry", onclick: () => gc(true) }, "Dry run"), h("button", { type: "button", class: "danger", id: "gc-run", onclick: () => gc(false) }, "Collect")), gcOut),
    h("section", { class: "card", "aria-labelledby": "fsck-title" }, h("h2", { id: "fsck-title" }, "Integrity (fsck)"),
      h("button", { type: "button", id: "fsck-run", onclick: fsck }, "Verify stored content"), fsckOut),
    h("section", { class: "card", "aria-labelledby": "nodes-title" }, h("h2", { id: "nodes-title" }, "Execution nodes"), nodesOut),
    h("section", { class: "card", "aria-labelledby": "metrics-title" }, h("h2", { id: "metrics-title" }, "Metrics"), metricsOut));
  try {
    const nodes = (await api("GET", "/v1/admin/nodes")).nodes;
    nodesOut.replaceChildren(nodes.length ? h("table", {}, h("thead", {}, h("tr", {}, ["Node", "Address", "State", "Load", "Last heartbeat", "Version"].map((t) => h("th", {}, t)))),
      h("tbody", {}, nodes.map((n) => h("tr", {}, h("td", { class: "mono" }, n.id), h("td", {}, n.address), h("td", {}, h("span", { class: `badge ${n.state === "live" ? "added" : "removed"}` }, n.state)),
        h("td", { class: "num" }, n.load), h("td", {}, ago(n.last_heartbeat)), h("td", {}, n.version))))) : h("p", { class: "muted" }, "No execution nodes registered (this server runs sandboxes itself, or none)."));
  } catch (e) { nodesOut.replaceChildren(errorBox(e)); }
  try {
    const text = await (await fetch("/metrics")).text();
    const rows = text.split("\n").filter((l) => l && !l.startsWith("#") && !l.includes("_bucket{")).slice(0, 60).map((l) => {
      const i = l.lastIndexOf(" ");
      return h("tr", {}, h("td", { class: "mono" }, l.slice(0, i)), h("td", { class: "num" }, l.slice(i + 1)));
    });
    metricsOut.replaceChildren(h("table", {}, h("tbody", {}, rows)), h("p", {}, h("a", { href: "/metrics", target: "_blank" }, "All metrics (Prometheus)")));
  } catch (e) { metricsOut.replaceChildren(errorBox(e)); }
}

// ---------- router ----------
async function route() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  const parts = (path || "/").split("/").filter(Boolean).map(decodeURIComponent);
  if (eventsAbort && parts[0] !== "events") { eventsAbort.abort(); eventsAbort = null; }
  if (!session.token) { who = null; await setupHeader(); return pageSignin(); }
  // The skills list (the landing page) is asked for while the token is checked, not after.
  const listing = !parts[0] && session.workspace ? session.workspace : null;
  const early = listing ? api("GET", ws("skills")) : null;
  if (early) early.catch(() => {}); // its failure is shown by the page, or moot
  if (!who) {
    try { who = await api("GET", "/v1/whoami"); } catch (e) { if (e.status === 401) return; render(errorBox(e)); return; }
    if (who.workspace) session.setWorkspace(who.workspace);
  }
  await setupHeader();
  const section = parts[0] === "skills" || !parts[0] ? "skills" : parts[0];
  for (const a of document.querySelectorAll("#nav a")) a.setAttribute("aria-current", a.dataset.nav === section ? "page" : "false");
  const needs = { publish: "author", runs: "runner", admin: "server-admin" }[parts[0]];
  if (needs && !can(needs)) { render(h("h1", {}, "Not available"), h("div", { class: "error", role: "alert" }, `This page needs the ${needs} role; your token is ${who.role}.`)); return; }
  if (parts[0] === "signin") return pageSignin();
  if (parts[0] === "skills" && parts[1] && parts[2] === "r" && parts[3]) return pageRevision(parts[1], parts[3], params);
  if (parts[0] === "skills" && parts[1] && parts[2] === "diff") return pageDiff(parts[1], parts[3], parts[4], params);
  if (parts[0] === "skills" && parts[1]) return pageSkill(parts[1]);
  if (parts[0] === "publish") return pagePublish();
  if (parts[0] === "runs") return pageRuns();
  if (parts[0] === "events") return pageEvents();
  if (parts[0] === "admin") return pageAdmin();
  return pageSkills(params, listing === session.workspace ? early : null);
}

$("#sign-out").addEventListener("click", () => signOut());
window.addEventListener("hashchange", () => { route(); main().focus({ preventScroll: true }); });
route();
