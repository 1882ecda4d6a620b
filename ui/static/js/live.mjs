// Shared helpers: the admin API's event stream (read through the UI's
// session-authenticated /ui/api/v1 proxy) and small DOM utilities.

// stream opens the event stream after seq and calls onEvent(event) for each
// event of any kind; badge (optional) shows "live" or "connecting". The
// stream is asked for unnamed events (unnamed=1): event kinds are
// open-ended (health, wipe.done, console.open, boot.*), and EventSource
// delivers a named event only to a listener registered for that name.
// EventSource resends Last-Event-ID on reconnect, so no event is lost
// across a drop.
export function stream(query, onEvent, badge) {
  const es = new EventSource("/ui/api/v1/events/stream?" + new URLSearchParams({ ...query, unnamed: "1" }));
  const set = (s) => { if (badge) { badge.dataset.state = s; badge.textContent = s; } };
  es.addEventListener("open", () => set("live"));
  es.addEventListener("error", () => set(es.readyState === EventSource.CLOSED ? "closed" : "connecting"));
  es.addEventListener("message", (m) => {
    try { onEvent(JSON.parse(m.data)); } catch (err) { console.error("event", err); }
  });
  return es;
}

export function describe(e) {
  if (e.kind === "lifecycle") return `${e.from} → ${e.to}` + (e.message ? ": " + e.message : "");
  return e.message || e.kind;
}

export function ts(iso) {
  const d = new Date(iso);
  return isNaN(d) ? "—" : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

export function el(tag, attrs = {}, text) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  if (text !== undefined) n.textContent = text;
  return n;
}
