// The UI over time, in Debian's Chromium (playwright-core): the service overview and its
// sort, the heatmap and its rectangles, exemplars down to one profile (and its pprof), a
// function's source lines, deep links, keyboard use, axe-core's accessibility rules, and
// a screenshot of each view at 1280x800 in the light and the dark theme. Prints what it
// saw as JSON; crates/kiln/tests/integration/ui.rs asserts on it.
//
// Usage: node drilldown_test.mjs SERVER_URL SCREENSHOT_DIR BULK_SERVER_URL

import { readFileSync } from 'node:fs';
import { chromium } from 'playwright-core';
import { ready } from './ready.mjs';

const [url, shots, bulkUrl] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.KILN_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu'],
});
const axeSource = readFileSync(new URL('./node_modules/axe-core/axe.min.js', import.meta.url), 'utf8');
const results = { axe: [] };
const errors = [];
const VIEWPORT = { width: 1280, height: 800 };

async function newPage(colorScheme = 'light') {
  const page = await browser.newPage({ viewport: VIEWPORT, colorScheme, acceptDownloads: true });
  page.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  page.on('console', (message) => { if (message.type() === 'error') errors.push(`console: ${message.text()}`); });
  return page;
}

/** axe-core's WCAG 2 A and AA rules (colour contrast among them) on the page as it is. */
async function audit(page, name) {
  await page.addScriptTag({ content: axeSource });
  const violations = await page.evaluate(async () => {
    const outcome = await window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa'] } });
    return outcome.violations.map((v) => ({ id: v.id, impact: v.impact, nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' ')) }));
  });
  results.axe.push({ view: name, violations });
}

const state = (page) => page.evaluate(() => Object.fromEntries(new URLSearchParams(location.search)));

try {
  // 1. The overview, the home page: every service, largest change first.
  let page = await newPage();
  const started = Date.now();
  await page.goto(`${url}/`);
  let generation = await ready(page);
  results.overviewLoadMs = Date.now() - started;
  results.overview = await page.evaluate(() => ({
    view: document.body.dataset.view,
    visible: !document.querySelector('[data-testid="service-overview"]').hidden,
    order: JSON.parse(document.getElementById('overview').dataset.order || '[]'),
    changes: [...document.querySelectorAll('#overview td.change')].map((td) => td.textContent),
    tops: [...document.querySelectorAll('#overview tbody tr')].map((tr) => [...tr.querySelectorAll('ol.top3 li')].map((li) => li.title)),
  }));
  await page.screenshot({ path: `${shots}/overview-light.png` });
  await audit(page, 'overview light');
  await page.click('#overview th[data-sort="service"]');
  results.overviewByName = await page.evaluate(() => JSON.parse(document.getElementById('overview').dataset.order));
  await page.click('#overview th[data-sort="change"]');
  results.overviewByChange = await page.evaluate(() => JSON.parse(document.getElementById('overview').dataset.order));

  // Keyboard: the tab order from the top of a fresh page, then Enter on a service row
  // opens it.
  await page.goto(`${url}/`);
  generation = await ready(page);
  const stops = [];
  for (let i = 0; i < 50; i++) {
    await page.keyboard.press('Tab');
    stops.push(await page.evaluate(() => {
      const e = document.activeElement;
      return e.id || e.dataset.service || e.dataset.sort || e.dataset.range || e.textContent.trim().slice(0, 20) || e.tagName;
    }));
  }
  results.tabStops = stops;
  await page.focus('#overview tbody tr[data-service="dd-grow"]');
  await page.keyboard.press('Enter');
  generation = await ready(page, generation);
  results.enterOpened = await state(page);

  // 2. The heatmap of dd-grow's profiles; a rectangle narrows the flame graph to them.
  await page.click('#heatmap-toggle');
  generation = await ready(page, generation);
  results.heatmap = await page.evaluate(() => ({
    cells: Number(document.getElementById('heatmap').dataset.cells),
    profiles: Number(document.getElementById('heatmap').dataset.profiles),
    flameTotal: Number(document.body.dataset.flameTotal),
  }));
  await page.screenshot({ path: `${shots}/heatmap-light.png` });
  const box = await page.locator('#heatmap').boundingBox();
  const cellsLeft = box.x + 70;
  const cellsWidth = box.width - 70;
  const cellsHeight = 180;
  // The later 55 % of the range, the upper 70 % of the value rows.
  await page.mouse.move(cellsLeft + cellsWidth * 0.45, box.y + 1);
  await page.mouse.down();
  await page.mouse.move(cellsLeft + cellsWidth * 0.8, box.y + cellsHeight * 0.5, { steps: 4 });
  await page.mouse.move(box.x + box.width - 1, box.y + cellsHeight * 0.7, { steps: 4 });
  await page.mouse.up();
  generation = await ready(page, generation);
  results.rectangle = await page.evaluate(() => ({
    sel: new URLSearchParams(location.search).get('sel'),
    flameTotal: Number(document.body.dataset.flameTotal),
    selection: JSON.parse(document.body.dataset.selection || 'null'),
    summary: document.getElementById('heatmap-summary').textContent,
  }));
  await page.screenshot({ path: `${shots}/heatmap-selected-light.png` });
  // Shift-drag a second rectangle: the two compared.
  await page.keyboard.down('Shift');
  await page.mouse.move(cellsLeft + 1, box.y + 1);
  await page.mouse.down();
  await page.mouse.move(cellsLeft + cellsWidth * 0.4, box.y + cellsHeight - 1, { steps: 4 });
  await page.mouse.up();
  await page.keyboard.up('Shift');
  generation = await ready(page, generation);
  results.compared = await page.evaluate(() => ({
    sel2: new URLSearchParams(location.search).get('sel2'),
    diffSides: document.body.dataset.diffSides,
    selection: JSON.parse(document.body.dataset.selection || 'null'),
    tableTestId: document.getElementById('top').dataset.testid,
  }));
  await page.screenshot({ path: `${shots}/heatmap-compare-light.png` });
  await audit(page, 'explore with heatmap, light');

  // 3. A deep link: the same view in a fresh browser context.
  const link = page.url();
  const other = await browser.newContext({ viewport: VIEWPORT });
  const copy = await other.newPage();
  copy.on('pageerror', (error) => errors.push(`page error (copy): ${error.message}`));
  await copy.goto(link);
  await ready(copy);
  results.deepLink = {
    same: JSON.stringify(await state(copy)) === JSON.stringify(await state(page)),
    diffSides: await copy.evaluate(() => document.body.dataset.diffSides),
    original: results.compared.diffSides,
  };
  await other.close();

  // Escape clears the heatmap selection.
  await page.click('#status', { force: true }).catch(() => {});
  await page.keyboard.press('Escape');
  generation = await ready(page, generation);
  results.afterEscape = await state(page);

  // 4. Exemplars: a timeline point lists its profiles; one opens alone, and downloads.
  await page.click('#heatmap-toggle');
  generation = await ready(page, generation);
  const over = await page.locator('#timeline .u-over').boundingBox();
  // dd-grow's profiles sit in the last half hour of the hour shown.
  // One click at a time, each given time to list: a second list could replace the first.
  let pointAt = 0;
  for (const fraction of [0.75, 0.7, 0.8, 0.65, 0.85, 0.6, 0.9]) {
    await page.mouse.click(over.x + over.width * fraction, over.y + over.height / 2);
    const listed = await page.waitForFunction(() => !document.getElementById('profiles-section').hidden, null, { timeout: 3000 })
      .then(() => true, () => false);
    if (listed) { pointAt = fraction; break; }
  }
  results.exemplars = await page.$$eval('[data-testid="exemplars"] tbody tr', (rows) => rows.map((row) => ({
    id: row.dataset.profileId, value: Number(row.dataset.value), cells: [...row.cells].map((td) => td.textContent),
  })));
  await page.screenshot({ path: `${shots}/exemplars-light.png` });
  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.click('[data-testid="exemplars"] tbody tr:first-child a'),
  ]);
  const saved = `${shots}/exemplar.pb.gz`;
  await download.saveAs(saved);
  results.exemplarDownload = saved;
  await page.click('[data-testid="exemplars"] tbody tr:first-child button.open-profile');
  generation = await ready(page, generation);
  results.single = await page.evaluate(() => ({
    profile: new URLSearchParams(location.search).get('profile'),
    flameTotal: Number(document.body.dataset.flameTotal),
  }));
  await page.screenshot({ path: `${shots}/single-light.png` });
  const singleLink = page.url();

  // 5. Source lines of a function of a profile that has them.
  const linesUrl = `${url}/?service=dd-lines&type=${encodeURIComponent('process_cpu:cpu:nanoseconds:cpu:nanoseconds')}&from=now-1h&until=now&fn=runtime.schedule`;
  await page.goto(linesUrl);
  await ready(page);
  await page.waitForFunction(() => !document.getElementById('lines-section').hidden, null, { timeout: 20000 });
  results.lines = await page.evaluate(() => ({
    rows: [...document.querySelectorAll('#lines tbody tr')].map((tr) => [...tr.cells].map((td) => td.textContent)),
    sourceRows: document.querySelectorAll('#source table.source tr.hot').length,
    firstHot: (document.querySelector('#source tr.hot td.code') || {}).textContent || '',
    note: document.getElementById('lines-note').textContent,
  }));
  await page.locator('[data-testid="source-lines"]').scrollIntoViewIfNeeded();
  await page.screenshot({ path: `${shots}/lines-light.png` });
  await audit(page, 'lines light');
  await page.keyboard.press('Escape');
  results.linesAfterEscape = await page.evaluate(() => document.getElementById('lines-section').hidden);

  // 6. The same views in the dark theme, audited too.
  const dark = await newPage('dark');
  await dark.goto(`${url}/`);
  let darkGeneration = await ready(dark);
  await dark.screenshot({ path: `${shots}/overview-dark.png` });
  await audit(dark, 'overview dark');
  await dark.goto(link);
  darkGeneration = await ready(dark);
  await dark.screenshot({ path: `${shots}/heatmap-compare-dark.png` });
  await audit(dark, 'explore with heatmap, dark');
  await dark.goto(`${url}/?service=dd-grow`);
  await ready(dark);
  const darkOver = await dark.locator('#timeline .u-over').boundingBox();
  await dark.mouse.click(darkOver.x + darkOver.width * pointAt, darkOver.y + darkOver.height / 2);
  await dark.waitForFunction(() => !document.getElementById('profiles-section').hidden);
  await dark.screenshot({ path: `${shots}/exemplars-dark.png` });
  await audit(dark, 'exemplars dark');
  await dark.goto(singleLink);
  await ready(dark);
  await dark.screenshot({ path: `${shots}/single-dark.png` });
  await dark.goto(linesUrl);
  await ready(dark);
  await dark.waitForFunction(() => !document.getElementById('lines-section').hidden);
  await dark.locator('[data-testid="source-lines"]').scrollIntoViewIfNeeded();
  await dark.screenshot({ path: `${shots}/lines-dark.png` });
  await audit(dark, 'lines dark');
  results.darkBackground = await dark.evaluate(() => getComputedStyle(document.body).backgroundColor);

  // 7. 500 services: the overview's time from navigation to drawn.
  const bulk = await newPage();
  const bulkStarted = Date.now();
  await bulk.goto(`${bulkUrl}/`);
  await ready(bulk);
  results.bulk = await bulk.evaluate(() => ({
    rows: document.querySelectorAll('#overview tbody tr').length,
    renderMs: Number(document.body.dataset.overviewMillis),
    fetchMs: Number(document.body.dataset.overviewFetchMillis),
    sinceNavigationMs: performance.now(),
  }));
  results.bulk.wallMs = Date.now() - bulkStarted;
  await bulk.screenshot({ path: `${shots}/overview-500-light.png` });
} catch (error) {
  errors.push(`test error: ${error.stack || error.message}`);
}
results.errors = errors;
await browser.close();
console.log(JSON.stringify(results));
