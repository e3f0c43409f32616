// The radixlm dashboard: polls GET /cache_tree as soon as it loads, without a key; only if the
// server answers 401 does it stop, show the key form and wait for the key (kept in this script's
// memory only, then sent as `Authorization: Bearer`). It draws the KV pool, the radix tree, the
// requests and a few series over time. Plain DOM and SVG; every text from the server goes in
// through textContent, never as markup.
"use strict";

// ?poll_ms=N in the page's address sets the refresh period (at least 100 ms; 1 s by default)
const POLL_MS = Math.max(100, Number(new URLSearchParams(location.search).get("poll_ms")) || 1000);
const MAX_NODES = 200;
const HISTORY = 120;
const MAX_TRACE_CALLS = 300;
const TRACE_RUNS = 12; // the newest runs drawn // points kept per series
const ROW_H = 20;
const INDENT = 16;
const SVG = "http://www.w3.org/2000/svg";

const page = {
  apiKey: null, // null: no key given (enough for a server without one)
  timer: null,
  previous: null, // the last answer, for per-interval rates
  selectedRid: null,
  last: null,
  numPolls: 0,
  series: { hit: [], decode: [], prefill: [], ttft: [], itl: [] },
};

function $(id) { return document.getElementById(id); }

function svgEl(name, attrs, parent) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

function fmt(n) { return n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"); }

function setStatus(text, isError) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", Boolean(isError));
}

async function poll() {
  const key = page.apiKey;
  const headers = key !== null ? { Authorization: "Bearer " + key } : {};
  try {
    const resp = await fetch("/cache_tree?max_nodes=" + MAX_NODES, { headers, cache: "no-store" });
    if (resp.status === 401) {
      if (key !== page.apiKey) return; // sent before the key was given: the new polls decide
      stopPolling();
      askForKey(key === null ? "this server needs an API key" : "wrong API key");
      return;
    }
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    const state = await resp.json();
    const traces = await fetch("/traces?max_entries=" + MAX_TRACE_CALLS, { headers, cache: "no-store" });
    if (!traces.ok) throw new Error("HTTP " + traces.status + " from /traces");
    page.numPolls += 1;
    record(state);
    render(state);
    drawTraces((await traces.json()).entries);
    setStatus("live, " + new Date().toLocaleTimeString(), false);
    document.body.dataset.polls = String(page.numPolls); // for tests: answers drawn so far
  } catch (err) {
    setStatus("server unreachable: " + err.message, true);
  }
}

function stopPolling() {
  if (page.timer !== null) clearInterval(page.timer);
  page.timer = null;
}

// the key form is hidden until a 401 says the server wants a key
function askForKey(reason) {
  setStatus(reason, true);
  $("key-form").hidden = false;
  $("api-key").focus();
}

function startPolling() {
  stopPolling();
  page.previous = null;
  poll();
  page.timer = setInterval(poll, POLL_MS);
}

function connect(event) {
  event.preventDefault();
  page.apiKey = $("api-key").value;
  $("api-key").value = ""; // kept in page memory only
  $("key-form").hidden = true;
  setStatus("connecting", false);
  startPolling();
}

// ------------------------------------------------------------------ series over time
function push(list, value) {
  list.push(value);
  if (list.length > HISTORY) list.shift();
}

function ratio(num, den) { return den > 0 ? num / den : null; }

function record(state) {
  const prev = page.previous;
  const s = page.series;
  if (prev !== null) {
    push(s.hit, ratio(state.cache.num_matched_tokens - prev.cache.num_matched_tokens,
                      state.cache.num_queried_tokens - prev.cache.num_queried_tokens));
    push(s.ttft, ratio(state.server.ttft_sum - prev.server.ttft_sum, state.server.ttft_count - prev.server.ttft_count));
    push(s.itl, ratio(state.server.itl_sum - prev.server.itl_sum, state.server.itl_count - prev.server.itl_count));
  }
  push(s.decode, state.steps.decode_tokens_per_s);
  push(s.prefill, state.steps.extend_tokens_per_s);
  page.previous = state;
}

function drawChart(svg, lists, fixedMax) {
  svg.replaceChildren();
  const w = 300, h = 80, pad = 12;
  const values = lists.flat().filter((v) => v !== null);
  const max = fixedMax || Math.max(1e-9, ...values);
  lists.forEach((list, i) => {
    let points = "";
    list.forEach((v, j) => {
      if (v === null) return;
      const x = w - ((list.length - 1 - j) / (HISTORY - 1)) * w; // the newest at the right edge
      const y = h - pad - (v / max) * (h - 2 * pad);
      points += x.toFixed(1) + "," + y.toFixed(1) + " ";
    });
    svgEl("polyline", { points, class: "series-" + i }, svg);
  });
  const label = svgEl("text", { x: 2, y: 9 }, svg);
  label.textContent = values.length === 0 ? "no data yet" : "max " + (max >= 10 ? max.toFixed(0) : max.toPrecision(2));
}

// ------------------------------------------------------------------ figures and pool
function render(state) {
  page.last = state;
  const { tree, pool, cache } = state;
  $("pool-used").textContent = fmt(pool.used_tokens);
  $("pool-cached").textContent = fmt(pool.tree_tokens);
  $("pool-free").textContent = fmt(pool.free_tokens);
  $("pool-total").textContent = fmt(pool.max_total_num_tokens);
  $("tree-total").textContent = fmt(tree.tree_tokens);
  $("tree-locked").textContent = fmt(tree.locked_tokens);
  $("tree-evictable").textContent = fmt(tree.evictable_tokens);
  $("tree-nodes").textContent = fmt(tree.num_nodes) + " (" + fmt(tree.nodes.length) + ")";
  $("hit-rate").textContent = (100 * cache.hit_rate).toFixed(1) + "%";
  $("evicted").textContent = fmt(cache.num_evicted_tokens);
  drawPool(pool);
  drawChart($("chart-hit"), [page.series.hit], 1);
  drawChart($("chart-tput"), [page.series.decode, page.series.prefill]);
  drawChart($("chart-lat"), [page.series.ttft, page.series.itl]);
  drawRequests(state);
  drawTree(tree, pathOfSelected(state));
}

function drawPool(pool) {
  const svg = $("pool-bar");
  svg.replaceChildren();
  let x = 0;
  for (const [part, value] of [["used", pool.used_tokens], ["cached", pool.tree_tokens], ["free", pool.free_tokens]]) {
    const width = (400 * value) / Math.max(1, pool.max_total_num_tokens);
    svgEl("rect", { x, y: 0, width, height: 24, class: "pool-" + part }, svg);
    x += width;
  }
}

// ------------------------------------------------------------------ requests
function drawRequests(state) {
  $("req-counts").textContent = "(" + state.num_running_reqs + " running, " + state.num_waiting_reqs + " waiting)";
  const body = document.querySelector("#requests tbody");
  body.replaceChildren();
  for (const req of state.running.concat(state.waiting)) {
    const row = body.insertRow();
    row.dataset.rid = req.rid;
    row.classList.toggle("selected", req.rid === page.selectedRid);
    const grammar = req.grammar ? req.grammar.kind + ": " + req.grammar.spec : "";
    for (const value of [req.rid, req.state, fmt(req.prompt_tokens), fmt(req.cached_tokens), fmt(req.completion_tokens), grammar]) {
      row.insertCell().textContent = value;
    }
    const text = row.insertCell();
    text.className = "text";
    text.textContent = req.prompt_head;
    row.addEventListener("click", () => select(req.rid));
  }
  const selected = findRequest(state, page.selectedRid);
  $("selection").textContent = selected
    ? selected.rid + ": " + fmt(selected.cached_tokens) + " of " + fmt(selected.prompt_tokens) + " prompt tokens cached"
    : page.selectedRid ? page.selectedRid + " has finished." : "Select a request to see its cached prefix in the tree.";
}

function findRequest(state, rid) {
  return state.running.concat(state.waiting).find((r) => r.rid === rid) || null;
}

function select(rid) {
  page.selectedRid = page.selectedRid === rid ? null : rid;
  if (page.last) render(page.last);
}

function pathOfSelected(state) {
  const req = findRequest(state, page.selectedRid);
  const onPath = new Set();
  if (!req || req.matched_node === null) return onPath;
  const parentOf = new Map(state.tree.nodes.map((n) => [n.id, n.parent]));
  for (let id = req.matched_node; id !== null && id !== undefined; id = parentOf.get(id)) onPath.add(id);
  return onPath;
}

// ------------------------------------------------------------------ the tree
function treeRows(nodes) {
  // depth-first, children largest first: one row per node, plus one per node with hidden children
  const children = new Map();
  for (const n of nodes) {
    const key = n.parent === null ? "root" : n.parent;
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(n);
  }
  for (const list of children.values()) list.sort((a, b) => b.num_tokens - a.num_tokens || a.id - b.id);
  const rows = [];
  const stack = (children.get("root") || []).slice().reverse().map((n) => [n, 0]);
  while (stack.length) {
    const [node, depth] = stack.pop();
    rows.push({ node, depth });
    if (node.num_hidden_children > 0) rows.push({ hidden: node.num_hidden_children, depth: depth + 1, parent: node });
    const kids = children.get(node.id) || [];
    for (let i = kids.length - 1; i >= 0; i--) stack.push([kids[i], depth + 1]);
  }
  return rows;
}

function drawTree(tree, onPath) {
  const svg = $("tree");
  svg.replaceChildren();
  const rows = treeRows(tree.nodes);
  const maxTokens = Math.max(1, ...tree.nodes.map((n) => n.num_tokens));
  const width = 1100;
  svg.setAttribute("width", width);
  svg.setAttribute("height", Math.max(ROW_H, rows.length * ROW_H + 4));
  const rowOf = new Map();
  rows.forEach((row, i) => {
    const y = i * ROW_H + ROW_H / 2 + 2;
    const x = 4 + row.depth * INDENT;
    if (row.hidden !== undefined) {
      const t = svgEl("text", { x: x + 4, y, class: "hidden-children" }, svg);
      t.textContent = "+ " + row.hidden + " more not shown";
      return;
    }
    const n = row.node;
    rowOf.set(n.id, y);
    const g = svgEl("g", { class: "node" + (onPath.has(n.id) ? " on-path" : ""), role: "treeitem" }, svg);
    g.dataset.id = n.id;
    g.dataset.tokens = n.num_tokens;
    g.dataset.label = n.label;
    g.dataset.locked = n.is_locked;
    if (n.parent !== null && rowOf.has(n.parent)) {
      const px = 4 + (row.depth - 1) * INDENT + 4;
      svgEl("line", { x1: px, y1: rowOf.get(n.parent), x2: px, y2: y }, g);
      svgEl("line", { x1: px, y1: y, x2: x, y2: y }, g);
    }
    const barW = 8 + 112 * Math.log1p(n.num_tokens) / Math.log1p(maxTokens);
    svgEl("rect", { x, y: y - 6, width: barW, height: 12, rx: 2, class: n.is_locked ? "locked" : "evictable" }, g);
    const label = svgEl("text", { x: x + barW + 6, y, class: "label" }, g);
    label.textContent = JSON.stringify(n.label);
    const meta = svgEl("tspan", { class: "meta", dx: 8 }, label);
    const age = tree.clock - n.last_access;
    meta.textContent = n.num_tokens + " tok · lock " + n.lock_ref + " · used " + age + " ops ago";
    const title = svgEl("title", {}, g);
    title.textContent = "node " + n.id + ": " + n.num_tokens + " tokens, " + n.num_children + " children, "
      + (n.is_locked ? "locked by " + n.lock_ref + " request(s)" : "evictable");
  });
}

// ------------------------------------------------------------------ program traces
function drawTraces(entries) {
  // one row per (run, branch), newest runs last; bars placed on one time axis
  const svg = $("traces");
  svg.replaceChildren();
  const runs = new Map();
  for (const e of entries) {
    if (!runs.has(e.run_id)) runs.set(e.run_id, []);
    runs.get(e.run_id).push(e);
  }
  const shown = [...runs.values()].slice(-TRACE_RUNS);
  const rows = [];
  for (const calls of shown) {
    const branches = [...new Set(calls.map((c) => c.branch))].sort();
    for (const branch of branches) rows.push({ calls: calls.filter((c) => c.branch === branch), first: calls[0], branch });
  }
  const all = shown.flat();
  const width = 1100, left = 230, rowH = 18;
  svg.setAttribute("viewBox", "0 0 " + width + " " + Math.max(rowH, rows.length * rowH + 16));
  svg.setAttribute("height", Math.max(rowH, rows.length * rowH + 16));
  if (all.length === 0) {
    svgEl("text", { x: 4, y: 9, class: "axis" }, svg).textContent = "no traces yet";
    return;
  }
  const t0 = Math.min(...all.map((c) => c.started_at));
  const t1 = Math.max(...all.map((c) => c.started_at + c.latency_s));
  const scale = (width - left - 8) / Math.max(1e-6, t1 - t0);
  rows.forEach((row, i) => {
    const y = i * rowH + rowH / 2;
    const name = svgEl("text", { x: 2, y }, svg);
    name.textContent = row.first.program + " " + row.first.run_id.slice(0, 6) + (row.branch ? " fork " + row.branch : "");
    for (const c of row.calls) {
      const hit = c.prompt_tokens ? (c.cached_tokens || 0) / c.prompt_tokens : 0;
      const x = left + (c.started_at - t0) * scale;
      const w = Math.max(2, c.latency_s * scale);
      const rect = svgEl("rect", { x, y: y - 6, width: w, height: 12, class: "call" + (c.error ? " error" : ""),
                                   "fill-opacity": (0.25 + 0.75 * hit).toFixed(2) }, svg);
      rect.dataset.name = c.name || "";
      svgEl("title", {}, rect).textContent = c.primitive + " " + (c.name || "") + ": " + fmt(c.cached_tokens) + " of "
        + fmt(c.prompt_tokens) + " prompt tokens cached, " + fmt(c.completion_tokens) + " generated, "
        + c.latency_s.toFixed(3) + " s" + (c.error ? ", " + c.error : "");
      if (w > 40) svgEl("text", { x: x + 3, y }, svg).textContent = c.primitive + " " + (c.name || "");
    }
  });
  const axis = svgEl("text", { x: left, y: rows.length * rowH + 8, class: "axis" }, svg);
  axis.textContent = "0 s … " + (t1 - t0).toFixed(2) + " s";
}

$("key-form").addEventListener("submit", connect);
startPolling(); // without a key: a server that has none answers at once
