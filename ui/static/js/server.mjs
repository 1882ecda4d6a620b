// Server page: prepend new events to the timeline and keep the lifecycle
// badge current.
import { stream, describe, ts, el } from "./live.mjs";

const h1 = document.querySelector("h1[data-server]");
const name = h1.dataset.server;
const tl = document.getElementById("timeline");
stream({ server: name, after: h1.dataset.seq }, (e) => {
  const li = el("li");
  li.appendChild(el("time", {}, ts(e.at)));
  li.appendChild(document.createTextNode(" "));
  li.appendChild(el("span", { class: "kind" }, e.kind));
  li.appendChild(document.createTextNode(" " + describe(e) + " "));
  li.appendChild(el("span", { class: "actor" }, e.actor || ""));
  tl.insertBefore(li, tl.firstChild);
  if (e.kind === "lifecycle") {
    const b = document.getElementById("lifecycle");
    b.textContent = e.to;
    b.className = "lc lc-" + e.to;
  }
  if (e.kind === "power") document.getElementById("power").textContent = e.power + " (" + ts(e.at) + ")";
});
