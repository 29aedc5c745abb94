// Kiln's Node.js burner (crates/kiln/tests/integration/interpreters.rs): 7:3 of its time
// in two named functions, called from a named main, for argv[2] seconds. With
// "compress", a function spends its time in C++ (zlib, through a binding) instead, so
// the JavaScript above it must be found past native frames; with "threads", a worker
// thread (an isolate of its own) runs kiln_hot_a while the main thread runs kiln_hot_b.
"use strict";
const zlib = require("zlib");
const { Worker, isMainThread } = require("worker_threads");

function kiln_hot_a(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x = (x * 31 + i) % 1000003;
  return x;
}

function kiln_hot_b(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x = (x * 31 + i) % 1000003;
  return x;
}

function kiln_compress(data) {
  return zlib.deflateSync(data, { level: 9 });
}

function kiln_main(seconds, mode) {
  const finish = Date.now() + seconds * 1000;
  const data = Buffer.alloc(1 << 20, "kiln profiles every program ");
  let sink = 0;
  while (Date.now() < finish) {
    if (mode === "compress") {
      sink += kiln_compress(data).length;
    } else if (mode === "threads" || mode === "worker") {
      sink += mode === "worker" ? kiln_hot_a(100000) : kiln_hot_b(100000);
    } else if (Math.random() < 0.7) {
      // The same work, 70/30 at random: no period for the sampling to fall in step with.
      sink += kiln_hot_a(100000);
    } else {
      sink += kiln_hot_b(100000);
    }
  }
  return sink;
}

const seconds = Number(process.argv[2]);
const mode = process.argv[3] || "plain";
if (!isMainThread) {
  kiln_main(seconds, "worker");
} else {
  // The agent finds V8 at the first samples; the work then has its frames.
  setTimeout(() => {
    if (mode === "threads") {
      new Worker(__filename, { argv: [seconds, "worker"] });
    }
    kiln_main(seconds, mode);
  }, 1000);
}
