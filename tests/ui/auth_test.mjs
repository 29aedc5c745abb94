// With auth on: the explore page asks for a token when the server answers 401, shows the
// data once given one, keeps it for the tab (a reload does not ask again) and not beyond
// (a new browser context asks again), and asks again after a wrong one.
// Prints what it saw as JSON; crates/kiln/tests/integration/ui.rs asserts on it.
//
// Usage: node auth_test.mjs SERVER_URL SCREENSHOT_DIR SERVICE TOKEN

import { chromium } from 'playwright-core';

const [url, shots, service, token] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.KILN_CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu'],
});
const results = {};
const errors = [];
const watch = (page) => {
  page.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  page.on('console', (message) => {
    // The browser logs each refused call itself; those 401s are what this test is about.
    if (message.type() === 'error' && !message.text().includes('401 (Unauthorized)')) {
      errors.push(`console: ${message.text()}`);
    }
  });
  page.on('dialog', (dialog) => { errors.push(`native dialog: ${dialog.type()}`); dialog.dismiss(); });
};
const dialog = '[data-testid="token-dialog"]';
const ready = () => Number(document.body.dataset.ready || 0) > 0;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  watch(page);
  await page.goto(`${url}/?service=${encodeURIComponent(service)}`);
  await page.waitForSelector(dialog, { timeout: 20000 });
  results.asked = await page.textContent(`${dialog} .token-message`);
  await page.screenshot({ path: `${shots}/10-token-dialog.png` });
  // A wrong token is refused, and the dialog comes back.
  await page.fill(`${dialog} input`, 'kiln_wrong');
  await page.click(`${dialog} button[value="ok"]`);
  await page.waitForFunction((d) => {
    const shown = document.querySelector(d);
    return shown && shown.querySelector('.token-message').textContent.includes('invalid token');
  }, dialog, { timeout: 20000 });
  results.askedAgain = await page.textContent(`${dialog} .token-message`);
  await page.fill(`${dialog} input`, token);
  await page.keyboard.press('Enter');
  await page.waitForFunction(ready, null, { timeout: 20000 });
  results.total = Number(await page.evaluate(() => document.body.dataset.flameTotal));
  results.functions = await page.evaluate(() => [...document.querySelectorAll('#top tbody tr td.name')].map((td) => td.textContent));
  results.dialogAfter = await page.locator(dialog).count();
  // The same tab keeps it.
  await page.reload();
  await page.waitForFunction(ready, null, { timeout: 20000 });
  results.dialogAfterReload = await page.locator(dialog).count();
  // Another session does not have it.
  const other = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const second = await other.newPage();
  watch(second);
  await second.goto(`${url}/?service=${encodeURIComponent(service)}`);
  await second.waitForSelector(dialog, { timeout: 20000 });
  results.otherSessionAsked = true;
} catch (error) {
  errors.push(`${error.stack || error}`);
} finally {
  await browser.close();
}
results.errors = errors;
console.log(JSON.stringify(results));
