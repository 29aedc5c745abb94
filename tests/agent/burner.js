// Kiln's Node.js burner (crates/kiln/tests/integration/interpreters.rs): 7:3 of its time
// in two named functions, called from a named main, for argv[2] seconds. With
// "compress", a function spends its time in C++ (zlib, through a binding) instead, so
// the JavaScript above it must be found past native frames.
"use strict";
const zlib = require("zlib");

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
    } else if (Math.random() < 0.7) {
      // The same work, 70/30 at random: no period for the sampling to fall in step with.
      sink += kiln_hot_a(100000);
    } else {
      sink += kiln_hot_b(100000);
    }
  }
  return sink;
}

// The agent finds V8 at the first samples; the work then has its frames.
setTimeout(() => {
  kiln_main(Number(process.argv[2]), process.argv[3] || "plain");
}, 1000);
