// The explore page's notice of frames with no symbols (docs/symbolization.md): loads one
// process's flame graph and prints the notice, the share the page counted, and the top
// table's first names. crates/kiln/tests/integration/symbolization.rs runs it before and
// after the process's debug file is uploaded.
//
// Usage: node symbols_test.mjs SERVER_URL SCREENSHOT_DIR SERVICE LABELS SHOT_NAME

import { chromium } from 'playwright-core';
import { launch, ready, watchedPage } from './ready.mjs';

const [url, shots, service, labels, shot] = process.argv.slice(2);
const browser = await launch(chromium);
const results = {};
const errors = [];
try {
  const page = await watchedPage(browser, errors);
  const query = new URLSearchParams({ service, labels, from: 'now-1h', until: 'now' });
  await page.goto(`${url}/?${query}`);
  await ready(page);
  const notice = page.locator('[data-testid="symbols-notice"]');
  results.noticeShown = await notice.isVisible();
  results.notice = results.noticeShown ? await notice.textContent() : '';
  results.unnamedShare = Number(await page.evaluate(() => document.body.dataset.unnamedShare));
  results.functions = await page.evaluate(() => [...document.querySelectorAll('#top tbody tr td.name')].slice(0, 8).map((td) => td.textContent));
  await page.screenshot({ path: `${shots}/${shot}.png` });
} catch (error) {
  errors.push(String(error.stack || error));
} finally {
  await browser.close();
}
results.errors = errors;
console.log(JSON.stringify(results));
