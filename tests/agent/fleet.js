// A Node.js service's mix of work for `kiln bench agent --storage` (docs/benchmarks.md):
// JSON, regular expressions, hashing, compression, sorting and string building, in turn,
// until killed: many functions and stacks, as a real program has.
"use strict";
const crypto = require("crypto");
const zlib = require("zlib");

const words = Array.from({ length: 500 }, (_, i) => `w${i}`);
const pick = () => words[Math.floor(Math.random() * words.length)];

function handleJson() {
  const doc = { id: Math.random(), items: Array.from({ length: 50 }, () => ({ k: pick(), v: Math.random() })) };
  return JSON.parse(JSON.stringify(doc)).items.length;
}

function handleRegex() {
  const text = Array.from({ length: 300 }, pick).join(" ");
  return (text.match(/w(\d+)7\b/g) || []).length;
}

function handleHash() {
  const data = crypto.randomBytes(4096);
  return crypto.createHash("sha256").update(data).digest()[0] + zlib.deflateSync(data).length % 7;
}

function handleSort() {
  const counts = new Map();
  for (let i = 0; i < 2000; i++) {
    const w = pick();
    counts.set(w, (counts.get(w) || 0) + 1);
  }
  return [...counts].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))[0][1];
}

function handleTemplate() {
  let out = "";
  for (let i = 0; i < 200; i++) out += `<li class="${pick()}">${pick().toUpperCase()}</li>`;
  return out.length;
}

function serve() {
  const handlers = [handleJson, handleRegex, handleHash, handleSort, handleTemplate];
  let sink = 0;
  for (;;) sink += handlers[Math.floor(Math.random() * handlers.length)]();
}

serve();
