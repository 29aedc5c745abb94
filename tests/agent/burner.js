// Kiln's Node.js burner (interpreters.rs): 7:3 of its time in two named functions, called
// from a named main, for argv[2] seconds. "compress": in C++ (zlib) below JavaScript;
// "threads": a worker (an isolate of its own) runs kiln_hot_a, the main thread kiln_hot_b;
// "inline": V8 inlines the hot two into kiln_inline_round, optimized on its own (called a
// few hundred times, not replaced on the stack: it is not the function looping for long).
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
    } else if (mode === "inline") {
      sink += kiln_inline_round();
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

function kiln_inline_round() {
  let sink = 0;
  for (let k = 0; k < 2000; k++) {
    sink += Math.random() < 0.7 ? kiln_hot_a(1000) : kiln_hot_b(1000);
  }
  return sink;
}
