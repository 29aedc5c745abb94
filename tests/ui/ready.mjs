// Shared by the UI scripts: waits for the page's own signal that it has drawn.

/** Waits until a refresh after generation `after` has drawn and none started since: a
 * field's native change event on blur (when a test fills the next one) starts a refresh
 * of its own, which can finish before the one the test asked for. Returns the drawn
 * generation, to wait past next time. */
export async function ready(page, after = 0) {
  await page.waitForFunction((n) => {
    const done = Number(document.body.dataset.ready || 0);
    return done > n && done >= Number(document.body.dataset.requested || 0);
  }, after, { timeout: 20000 });
  return Number(await page.evaluate(() => document.body.dataset.ready));
}

/** Debian's Chromium (or `$KILN_CHROMIUM`), headless, as every script launches it. */
export async function launch(chromium) {
  return chromium.launch({
    executablePath: process.env.KILN_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu'],
  });
}

/** A page whose uncaught errors and console errors are pushed onto `errors`. */
export async function watchedPage(browser, errors) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on('pageerror', (error) => errors.push(`page error: ${error.message}`));
  page.on('console', (message) => { if (message.type() === 'error') errors.push(`console: ${message.text()}`); });
  return page;
}
