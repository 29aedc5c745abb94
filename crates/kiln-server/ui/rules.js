// The recording rules page: write a rule, preview the series it would export over the
// last hour (the server computes it from stored profiles exactly as the exporter will),
// save it. Rules from the config file are listed read-only.

import { apiFetch } from './api.js';

const $ = (id) => document.getElementById(id);
const API = '/api/v1/recording-rules';
let editing = null; // name of the API rule being edited, or null for a new one
let plot = null;

function status(kind, message) {
  $('status').className = kind;
  $('status').textContent = message;
}

async function request(method, path, body) {
  const response = await apiFetch(path, {
    method,
    headers: body ? { 'Content-Type': 'application/json' } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  if (!response.ok) throw new Error(text.trim() || `HTTP ${response.status}`);
  return text ? JSON.parse(text) : null;
}

function list(text) {
  return text.split(',').map((item) => item.trim()).filter(Boolean);
}

// The form as a rule: the API's JSON shape (the config file's keys).
function ruleFromForm() {
  const rule = {
    metric_name: $('metric_name').value.trim(),
    profile_type: $('profile_type').value,
    matchers: $('matchers').value.trim(),
    group_by: list($('group_by').value),
  };
  const fn = $('function_name').value.trim();
  if (fn) rule.function_name = fn;
  const external = {};
  for (const pair of list($('external_labels').value)) {
    const at = pair.indexOf('=');
    if (at > 0) external[pair.slice(0, at).trim()] = pair.slice(at + 1).trim().replace(/^"|"$/g, '');
  }
  if (Object.keys(external).length) rule.external_labels = external;
  return rule;
}

function fillForm(rule) {
  $('metric_name').value = rule.metric_name || '';
  if (rule.profile_type && ![...$('profile_type').options].some((o) => o.value === rule.profile_type)) {
    $('profile_type').add(new Option(rule.profile_type, rule.profile_type));
  }
  $('profile_type').value = rule.profile_type || $('profile_type').value;
  $('matchers').value = rule.matchers || '';
  $('group_by').value = (rule.group_by || []).join(', ');
  $('function_name').value = rule.function_name || '';
  $('external_labels').value = Object.entries(rule.external_labels || {}).map(([k, v]) => `${k}=${v}`).join(', ');
  $('metric_name').disabled = editing !== null;
  $('form-title').textContent = editing ? `edit ${editing}` : 'new rule';
}

async function loadTypes() {
  const now = Date.now();
  const answer = await apiFetch('/querier.v1.QuerierService/ProfileTypes', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ start: String(now - 7 * 86400e3), end: String(now) }),
  }).then((r) => (r.ok ? r.json() : {})).catch(() => ({}));
  const ids = (answer.profileTypes || []).map((t) => t.ID || t.id).filter(Boolean);
  if (!ids.includes('process_cpu:cpu:nanoseconds:cpu:nanoseconds')) ids.unshift('process_cpu:cpu:nanoseconds:cpu:nanoseconds');
  $('profile_type').replaceChildren(...ids.sort().map((id) => new Option(id, id)));
  $('profile_type').value = 'process_cpu:cpu:nanoseconds:cpu:nanoseconds';
}

// A value in the profile type's unit, for people: CPU time in seconds, bytes in MiB.
function human(value, unit) {
  if (unit === 'nanoseconds') return `${(value / 1e9).toLocaleString(undefined, { maximumFractionDigits: 3 })} s`;
  if (unit === 'bytes') return `${(value / 1048576).toLocaleString(undefined, { maximumFractionDigits: 2 })} MiB`;
  return value.toLocaleString();
}

function labelsText(labels) {
  const name = labels.__name__ || '';
  const rest = Object.entries(labels).filter(([k]) => k !== '__name__').map(([k, v]) => `${k}="${v}"`);
  return `${name}{${rest.join(', ')}}`;
}

async function preview() {
  const rule = ruleFromForm();
  const unit = rule.profile_type.split(':')[2] || '';
  status('loading', 'computing the preview from stored profiles…');
  try {
    const answer = await request('POST', `${API}/preview?from=now-1h&until=now`, rule);
    const series = answer.series || [];
    $('preview-section').hidden = false;
    // Every step of the hour, so gaps show as gaps.
    const step = answer.step_ms;
    const first = Math.floor(answer.from_ms / step) * step;
    const xs = [];
    for (let t = first; t < answer.until_ms; t += step) xs.push(t / 1000);
    const data = [xs, ...series.map((s) => {
      const byTime = new Map(s.points.map(([t, v]) => [t / 1000, v]));
      return xs.map((x) => (byTime.has(x) ? byTime.get(x) : null));
    })];
    const rows = series.map((s) => {
      const total = s.points.reduce((sum, [, v]) => sum + v, 0);
      const tr = document.createElement('tr');
      tr.innerHTML = '<td class="name"></td><td class="num"></td><td class="num total"></td>';
      tr.children[0].textContent = labelsText(s.labels);
      tr.children[1].textContent = String(s.points.length);
      tr.children[2].textContent = human(total, unit);
      tr.children[2].title = String(total);
      return tr;
    });
    $('preview-series').tBodies[0].replaceChildren(...rows);
    const grand = series.reduce((sum, s) => sum + s.points.reduce((a, [, v]) => a + v, 0), 0);
    $('preview-summary').textContent = `${series.length} series, total ${human(grand, unit)} (${grand} ${unit}) in steps of ${step / 1000} s`;
    $('preview-section').dataset.series = String(series.length);
    $('preview-section').dataset.total = String(grand);
    if (plot) plot.destroy();
    const width = Math.max(320, $('preview-chart').clientWidth || 800);
    plot = new uPlot({
      width, height: 200,
      scales: { x: { time: true } },
      series: [{}, ...series.map((s, i) => ({
        label: labelsText(s.labels),
        stroke: `hsl(${(i * 67) % 360} 70% 45%)`,
        spanGaps: false,
        points: { show: true, size: 6 },
        value: (u, v) => (v == null ? '–' : human(v, unit)),
      }))],
      axes: [{}, { size: 90, values: (u, values) => values.map((v) => human(v, unit)) }],
    }, data, $('preview-chart'));
    status(series.length ? '' : 'empty', series.length ? '' : 'no stored profile of the last hour matches this rule');
  } catch (error) {
    status('error', String(error.message || error));
  }
  document.body.dataset.previewed = String(Number(document.body.dataset.previewed || 0) + 1);
}

async function save(event) {
  event.preventDefault();
  const rule = ruleFromForm();
  try {
    if (editing) await request('PUT', `${API}/${encodeURIComponent(editing)}`, rule);
    else await request('POST', API, rule);
    status('', '');
    status('empty', `saved ${rule.metric_name}: exported from now on (kiln rules backfill exports stored data)`);
    editing = null;
    fillForm({ profile_type: rule.profile_type });
    await loadRules();
  } catch (error) {
    status('error', String(error.message || error));
  }
  document.body.dataset.saved = String(Number(document.body.dataset.saved || 0) + 1);
}

async function loadRules() {
  const answer = await request('GET', API);
  const rows = (answer.rules || []).map((rule) => {
    const tr = document.createElement('tr');
    const cells = [rule.metric_name, rule.profile_type, rule.matchers, (rule.group_by || []).join(', '),
      rule.function_name || '', rule.source, new Date(rule.live_from_ms).toLocaleString()];
    for (const text of cells) {
      const td = document.createElement('td');
      td.textContent = text;
      tr.append(td);
    }
    const actions = document.createElement('td');
    if (rule.source === 'api') {
      const edit = document.createElement('button');
      edit.textContent = 'edit';
      edit.addEventListener('click', () => { editing = rule.metric_name; fillForm(rule); });
      const remove = document.createElement('button');
      remove.textContent = 'delete';
      remove.addEventListener('click', async () => {
        try { await request('DELETE', `${API}/${encodeURIComponent(rule.metric_name)}`); await loadRules(); } catch (error) { status('error', String(error.message || error)); }
      });
      actions.append(edit, ' ', remove);
    } else {
      actions.textContent = 'config file';
    }
    tr.append(actions);
    tr.dataset.name = rule.metric_name;
    return tr;
  });
  $('rules').tBodies[0].replaceChildren(...rows);
}

$('preview').addEventListener('click', preview);
$('rule-form').addEventListener('submit', save);
$('new-rule').addEventListener('click', () => { editing = null; fillForm({ profile_type: $('profile_type').value }); });
try {
  await loadTypes();
  await loadRules();
} catch (error) {
  status('error', String(error.message || error));
}
document.body.dataset.ready = '1';
