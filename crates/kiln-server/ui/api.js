// Every call the UI makes to the server goes through apiFetch: with auth on, a 401 opens a
// dialog asking for a token (`kiln auth new-token … --scopes read`), which is kept in
// sessionStorage (this tab only, gone when it closes) and sent as `Authorization: Bearer`
// on every call from then on. `X-Requested-With` tells the server not to add its Basic
// challenge, which would make the browser show its own login box first.

const KEY = 'kiln-token';

function headersWithToken(headers) {
  const merged = new Headers(headers || {});
  merged.set('X-Requested-With', 'kiln-ui');
  const token = sessionStorage.getItem(KEY);
  if (token) merged.set('Authorization', `Bearer ${token}`);
  return merged;
}

let asking = null;

/** Asks for a token once at a time, however many calls were refused at once; resolves
 * true when one was given, false when the user cancelled. */
function askForToken(message) {
  if (asking) return asking;
  asking = new Promise((resolve) => {
    const dialog = document.createElement('dialog');
    dialog.dataset.testid = 'token-dialog';
    dialog.setAttribute('aria-labelledby', 'token-title');
    dialog.innerHTML = `<form method="dialog">
      <h2 id="token-title">Token required</h2>
      <p class="token-message"></p>
      <label for="token-input">Token</label>
      <input id="token-input" type="password" autocomplete="off" required>
      <p class="hint">Kept for this tab only. An admin makes one with
        <code>kiln auth new-token --tenant … --scopes read --name …</code>.</p>
      <menu><button type="button" class="cancel">Cancel</button> <button value="ok">Use token</button></menu>
    </form>`;
    dialog.querySelector('.token-message').textContent = message;
    // Enter submits with "Use token"; Cancel is no submit button, so Enter never picks it.
    dialog.querySelector('.cancel').addEventListener('click', () => dialog.close('cancel'));
    document.body.append(dialog);
    dialog.addEventListener('close', () => {
      const token = dialog.querySelector('input').value.trim();
      const given = dialog.returnValue === 'ok' && token !== '';
      if (given) sessionStorage.setItem(KEY, token);
      dialog.remove();
      asking = null;
      resolve(given);
    });
    dialog.showModal();
  });
  return asking;
}

/** The JSON a call answers; otherwise an error naming `what`, the status and the
 * server's message (its `message` field when the body is JSON). With `body`, a POST. */
export async function fetchJson(path, body, what = path) {
  const options = body === undefined ? {} : {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  };
  const response = await apiFetch(path, options);
  const text = await response.text();
  if (!response.ok) {
    let message = text;
    try { message = JSON.parse(text).message || text; } catch { /* plain text */ }
    throw new Error(`${what} failed (HTTP ${response.status}): ${message}`);
  }
  return text ? JSON.parse(text) : {};
}

/** fetch(), with the tab's token; on 401 asks for one and tries again. */
export async function apiFetch(path, options = {}) {
  for (;;) {
    const response = await fetch(path, { ...options, headers: headersWithToken(options.headers) });
    if (response.status !== 401) return response;
    let text = (await response.text()).trim();
    try { text = JSON.parse(text).message || text; } catch { /* plain text */ }
    sessionStorage.removeItem(KEY);
    const given = await askForToken(text || 'The server needs a token.');
    if (!given) throw new Error(`authentication required (HTTP 401): ${text}`);
  }
}
