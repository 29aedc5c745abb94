// Drives Kiln's web UI in Debian's Chromium (playwright-core, no bundled browser) and
// prints what it saw as JSON; crates/kiln/tests/integration/ui.rs asserts on it.
//
// Usage: node ui_test.mjs SERVER_URL SCREENSHOT_DIR SERVICE HOT_FUNCTION BIG_SERVICE

import { chromium } from 'playwright-core';
import { ready } from './ready.mjs';

const [url, shots, service, hot, bigService] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.KILN_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu'],
});
const results = {};
const errors = [];

async function observe(page) {
  return page.evaluate(() => ({
    service: document.getElementById('service').value,
    type: document.getElementById('type').value,
    search: document.getElementById('search').value,
    from: document.getElementById('from').value,
    until: document.getElementById('until').value,
    status: document.getElementById('status').textContent,
    statusClass: document.getElementById('status').className,
    timelinePoints: Number(document.getElementById('timeline').dataset.points || 0),
    timelineTotal: Number(document.getElementById('timeline').dataset.total || 0),
    flameRendered: Number(document.getElementById('flamegraph').dataset.rendered || 0),
    flameTotal: Number(document.body.dataset.flameTotal || 0),
    tableTop: [...document.querySelectorAll('#top tbody tr td.name')].slice(0, 10).map((td) => td.textContent),
    searchResult: document.getElementById('search-result').textContent,
    compare: !document.getElementById('compare-section').hidden,
    breadcrumbs: [...document.querySelectorAll('#breadcrumbs button')].map((b) => b.textContent),
  }));
}

try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  page.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  page.on('console', (message) => { if (message.type() === 'error') errors.push(`console: ${message.text()}`); });

  // 1. Open the UI, pick the service: timeline, flame graph, top table.
  await page.goto(`${url}/`);
  let generation = await ready(page);
  await page.selectOption('#service', service);
  generation = await ready(page, generation);
  results.opened = await observe(page);
  results.firstMeaningfulRenderMs = await page.evaluate(() => performance.now());
  await page.screenshot({ path: `${shots}/1-explore.png`, fullPage: true });

  // 2. Search a function: highlighted, with its share.
  await page.fill('#search', hot);
  await page.waitForFunction(() => document.getElementById('search-result').textContent !== '');
  results.searched = await observe(page);
  await page.screenshot({ path: `${shots}/2-search.png`, fullPage: true });

  // 3. Drag over the timeline's right half: the range and the totals change.
  const box = await page.locator('#timeline .u-over').boundingBox();
  await page.mouse.move(box.x + box.width * 0.55, box.y + box.height / 2);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.99, box.y + box.height / 2, { steps: 8 });
  await page.mouse.up();
  generation = await ready(page, generation);
  results.dragged = await observe(page);
  await page.screenshot({ path: `${shots}/3-drag.png`, fullPage: true });

  // 4. Compare: back to the whole hour, then first half against second half.
  await page.click('[data-range="1h"]');
  generation = await ready(page, generation);
  await page.click('#compare-toggle');
  generation = await ready(page, generation);
  results.compared = await observe(page);
  results.compareUrl = page.url();
  await page.screenshot({ path: `${shots}/4-compare.png`, fullPage: true });
  await page.click('#compare-toggle');
  generation = await ready(page, generation);

  // 5. A shared URL restores the same view in a new page.
  await page.fill('#search', hot);
  await page.click('#share');
  await page.waitForFunction(() => document.getElementById('share').dataset.url);
  const shared = await page.evaluate(() => document.getElementById('share').dataset.url);
  results.beforeShare = await observe(page);
  const other = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  other.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  await other.goto(shared);
  await ready(other);
  results.shared = await observe(other);
  results.sharedUrl = shared;
  await other.screenshot({ path: `${shots}/5-shared.png`, fullPage: true });

  // Focus on a function: zoom into the hot function, then query its call path alone.
  const focusPage = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  focusPage.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  await focusPage.goto(`${url}/?service=${encodeURIComponent(service)}&view=flame`);
  let focusGeneration = await ready(focusPage);
  const canvas = await focusPage.locator('#flamegraph').boundingBox();
  await focusPage.mouse.click(canvas.x + canvas.width * 0.5, canvas.y + 18 * 2 + 9);
  results.zoomed = await observe(focusPage);
  await focusPage.click('#focus-full');
  focusGeneration = await ready(focusPage, focusGeneration);
  results.focused = await observe(focusPage);
  results.focusedUrl = focusPage.url();
  await focusPage.screenshot({ path: `${shots}/9-focus.png`, fullPage: true });

  // Label autocomplete: names first, then the values of the typed name.
  await focusPage.fill('#labels', 'en');
  await focusPage.waitForFunction(() => [...document.querySelectorAll('#label-suggestions option')].some((o) => o.value === 'env="'));
  await focusPage.fill('#labels', 'env=');
  await focusPage.waitForFunction(() => [...document.querySelectorAll('#label-suggestions option')].some((o) => o.value.startsWith('env="p')));
  results.suggestions = await focusPage.$$eval('#label-suggestions option', (options) => options.map((o) => o.value));

  // Compare two label selections over the same range: prod against staging.
  await focusPage.goto(`${url}/?service=${encodeURIComponent(service)}`);
  let labelGeneration = await ready(focusPage);
  await focusPage.click('#compare-toggle');
  labelGeneration = await ready(focusPage, labelGeneration);
  await focusPage.fill('#left-from', await focusPage.inputValue('#from'));
  await focusPage.dispatchEvent('#left-from', 'change');
  labelGeneration = await ready(focusPage, labelGeneration);
  await focusPage.fill('#right-from', await focusPage.inputValue('#from'));
  await focusPage.dispatchEvent('#right-from', 'change');
  labelGeneration = await ready(focusPage, labelGeneration);
  await focusPage.fill('#left-labels', 'env="prod"');
  await focusPage.dispatchEvent('#left-labels', 'change');
  labelGeneration = await ready(focusPage, labelGeneration);
  await focusPage.fill('#right-labels', 'env="staging"');
  await focusPage.dispatchEvent('#right-labels', 'change');
  labelGeneration = await ready(focusPage, labelGeneration);
  results.labelCompare = await observe(focusPage);
  results.labelCompareSides = await focusPage.evaluate(() => document.body.dataset.diffSides);
  await focusPage.screenshot({ path: `${shots}/10-compare-labels.png`, fullPage: true });

  // An API error is shown, not swallowed: a selector that does not parse.
  await focusPage.goto(`${url}/?service=${encodeURIComponent(service)}&labels=${encodeURIComponent('env=~"("')}`);
  await ready(focusPage);
  results.errorState = await observe(focusPage);

  // The dark theme follows the system setting.
  await focusPage.emulateMedia({ colorScheme: 'dark' });
  await focusPage.goto(`${url}/?service=${encodeURIComponent(service)}`);
  await ready(focusPage);
  results.darkBackground = await focusPage.evaluate(() => getComputedStyle(document.body).backgroundColor);
  await focusPage.screenshot({ path: `${shots}/11-dark.png`, fullPage: true });
  await focusPage.emulateMedia({ colorScheme: 'light' });

  // Split by a label: one timeline series per value.
  await focusPage.goto(`${url}/?service=${encodeURIComponent(service)}&split=env`);
  await ready(focusPage);
  results.split = await focusPage.evaluate(() => [...document.querySelectorAll('.u-legend .u-series th')].map((th) => th.textContent.trim()));

  // Callers and callees of the hot function.
  const sandwichPage = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  sandwichPage.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  await sandwichPage.goto(`${url}/?service=${encodeURIComponent(service)}&view=sandwich&fn=${encodeURIComponent(hot)}`);
  await ready(sandwichPage);
  results.sandwich = await sandwichPage.evaluate(() => document.body.dataset.sandwich);
  await sandwichPage.screenshot({ path: `${shots}/7-sandwich.png`, fullPage: true });

  // Single profiles: click the timeline at the first upload (50 of 60 minutes ago), list
  // the profiles behind that point, open the one there.
  const singlePage = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  singlePage.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  await singlePage.goto(`${url}/?service=${encodeURIComponent(service)}`);
  let singleGeneration = await ready(singlePage);
  const over = await singlePage.locator('#timeline .u-over').boundingBox();
  await singlePage.mouse.click(over.x + over.width * (10 / 60), over.y + over.height / 2);
  await singlePage.waitForFunction(() => !document.getElementById('profiles-section').hidden);
  results.profilesListed = await singlePage.$$eval('#profiles button', (buttons) => buttons.map((b) => b.textContent));
  if (results.profilesListed.length) {
    await singlePage.click('#profiles button');
    singleGeneration = await ready(singlePage, singleGeneration);
    results.single = await observe(singlePage);
  }
  // Export: the pprof link downloads the selection as gzip pprof.
  results.pprofExport = await singlePage.evaluate(async () => {
    const response = await fetch(document.getElementById('export-pprof').href);
    const bytes = new Uint8Array(await response.arrayBuffer());
    return { status: response.status, bytes: bytes.length, gzip: bytes[0] === 0x1f && bytes[1] === 0x8b };
  });
  const [svgDownload] = await Promise.all([singlePage.waitForEvent('download'), singlePage.click('#export-svg')]);
  results.svgExport = (await svgDownload.path()) ? svgDownload.suggestedFilename() : '';
  await singlePage.screenshot({ path: `${shots}/8-single.png`, fullPage: true });

  // A 50,000-node flame graph: time to the first meaningful render, and to render it.
  const big = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  big.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  const started = Date.now();
  await big.goto(`${url}/?service=${encodeURIComponent(bigService)}`);
  await ready(big);
  results.big = {
    loadToRenderMs: Date.now() - started,
    ...(await big.evaluate(() => ({
      nodes: Number(document.body.dataset.flameNodes || 0),
      setDataMs: Number(document.body.dataset.flameMillis || 0),
      renderMs: Number(document.getElementById('flamegraph').dataset.renderMillis || 0),
      drawn: Number(document.getElementById('flamegraph').dataset.rendered || 0),
      navigationToReadyMs: performance.now(),
    }))),
  };
  // Re-render after a zoom and a search, as a user would, and time each.
  results.big.zoomMs = await big.evaluate(async () => {
    const canvas = document.getElementById('flamegraph');
    const box = canvas.getBoundingClientRect();
    canvas.dispatchEvent(new MouseEvent('click', { clientX: box.left + 5, clientY: box.top + 18 * 2 + 5, bubbles: true }));
    return Number(canvas.dataset.renderMillis);
  });
  await big.screenshot({ path: `${shots}/6-big.png` });
} catch (error) {
  errors.push(`${error.stack || error}`);
} finally {
  await browser.close();
}
results.errors = errors;
console.log(JSON.stringify(results));
