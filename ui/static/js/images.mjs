// Images page: poll import progress while an import runs.
import { getJSON } from "./live.mjs";

const busy = (s) => s === "pending" || s === "downloading" || s === "converting";

async function poll() {
  let data;
  try { data = await getJSON("/ui/data/images"); } catch { return setTimeout(poll, 5000); }
  let running = false;
  for (const img of data.images) {
    const tr = [...document.querySelectorAll("tr[data-image]")].find((x) => x.dataset.image === img.name);
    if (!tr) continue;
    const st = tr.querySelector('[data-field="state"] .st');
    st.textContent = img.state;
    st.className = "st st-" + img.state;
    const p = tr.querySelector('[data-field="progress"]');
    if (img.percent >= 0) p.value = img.percent; else p.removeAttribute("value");
    tr.querySelector('[data-field="pct"]').textContent = img.percent >= 0 ? Math.round(img.percent) + "%" : "?%";
    running = running || busy(img.state);
  }
  if (running) setTimeout(poll, 2000);
}
if ([...document.querySelectorAll('[data-field="state"] .st')].some((s) => busy(s.textContent))) setTimeout(poll, 2000);
