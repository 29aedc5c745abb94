// Drives the recording rules page in Debian's Chromium: write a rule, preview it, save it.
// Prints what it saw as JSON; crates/kiln/tests/integration/ui.rs asserts on it.
//
// Usage: node rules_test.mjs SERVER_URL SCREENSHOT_DIR SERVICE

import { chromium } from 'playwright-core';

const [url, shots, service] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.KILN_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu'],
});
const results = {};
const errors = [];
let expectRefusal = false; // the browser logs the deliberate 400 below as a console error
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  page.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  page.on('console', (message) => {
    if (message.type() === 'error' && !(expectRefusal && message.text().includes('400'))) errors.push(`console: ${message.text()}`);
  });
  await page.goto(`${url}/rules`);
  await page.waitForFunction(() => document.body.dataset.ready === '1', null, { timeout: 20000 });
  await page.fill('#metric_name', 'ui_cpu_nanoseconds');
  await page.fill('#matchers', `{service_name="${service}"}`);
  await page.fill('#group_by', 'service_name, env');
  await page.click('#preview');
  await page.waitForFunction(() => document.body.dataset.previewed === '1', null, { timeout: 20000 });
  results.preview = await page.evaluate(() => ({
    series: Number(document.getElementById('preview-section').dataset.series || 0),
    total: Number(document.getElementById('preview-section').dataset.total || 0),
    rows: [...document.querySelectorAll('#preview-series tbody tr')].map((tr) => [...tr.children].map((td) => td.textContent)),
    chart: !!document.querySelector('#preview-chart canvas'),
    status: document.getElementById('status').textContent,
  }));
  await page.screenshot({ path: `${shots}/7-rule-preview.png`, fullPage: true });
  await page.click('#save');
  await page.waitForFunction(() => document.body.dataset.saved === '1', null, { timeout: 20000 });
  results.listed = await page.evaluate(() => [...document.querySelectorAll('#rules tbody tr')].map((tr) => tr.dataset.name));
  results.saveStatus = await page.evaluate(() => document.getElementById('status').textContent);
  // A mistake is shown as the server words it (rule and field).
  expectRefusal = true;
  await page.fill('#metric_name', 'bad rule');
  await page.click('#save');
  await page.waitForFunction(() => document.body.dataset.saved === '2', null, { timeout: 20000 });
  results.mistake = await page.evaluate(() => document.getElementById('status').textContent);
} catch (error) {
  errors.push(`${error.stack || error}`);
} finally {
  await browser.close();
}
results.errors = errors;
console.log(JSON.stringify(results));
