// Fleet overview: client-side filters, live rows from the event stream and
// the lifecycle-over-time chart.
import { stream, describe, ts, getJSON, el } from "./live.mjs";

const q = document.getElementById("q");
const fLc = document.getElementById("f-lifecycle");
const fZone = document.getElementById("f-zone");
const fPower = document.getElementById("f-power");

function applyFilters() {
  const text = q.value.trim().toLowerCase();
  for (const sec of document.querySelectorAll("section.zone")) {
    let shown = 0;
    for (const tr of sec.querySelectorAll("tbody tr")) {
      const ok = (!text || tr.dataset.search.toLowerCase().includes(text)) &&
        (!fLc.value || tr.dataset.lifecycle === fLc.value) &&
        (!fZone.value || tr.dataset.zone === fZone.value || sec.dataset.zone === fZone.value) &&
        (!fPower.value || tr.dataset.power === fPower.value);
      tr.classList.toggle("hidden", !ok);
      if (ok) shown++;
    }
    sec.classList.toggle("hidden", shown === 0);
  }
}
for (const i of [q, fLc, fZone, fPower]) i.addEventListener("input", applyFilters);
document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());

function counts() {
  const c = {};
  for (const tr of document.querySelectorAll("tr[data-name]")) c[tr.dataset.lifecycle] = (c[tr.dataset.lifecycle] || 0) + 1;
  return c;
}

function renderCounts() {
  const c = counts();
  for (const li of document.querySelectorAll("#counts li")) li.querySelector(".n").textContent = c[li.dataset.lifecycle] || 0;
  document.getElementById("total").textContent = document.querySelectorAll("tr[data-name]").length + " servers";
}

// ---- chart: stacked areas of the count per lifecycle, one x step per event ----
let lifecycles = [];
let points = [];
const svg = document.getElementById("chart");
const NS = "http://www.w3.org/2000/svg";

function drawChart() {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  if (points.length === 0) return;
  const W = 600, H = 120;
  const total = Math.max(1, ...points.map((p) => Object.values(p.counts).reduce((a, b) => a + b, 0)));
  const x = (i) => (points.length === 1 ? W : (i * W) / (points.length - 1));
  const base = new Array(points.length).fill(0);
  for (const lc of lifecycles) {
    const top = points.map((p, i) => base[i] + Math.max(0, p.counts[lc] || 0));
    if (top.every((v, i) => v === base[i])) continue;
    let d = "";
    top.forEach((v, i) => { d += `${i ? "L" : "M"}${x(i).toFixed(1)},${(H - (v * H) / total).toFixed(1)}`; });
    for (let i = points.length - 1; i >= 0; i--) d += `L${x(i).toFixed(1)},${(H - (base[i] * H) / total).toFixed(1)}`;
    const path = document.createElementNS(NS, "path");
    path.setAttribute("d", d + "Z");
    path.setAttribute("class", "area area-" + lc);
    const title = document.createElementNS(NS, "title");
    title.textContent = lc;
    path.appendChild(title);
    svg.appendChild(path);
    top.forEach((v, i) => { base[i] = v; });
  }
}

getJSON("/ui/data/history").then((h) => {
  lifecycles = h.lifecycles;
  points = h.points.length ? h.points : [{ counts: counts() }];
  drawChart();
}).catch((err) => console.error(err));

// ---- live updates ----
async function refreshRow(name, e) {
  let tr = document.getElementById("srv-" + name);
  let s;
  try { s = await getJSON("/ui/api/v1/servers/" + encodeURIComponent(name)); } catch { return; }
  if (!tr) {
    const zone = s.zone || "(no zone)";
    let sec = [...document.querySelectorAll("section.zone")].find((x) => x.dataset.zone === zone);
    if (!sec) return location.reload(); // a new zone: rebuild the page
    tr = el("tr", { id: "srv-" + name, "data-name": name, "data-zone": s.zone || "" });
    const a = el("a", { href: "/ui/servers/" + name }, name);
    const td = el("td"); td.appendChild(a); tr.appendChild(td);
    tr.appendChild(el("td", {}, s.rack || ""));
    const lc = el("td"); lc.appendChild(el("span", { "data-field": "lifecycle" })); tr.appendChild(lc);
    tr.appendChild(el("td", { "data-field": "power" }));
    tr.appendChild(el("td", { "data-field": "health" }, "—"));
    tr.appendChild(el("td", { "data-field": "event" }));
    sec.querySelector("tbody").appendChild(tr);
  }
  tr.dataset.lifecycle = s.lifecycle;
  tr.dataset.power = s.power.state;
  const lc = tr.querySelector('[data-field="lifecycle"]');
  lc.textContent = s.lifecycle;
  lc.className = "lc lc-" + s.lifecycle;
  tr.querySelector('[data-field="power"]').textContent = s.power.state;
  // Health is the BMC's rollup as the controller's BMC sweep last read it.
  const hc = tr.querySelector('[data-field="health"]');
  hc.textContent = s.health || "—";
  hc.className = "health-" + (s.health || "");
  const ev = tr.querySelector('[data-field="event"]');
  ev.textContent = "";
  ev.appendChild(el("time", {}, ts(e.at)));
  ev.appendChild(document.createTextNode(" " + describe(e)));
  tr.dataset.search = [name, s.rack || "", s.bootMAC || "", describe(e)].join(" ");
  tr.classList.remove("flash"); void tr.offsetWidth; tr.classList.add("flash");
  renderCounts();
  applyFilters();
  if (e.kind === "lifecycle" || e.kind === "server.created") {
    points.push({ seq: e.seq, at: e.at, counts: counts() });
    if (points.length > 2000) points.shift();
    drawChart();
  }
}

const total = document.getElementById("total");
stream({ after: total.dataset.seq }, (e) => { if (e.server) refreshRow(e.server, e); }, document.getElementById("live"));
