// Copies the pinned npm packages (package-lock.json) into static/vendor,
// the folder go:embed serves. Run `npm ci && npm run vendor` in ui/ after
// changing a version in package.json; commit package-lock.json and
// static/vendor together. Go-only contributors never need to run it.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";

const files = [
  ["node_modules/@xterm/xterm/lib/xterm.mjs", "static/vendor/xterm/xterm.mjs"],
  ["node_modules/@xterm/xterm/css/xterm.css", "static/vendor/xterm/xterm.css"],
  ["node_modules/@xterm/xterm/LICENSE", "static/vendor/xterm/LICENSE"],
  ["node_modules/@xterm/xterm/package.json", "static/vendor/xterm/package.json"],
];
mkdirSync("static/vendor/xterm", { recursive: true });
for (const [from, to] of files) copyFileSync(from, to);
// The source map is not vendored: drop its reference so no browser asks for it.
const js = "static/vendor/xterm/xterm.mjs";
writeFileSync(js, readFileSync(js, "utf8").replace(/\n\/\/# sourceMappingURL=.*\s*$/, "\n"));
