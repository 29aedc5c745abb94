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
