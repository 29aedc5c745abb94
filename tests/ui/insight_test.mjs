// Drives the regressions page and the compare view in Debian's Chromium: the watcher's
// finding is listed, its link opens the comparison of the two versions with each row's
// confidence, and clicking a row focuses the flame graph on that function.
// Prints what it saw as JSON; crates/kiln/tests/integration/ui.rs asserts on it.
//
// Usage: node insight_test.mjs SERVER_URL SCREENSHOT_DIR SERVICE

import { chromium } from 'playwright-core';

const [url, shots, service] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.KILN_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu'],
});
const results = {};
const errors = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  page.on('console', (message) => {
    if (message.type() === 'error') errors.push(`console: ${message.text()}`);
  });
  // The explore page links to the regressions of the service in view.
  await page.goto(`${url}/?service=${encodeURIComponent(service)}`);
  await page.waitForFunction(() => Number(document.body.dataset.ready || 0) > 0, null, { timeout: 20000 });
  results.link = await page.getAttribute('#regressions-link', 'href');
  await page.click('#regressions-link');
  await page.waitForFunction(() => document.body.dataset.ready === 'true', null, { timeout: 20000 });
  results.regressions = await page.evaluate(() => [...document.querySelectorAll('[data-testid="regressions"] tbody tr')]
    .map((tr) => ({ change: tr.className, cells: [...tr.children].map((td) => td.textContent) })));
  await page.screenshot({ path: `${shots}/8-regressions.png`, fullPage: true });
  // Its link opens the comparison of the two versions.
  const row = page.locator('[data-testid="regressions"] tbody tr.increase').first();
  await row.locator('a').click();
  await page.waitForFunction(() => Number(document.body.dataset.ready || 0) > 0
    && document.querySelectorAll('[data-testid="compare"] tbody tr').length > 0, null, { timeout: 20000 });
  results.summary = await page.textContent('[data-testid="compare-summary"]');
  results.ranked = await page.evaluate(() => [...document.querySelectorAll('[data-testid="compare"] tbody tr')]
    .map((tr) => ({ significant: tr.classList.contains('significant'), cells: [...tr.children].map((td) => td.textContent) })));
  results.header = await page.evaluate(() => [...document.querySelectorAll('#top th')].filter((th) => !th.hidden).map((th) => th.textContent));
  await page.screenshot({ path: `${shots}/9-compare-ranked.png`, fullPage: true });
  // Clicking a row focuses the flame graph on that function.
  await page.locator('[data-testid="compare"] tbody tr').nth(1).click();
  results.clicked = await page.evaluate(() => document.querySelectorAll('[data-testid="compare"] tbody tr')[0] && document.querySelector('[data-testid="compare"] tbody tr.selected td').textContent);
  results.breadcrumbs = await page.evaluate(() => [...document.querySelectorAll('#breadcrumbs button')].map((b) => b.textContent));
  results.focus = new URL(page.url()).searchParams.get('focus');
} catch (error) {
  errors.push(`${error.stack || error}`);
} finally {
  await browser.close();
}
results.errors = errors;
console.log(JSON.stringify(results));
