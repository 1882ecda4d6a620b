// Serial console: xterm.js on the console WebSocket. The UI answers the
// handshake with the subprotocol naming this session's role; a reader's
// terminal takes no input.
import { Terminal } from "/ui/static/vendor/xterm/xterm.mjs";

const box = document.getElementById("terminal");
const badge = document.getElementById("role");
if (box) {
  const name = box.dataset.server;
  const term = new Terminal({ convertEol: true, cursorBlink: true, rows: 28, cols: 110, fontSize: 14 });
  term.open(box);
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${proto}//${location.host}/ui/servers/${encodeURIComponent(name)}/console/ws`,
    ["machina.console.writer", "machina.console.reader"]);
  ws.binaryType = "arraybuffer";
  const enc = new TextEncoder();
  const set = (s, text) => { badge.dataset.state = s; badge.textContent = text || s; };
  let opened = false;
  ws.addEventListener("open", () => {
    opened = true;
    const writer = ws.protocol === "machina.console.writer";
    set(writer ? "writer" : "reader", writer ? "writer" : "read-only: another session is typing");
    term.options.disableStdin = !writer;
    if (writer) term.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
    term.focus();
  });
  ws.addEventListener("message", (m) => term.write(new Uint8Array(m.data)));
  // A refused handshake (no console on this BMC, BMC unreachable) reaches
  // the page only as an abnormal close without a status: say so.
  ws.addEventListener("close", (c) => set("closed", opened ? "closed" + (c.reason ? ": " + c.reason : "")
    : "closed: the console could not be opened (the BMC refused or is unreachable; see the controller's log)"));
  window.machinaTerminal = term; // for tests and the browser console
}
