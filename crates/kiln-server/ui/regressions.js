// The regressions page: what the version watcher found, newest first, each with a link to
// the comparison in the explore view.

import { apiFetch } from './api.js';

const $ = (id) => document.getElementById(id);

function status(kind, message) {
  $('status').className = kind;
  $('status').textContent = message;
}

const percent = (share) => `${(share * 100).toFixed(2)} %`;

/** The explore view comparing the two versions over the windows the watcher compared. */
function compareLink(finding) {
  const quote = (value) => `"${value.replace(/["\\]/g, '\\$&')}"`;
  const params = new URLSearchParams({
    service: finding.service,
    type: finding.profile_type,
    mode: 'compare',
    from: String(Math.min(finding.left.from, finding.right.from)),
    until: String(Math.max(finding.left.until, finding.right.until)),
    lfrom: String(finding.left.from),
    luntil: String(finding.left.until),
    rfrom: String(finding.right.from),
    runtil: String(finding.right.until),
    lsel: `${finding.version_label}=${quote(finding.old_version)}`,
    rsel: `${finding.version_label}=${quote(finding.new_version)}`,
    focus: finding.function,
  });
  return `/?${params}`;
}

async function load() {
  const params = new URLSearchParams(location.search);
  const service = params.get('service') || '';
  const since = params.get('since') || 'now-7d';
  $('service').value = service;
  $('since').value = since;
  $('explore-link').href = service ? `/?service=${encodeURIComponent(service)}` : '/';
  const query = new URLSearchParams({ since });
  if (service) query.set('service', service);
  status('loading', 'loading…');
  try {
    const response = await apiFetch(`/api/v1/regressions?${query}`);
    const text = await response.text();
    if (!response.ok) throw new Error(text.trim() || `HTTP ${response.status}`);
    const findings = JSON.parse(text).regressions || [];
    $('regressions').tBodies[0].replaceChildren(...findings.map((finding) => {
      const tr = document.createElement('tr');
      tr.className = finding.change;
      const cells = [
        new Date(finding.detected_at).toLocaleString(),
        finding.service,
        finding.profile_type.split(':').slice(0, 2).join(':'),
        `${finding.old_version} → ${finding.new_version}`,
        finding.function,
        percent(finding.left_share),
        percent(finding.right_share),
        `${finding.delta_share > 0 ? '+' : ''}${(finding.delta_share * 100).toFixed(2)}`,
        `${(finding.confidence * 100).toFixed(3)} %`,
      ];
      cells.forEach((text, i) => {
        const td = document.createElement('td');
        td.textContent = text;
        if (i >= 5) td.className = 'num';
        if (i === 4) td.className = 'name';
        tr.appendChild(td);
      });
      const link = document.createElement('a');
      link.href = compareLink(finding);
      link.textContent = 'compare';
      const td = document.createElement('td');
      td.appendChild(link);
      tr.appendChild(td);
      return tr;
    }));
    status(findings.length ? '' : 'empty', findings.length ? '' : `No significant change found after a deploy${service ? ` of ${service}` : ''} since ${since}.`);
  } catch (error) {
    status('error', error.message);
  }
  document.body.dataset.ready = 'true';
}

function navigate() {
  const params = new URLSearchParams();
  if ($('service').value.trim()) params.set('service', $('service').value.trim());
  params.set('since', $('since').value);
  history.pushState(null, '', `/regressions?${params}`);
  load();
}

$('service').addEventListener('change', navigate);
$('since').addEventListener('change', navigate);
window.addEventListener('popstate', load);
load();
