// A small Node program profiled by the real @pyroscope/nodejs SDK, pushing to Kiln.
// Usage: node node_app.js SERVER_URL SECONDS. It burns CPU in kilnNodeHotLoop (wall
// profile) and keeps allocations alive (heap profile).
const Pyroscope = require('@pyroscope/nodejs');

const [server, seconds] = [process.argv[2], Number(process.argv[3])];
const retained = [];

function kilnNodeHotLoop(deadline) {
  let total = 0;
  while (Date.now() < deadline) {
    for (let i = 0; i < 100000; i++) total += i * i;
    retained.push(new Array(64).fill(total));
    if (retained.length > 20000) retained.splice(0, 10000);
  }
  return total;
}

Pyroscope.init({
  serverAddress: server,
  appName: 'kiln-node-e2e',
  tags: { sdk: 'node' },
  flushIntervalMs: 3000,
});
Pyroscope.start();

const deadline = Date.now() + seconds * 1000;
function step() {
  kilnNodeHotLoop(Math.min(deadline, Date.now() + 200));
  if (Date.now() < deadline) {
    setImmediate(step);
  } else {
    Pyroscope.stop().then(() => process.exit(0));
  }
}
step();
