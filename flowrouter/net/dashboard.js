// flownet dashboard script (dashboard.html; served as /dashboard.js under the page's
// Content-Security-Policy, which allows no inline script). Names come from routers and
// applications, so they are untrusted: they reach the page only as text (textContent,
// attribute values, Option text), never as markup.
"use strict";
const NS = "http://www.w3.org/2000/svg";
let last = null, lastT = 0, seen = 0;
const rates = {};

function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

function layout(routers, w, h) {
  const pos = {}, n = routers.length, r = Math.min(w, h) / 2 - 60;
  routers.forEach((rt, i) => {
    const a = -Math.PI / 2 + 2 * Math.PI * i / Math.max(n, 1);
    pos[rt.name] = n === 1 ? [w / 2, h / 2] : [w / 2 + r * Math.cos(a), h / 2 + r * Math.sin(a)];
  });
  return pos;
}

function drawGraph(snap, now) {
  const svg = document.getElementById("graph");
  svg.replaceChildren();
  const pos = layout(snap.routers, 760, 480);
  for (const lk of snap.links) {
    const a = pos[lk.a], b = pos[lk.b];
    if (!a || !b) continue;
    const prev = last && last.links.find(x => x.name === lk.name);
    const dt = now - lastT;
    if (prev && dt > 0) rates[lk.name] = Math.max(0, (lk.frames - prev.frames) / dt);
    const g = el("g", {"class": "link " + lk.state, "data-link": lk.name, "data-state": lk.state});
    g.appendChild(el("line", {x1: a[0], y1: a[1], x2: b[0], y2: b[1]}));
    const rate = rates[lk.name] || 0;
    const label = lk.name + " " + (lk.state === "up" ? rate.toFixed(1) + " frames/s"
                                                      : lk.state.toUpperCase());
    g.appendChild(el("text", {x: (a[0] + b[0]) / 2 + 6, y: (a[1] + b[1]) / 2 - 6}, label));
    svg.appendChild(g);
  }
  for (const rt of snap.routers) {
    const [x, y] = pos[rt.name];
    const g = el("g", {"class": "router" + (rt.up ? "" : " down"), "data-router": rt.name});
    g.appendChild(el("circle", {cx: x, cy: y, r: 22}));
    g.appendChild(el("text", {x: x + 26, y: y + 5}, rt.name));
    g.appendChild(el("text", {x: x + 26, y: y + 21, "class": "sub"}, rt.flows + " flows"));
    svg.appendChild(g);
  }
}

function drawEvents(snap) {
  const box = document.getElementById("events");
  for (const ev of snap.events.slice(seen)) {
    const d = document.createElement("div");
    d.className = "new";
    d.textContent = "[" + ev.t.toFixed(2) + "s] " + ev.what;
    box.prepend(d);
    setTimeout(() => d.classList.remove("new"), 3000);
  }
  seen = snap.events.length;
}

function drawTree(snap) {
  const sel = document.getElementById("flowsel");
  const names = snap.flows.map(f => f.flow);
  if ([...sel.options].map(o => o.value).join() !== names.join()) {
    const keep = sel.value;
    sel.replaceChildren(...names.map(n => new Option(n, n)));
    if (names.includes(keep)) sel.value = keep;
  }
  const svg = document.getElementById("tree");
  svg.replaceChildren();
  const flow = snap.flows.find(f => f.flow === sel.value) || snap.flows[0];
  if (!flow) { svg.appendChild(el("text", {x: 10, y: 20}, "no flows")); return; }
  // children by parent, from each router's downstream links
  const kids = {}, hasParent = new Set();
  for (const e of flow.edges) {
    (kids[e.from] = kids[e.from] || []).push(e);
    hasParent.add(e.to);
  }
  const roots = [...new Set(flow.edges.map(e => e.from))].filter(r => !hasParent.has(r));
  let row = 0;
  const place = (node, depth, mask) => {
    const y = 20 + 22 * row++, x = 10 + 150 * depth;
    svg.appendChild(el("text", {x: x, y: y}, node + (mask ? "  [" + mask + "]" : "")));
    for (const e of kids[node] || []) {
      svg.appendChild(el("line", {x1: x + 4, y1: y + 6, x2: x + 146, y2: 16 + 22 * row,
                                  stroke: "#9467bd", "stroke-width": 1.5}));
      place(e.to, depth + 1, e.mask);
    }
  };
  for (const r of roots) place(r, 0, flow.aggregate[r] || "");
}

function row(tag, cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement(tag);
    td.textContent = c;
    tr.appendChild(td);
  }
  return tr;
}

function drawLinks(snap) {
  const table = document.createElement("table");
  table.appendChild(row("th", ["link", "ends", "state", "frames/s", ""]));
  for (const lk of snap.links)
    table.appendChild(row("td", [lk.name, lk.a + " - " + lk.b, lk.state,
                                 (rates[lk.name] || 0).toFixed(1), lk.detail || ""]));
  document.getElementById("links").replaceChildren(table);
}

async function tick() {
  try {
    const resp = await fetch("api/overlay", {cache: "no-store"});
    const snap = await resp.json();
    const now = performance.now() / 1000;
    document.getElementById("title").textContent = "flownet: " + snap.name;
    document.getElementById("clock").textContent = "t = " + snap.t.toFixed(1) + " s";
    const down = snap.links.filter(l => l.state !== "up").length;
    document.getElementById("summary").textContent = snap.routers.length + " routers, " +
      snap.links.length + " links (" + down + " down)";
    drawGraph(snap, now);
    drawEvents(snap);
    drawTree(snap);
    drawLinks(snap);
    last = snap; lastT = now;
    document.body.dataset.ready = "1";
  } catch (e) {
    document.getElementById("summary").textContent = "no data: " + e;
  }
}
tick();
setInterval(tick, 1000);
