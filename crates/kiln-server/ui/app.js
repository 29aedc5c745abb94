// Kiln's web UI: explore a service's profiles over time, read the flame graph and the top
// table, compare two ranges. Every view is a URL: the whole state lives in the query
// string, so a shared link restores it. It calls the same querier API Grafana uses.

import { fetchJson } from './api.js';
import { FlameGraph, formatValue, sandwich, toSvg } from './flamegraph.js';
import { Heatmap } from './heatmap.js';
import { fetchOverview, renderOverview } from './overview.js';

const $ = (id) => document.getElementById(id);
const MAX_NODES = 65536;

// ---- state, kept in the URL ----

const DEFAULTS = { service: '', type: '', labels: '', from: 'now-1h', until: 'now', split: '',
  search: '', view: 'both', focus: '', mode: '', lfrom: '', luntil: '', rfrom: '', runtil: '',
  fn: '', profile: '', callsite: '', lsel: '', rsel: '', hm: '', sel: '', sel2: '', osort: '' };
const state = { ...DEFAULTS };

function readUrl() {
  const params = new URLSearchParams(location.search);
  for (const key of Object.keys(DEFAULTS)) state[key] = params.get(key) ?? DEFAULTS[key];
}

function writeUrl(replace = false) {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) {
    if (value !== DEFAULTS[key] && value !== '') params.set(key, value);
  }
  const url = `${location.pathname}?${params}`;
  if (replace) history.replaceState(null, '', url); else history.pushState(null, '', url);
}

// ---- time ----

const UNITS = { s: 1e3, m: 60e3, h: 3600e3, d: 86400e3, w: 604800e3 };

/** `now`, `now-1h`, or epoch milliseconds, to epoch milliseconds. */
function toMillis(text, now = Date.now()) {
  const relative = /^now(?:-(\d+)([smhdw]))?$/.exec(text);
  if (relative) return relative[1] ? now - Number(relative[1]) * UNITS[relative[2]] : now;
  const number = Number(text);
  return Number.isFinite(number) ? number : now;
}

function toLocalInput(ms) {
  const date = new Date(ms);
  const pad = (n) => String(n).padStart(2, '0');
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

function fromLocalInput(text) {
  const ms = new Date(text).getTime();
  return Number.isFinite(ms) ? String(ms) : '';
}

function range() {
  const now = Date.now();
  return [toMillis(state.from, now), toMillis(state.until, now)];
}

// ---- API ----

let generation = 0;

function call(method, body) {
  return fetchJson(`/querier.v1.QuerierService/${method}`, body, method);
}

function selector(extra = state.labels) {
  const parts = [];
  if (state.service) parts.push(`service_name="${state.service.replace(/["\\]/g, '\\$&')}"`);
  if (extra.trim()) parts.push(extra.trim().replace(/^\{|\}$/g, ''));
  return `{${parts.join(', ')}}`;
}

function unit() {
  const parts = state.type.split(':');
  return parts[2] || '';
}

// ---- status ----

function status(kind, message) {
  const element = $('status');
  element.className = kind;
  element.textContent = message;
}

// ---- pickers ----

let profileTypes = [];

async function loadPickers() {
  const [start, end] = range();
  const windowStart = Math.min(start, end - 7 * UNITS.d);
  const [types, services] = await Promise.all([
    call('ProfileTypes', { start: String(windowStart), end: String(end) }),
    call('LabelValues', { name: 'service_name', start: String(windowStart), end: String(end) }),
  ]);
  profileTypes = types.profileTypes || [];
  const serviceNames = services.names || [];
  const serviceSelect = $('service');
  // No service picked is the overview of them all, the home page.
  serviceSelect.replaceChildren(new Option('all (overview)', ''), ...serviceNames.map((name) => new Option(name, name)));
  if (state.service && !serviceNames.includes(state.service)) serviceSelect.append(new Option(state.service, state.service));
  serviceSelect.value = state.service;
  const typeSelect = $('type');
  // process_wall is the server's sum of on- and off-CPU time (both profiled by the agent).
  typeSelect.replaceChildren(...profileTypes.map((type) => new Option(
    type.name === 'process_wall' ? `wall: on + off CPU (${type.sampleUnit})`
      : `${type.name} ${type.sampleType} (${type.sampleUnit})`, type.ID)));
  const ids = profileTypes.map((type) => type.ID);
  if (!state.type || !ids.includes(state.type)) {
    state.type = ids.find((id) => id.startsWith('process_cpu:cpu:')) || ids[0] || '';
  }
  typeSelect.value = state.type;
  await loadSplitLabels();
}

async function loadSplitLabels() {
  const [start, end] = range();
  const names = await call('LabelNames', { matchers: [selector('')], start: String(start), end: String(end) });
  const options = (names.names || []).filter((name) => !name.startsWith('__') && name !== 'service_name');
  $('split').replaceChildren(new Option('—', ''), ...options.map((name) => new Option(name, name)));
  $('split').value = options.includes(state.split) ? state.split : '';
}

// Label autocomplete: names, then values once a name and an operator are typed.
async function suggestLabels() {
  const input = $('labels');
  const text = input.value;
  const [start, end] = range();
  const valuePart = /(?:^|,\s*)([a-zA-Z_][\w.]*)\s*(=~|!=|!~|=)\s*"?([^",]*)$/.exec(text);
  let suggestions = [];
  try {
    if (valuePart) {
      const values = await call('LabelValues', { name: valuePart[1], matchers: [selector('')], start: String(start), end: String(end) });
      // The text up to the operator, then each value quoted.
      const head = text.slice(0, text.length - valuePart[3].length).replace(/"?$/, '"');
      suggestions = (values.names || []).map((value) => `${head}${value}"`);
    } else {
      const names = await call('LabelNames', { matchers: [selector('')], start: String(start), end: String(end) });
      const head = text.replace(/[a-zA-Z_][\w.]*$/, '');
      suggestions = (names.names || []).filter((name) => !name.startsWith('__'))
        .map((name) => `${head}${name}="`);
    }
  } catch (error) {
    status('error', error.message);
  }
  $('label-suggestions').replaceChildren(...suggestions.slice(0, 200).map((value) => new Option(value, value)));
}

// ---- timeline ----

let plot = null;

function drawTimeline(seriesList, start, end, step) {
  const container = $('timeline');
  // Every step of the range, so gaps read as zero rather than as a line across them.
  const stepMs = step * 1000;
  const filled = [];
  for (let t = Math.floor(start / stepMs) * stepMs; t <= end && filled.length < 2000; t += stepMs) filled.push(t);
  const stamps = [...new Set([...filled, ...seriesList.flatMap((s) => (s.points || []).map((p) => Number(p.timestamp)))])].sort((a, b) => a - b);
  const index = new Map(stamps.map((t, i) => [t, i]));
  const data = [stamps.map((t) => t / 1000)];
  const series = [{}];
  const palette = ['#c2410c', '#2563eb', '#16a34a', '#9333ea', '#ca8a04', '#0891b2', '#db2777', '#65a30d'];
  seriesList.forEach((s, n) => {
    const values = new Array(stamps.length).fill(0);
    for (const point of s.points || []) values[index.get(Number(point.timestamp))] = Number(point.value);
    data.push(values);
    const label = (s.labels || []).filter((l) => l.name === state.split).map((l) => l.value).join(',') || 'total';
    series.push({ label, stroke: palette[n % palette.length], fill: seriesList.length === 1 ? `${palette[0]}33` : undefined,
      value: (_, v) => (v == null ? '—' : formatValue(v, unit())) });
  });
  if (plot) { plot.destroy(); plot = null; }
  const width = container.clientWidth || 800;
  plot = new uPlot({
    width, height: 180, series,
    // The whole queried range, not just the span of the points, so a drag maps to it.
    scales: { x: { time: true, range: () => [start / 1000, end / 1000] } },
    axes: [{ stroke: getComputedStyle(document.body).color },
      { stroke: getComputedStyle(document.body).color, size: 84, values: (_, ticks) => ticks.map((v) => formatValue(v, unit())) }],
    cursor: { drag: { x: true, y: false, setScale: false } },
    hooks: { setSelect: [(u) => {
      if (u.select.width < 3) return;
      const min = u.posToVal(u.select.left, 'x');
      const max = u.posToVal(u.select.left + u.select.width, 'x');
      u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
      state.from = String(Math.floor(min * 1000));
      state.until = String(Math.ceil(max * 1000));
      writeUrl();
      syncControls();
      refresh();
    }] },
  }, data, container);
  plot.over.addEventListener('click', () => {
    const index = plot.cursor.idx;
    if (index == null) return;
    // The nearest point with data, within a few steps of the click.
    const nonZero = (i) => i >= 0 && i < stamps.length && data.slice(1).some((values) => values[i]);
    for (let distance = 0; distance <= 5; distance++) {
      for (const i of [index - distance, index + distance]) {
        if (nonZero(i)) { listProfiles(stamps[i], stepMs); return; }
      }
    }
  });
  container.dataset.points = String(seriesList.reduce((n, s) => n + (s.points || []).length, 0));
  container.dataset.total = String(data.slice(1).flat().reduce((sum, v) => sum + (v || 0), 0));
}

// ---- flame graph and table ----

const flame = new FlameGraph($('flamegraph'), $('tooltip'), { onZoom: (path) => {
  renderBreadcrumbs(path);
  const focus = path.length > 1 ? path[path.length - 1].name : '';
  if (focus !== state.focus) { state.focus = focus; writeUrl(true); }
} });

function renderBreadcrumbs(path) {
  $('focus-full').hidden = path.length < 2;
  $('focus-clear').hidden = !state.callsite;
  const nav = $('breadcrumbs');
  nav.replaceChildren(...path.map((node) => {
    const button = document.createElement('button');
    button.textContent = node.name;
    button.title = node.name;
    button.addEventListener('click', () => flame.zoomTo(node.level, node.index));
    return button;
  }));
}

let tableSort = { key: 'self', descending: true };
let tableRows = [];

function renderTable() {
  const filter = $('table-filter').value.toLowerCase();
  const total = flame.total || 1;
  // Two heatmap rectangles are a comparison too.
  const diff = state.mode === 'compare' || Boolean(state.hm && state.sel && state.sel2);
  // With the server's ranking, a fifth column: how sure each change is.
  const ranked = diff && tableRows.some((row) => row.rank !== undefined);
  const headers = diff ? ['function', 'self before', 'self after', 'change (pp)', 'confidence'] : ['function', 'self', 'total', '%', ''];
  document.querySelectorAll('#top th').forEach((th, i) => { th.textContent = headers[i]; });
  document.querySelector('#top th[data-sort="confidence"]').hidden = !ranked;
  $('top').dataset.testid = diff ? 'compare' : 'top-table';
  const { key, descending } = tableSort;
  const value = (row) => {
    if (key === 'name') return row.name;
    if (key === 'rank') return row.rank ?? 0;
    if (key === 'confidence') return row.confidence ?? -1;
    if (key === 'share') return diff ? Math.abs(row.change) : row.self;
    return row[key];
  };
  const rows = tableRows
    .filter((row) => !filter || row.name.toLowerCase().includes(filter))
    .sort((a, b) => {
      const av = value(a);
      const bv = value(b);
      const order = av < bv ? -1 : av > bv ? 1 : 0;
      return descending ? -order : order;
    })
    .slice(0, 500);
  for (const th of document.querySelectorAll('#top th')) {
    th.setAttribute('aria-sort', th.dataset.sort === key ? (descending ? 'descending' : 'ascending') : 'none');
  }
  $('top').tBodies[0].replaceChildren(...rows.map((row) => {
    const tr = document.createElement('tr');
    tr.tabIndex = 0;
    if (row.name === flame.highlight) tr.classList.add('selected');
    if (row.significant) tr.classList.add('significant');
    const last = diff ? `${row.change > 0 ? '+' : ''}${row.change.toFixed(2)}` : `${((row.self / total) * 100).toFixed(2)} %`;
    const cells = [[row.name, 'name'], [formatValue(row.self, unit()), 'num'], [formatValue(row.total, unit()), 'num'], [last, 'num']];
    if (ranked) {
      const confidence = row.confidence === null ? '–' : `${(row.confidence * 100).toFixed(row.confidence > 0.999 ? 3 : 1)} %`;
      cells.push([row.significant ? `${confidence} ✓` : confidence, 'num']);
    }
    for (const [text, cls] of cells) {
      const td = document.createElement('td');
      td.className = cls;
      td.textContent = text;
      tr.appendChild(td);
    }
    const select = () => {
      flame.setHighlight(flame.highlight === row.name ? null : row.name);
      // In a comparison, a row is a lead to follow: the flame graph zooms to it.
      if (diff && flame.highlight === row.name) {
        flame.zoomToName(row.name);
        state.focus = row.name;
        renderBreadcrumbs(flame.path());
      }
      state.fn = row.name;
      writeUrl(true);
      renderTable();
      renderSandwich();
      showSearchResult(flame.matchedShare());
      showLines();
    };
    tr.addEventListener('click', select);
    tr.addEventListener('keydown', (event) => { if (event.key === 'Enter') select(); });
    return tr;
  }));
}

function showSearchResult(result) {
  $('search-result').textContent = result
    ? `matches ${formatValue(result.value, unit())} (${(result.share * 100).toFixed(2)} % of total)`
    : '';
}

// ---- queries ----

function mergeRequest(start, end, labels = state.labels) {
  const request = { profileTypeID: state.type, labelSelector: selector(labels), start: String(start), end: String(end), maxNodes: String(MAX_NODES) };
  if (state.profile) request.profileIdSelector = [state.profile];
  // "Focus on this function": only the stacks through this call path, queried whole
  // rather than cut to the largest nodes of the full graph.
  if (state.callsite) {
    try {
      request.stackTraceSelector = { callSite: JSON.parse(state.callsite).map((name) => ({ name })) };
    } catch { state.callsite = ''; }
  }
  return request;
}

/** The individual profiles behind one timeline point, as a list to open. */
async function listProfiles(timestamp, stepMs) {
  try {
    const answer = await call('SelectSeries', {
      profileTypeID: state.type, labelSelector: selector(), start: String(timestamp), end: String(timestamp + stepMs),
      step: stepMs / 1000, exemplarType: 'EXEMPLAR_TYPE_INDIVIDUAL',
    });
    const exemplars = (answer.series || []).flatMap((s) => (s.points || []).flatMap((p) => p.exemplars || []));
    $('profiles-title').textContent = `profiles at ${new Date(timestamp).toLocaleString()} (${exemplars.length})`;
    $('profiles').tBodies[0].replaceChildren(...exemplars.map((exemplar) => {
      const row = document.createElement('tr');
      row.dataset.profileId = exemplar.profileId;
      row.dataset.value = String(exemplar.value);
      const labels = (exemplar.labels || []).filter((l) => l.name !== 'service_name').map((l) => `${l.name}=${l.value}`).join(', ');
      const cells = [
        [new Date(Number(exemplar.timestamp)).toLocaleTimeString(), ''],
        [exemplar.profileId, 'mono'],
        [formatValue(Number(exemplar.value), unit()), 'num'],
        [labels, ''],
        [exemplar.spanId || '', 'mono'],
      ];
      for (const [text, cls] of cells) {
        const td = document.createElement('td');
        td.textContent = text;
        if (cls) td.className = cls;
        row.appendChild(td);
      }
      const actions = document.createElement('td');
      const open = document.createElement('button');
      open.textContent = 'open';
      open.className = 'open-profile';
      open.setAttribute('aria-label', `open profile ${exemplar.profileId}`);
      open.addEventListener('click', () => {
        state.profile = exemplar.profileId;
        state.from = String(timestamp - stepMs);
        state.until = String(timestamp + 2 * stepMs);
        writeUrl();
        refresh();
      });
      // profefe's API serves any stored profile by id, as a gzip pprof.
      const download = document.createElement('a');
      download.textContent = 'pprof';
      download.href = `/api/0/profiles/${encodeURIComponent(exemplar.profileId)}`;
      download.download = `${exemplar.profileId}.pb.gz`;
      download.setAttribute('aria-label', `download profile ${exemplar.profileId} as pprof`);
      actions.append(open, ' ', download);
      row.appendChild(actions);
      return row;
    }));
    $('profiles-section').hidden = false;
  } catch (error) {
    status('error', error.message);
  }
}

let callersGraph = null;
let calleesGraph = null;

function renderSandwich() {
  if (state.view !== 'sandwich') return;
  if (!callersGraph) {
    callersGraph = new FlameGraph($('callers'), $('callers-tooltip'));
    calleesGraph = new FlameGraph($('callees'), $('callees-tooltip'));
  }
  const name = state.fn || (tableRows.slice().sort((a, b) => b.self - a.self)[0] || {}).name || '';
  $('sandwich-title').textContent = name ? `callers (above: who calls ${name}) and callees (below: what it calls)` : 'pick a function in the table';
  const { callers, callees } = sandwich(flame, name);
  callersGraph.setData(callers, unit());
  calleesGraph.setData(callees, unit());
  document.body.dataset.sandwich = `${callers.total}:${callees.total}:${callers.levels.length}:${callees.levels.length}`;
}

// ---- service overview ----

let overviewData = null;

function overviewSort() {
  const [key, order] = (state.osort || 'change:desc').split(':');
  return { key, descending: order !== 'asc' };
}

function drawOverview() {
  const started = performance.now();
  const order = renderOverview($('overview'), overviewData, overviewSort());
  document.body.dataset.overviewMillis = (performance.now() - started).toFixed(1);
  $('overview').dataset.order = JSON.stringify(order);
  $('overview-summary').textContent = `${order.length} services, ${new Date(overviewData.from_ms).toLocaleString()} to ${new Date(overviewData.until_ms).toLocaleString()}, each against the ${formatDuration(overviewData.until_ms - overviewData.from_ms)} before`;
}

function formatDuration(ms) {
  for (const [size, name] of [[86400e3, 'd'], [3600e3, 'h'], [60e3, 'min']]) {
    if (ms >= size) return `${Math.round(ms / size)} ${name}`;
  }
  return `${Math.round(ms / 1000)} s`;
}

function openService(service, type) {
  state.service = service;
  if (type) state.type = type;
  state.focus = ''; state.sel = ''; state.sel2 = '';
  writeUrl();
  $('service').value = service;
  loadSplitLabels();
  linkRegressions();
  refresh();
}

async function refreshOverview(mine) {
  const [start, end] = range();
  status('loading', 'loading…');
  const started = performance.now();
  try {
    const data = await fetchOverview(start, end, state.labels.trim() ? `{${state.labels.trim().replace(/^\{|\}$/g, '')}}` : '');
    if (mine !== generation) return;
    overviewData = data;
    document.body.dataset.overviewFetchMillis = (performance.now() - started).toFixed(1);
    drawOverview();
    if (!data.services.length) {
      status('empty', `No profiles between ${new Date(start).toLocaleString()} and ${new Date(end).toLocaleString()}. Push some to ${location.origin} (Pyroscope SDKs, OTLP, pprof to /ingest), or widen the range.`);
    } else {
      status('', '');
    }
  } catch (error) {
    if (mine !== generation) return;
    status('error', error.message);
  }
  document.body.dataset.ready = String(mine);
}

// ---- heatmap ----

const heatmap = new Heatmap($('heatmap'), { onSelect: (rectangles) => {
  state.sel = encodeRectangle(rectangles[0]);
  state.sel2 = encodeRectangle(rectangles[1]);
  writeUrl();
  refresh();
} });

/** `from,until,min,max` (empty for an unbounded value). */
function encodeRectangle(r) {
  return r ? [r.from, r.until, r.min_value ?? '', r.max_value ?? ''].join(',') : '';
}

function decodeRectangle(text) {
  if (!text) return null;
  const [from, until, min, max] = text.split(',');
  const number = (v) => (v === '' || v === undefined ? null : Number(v));
  return { from: Number(from), until: Number(until), min_value: number(min), max_value: number(max) };
}

function rectangleSummary(answer) {
  const side = (s) => `${s.profiles} profiles, ${formatValue(s.total, unit())}`;
  return answer.right ? `selected: ${side(answer.left)} (solid) against ${side(answer.right)} (dashed)` : `selected: ${side(answer.left)}`;
}

// ---- source lines ----

async function showLines() {
  const name = state.fn;
  if (!name || state.mode === 'compare' || !state.service) { $('lines-section').hidden = true; return; }
  const [start, end] = range();
  try {
    const answer = await fetchJson('/api/v1/lines', { profile_type: state.type, selector: selector(), from: start, until: end, function: name });
    if (state.fn !== name) return;
    const numbered = answer.lines.filter((line) => line.line > 0);
    $('lines-title').textContent = `lines of ${name}`;
    $('lines-note').textContent = !numbered.length
      ? 'These profiles carry no line numbers for this function.'
      : answer.source_configured
        ? (answer.sources.length ? '' : 'No source text found for these files under the configured source.')
        : 'Source text is shown when the server is told where the code is (source.root or source.url_template); line numbers come from the profiles.';
    $('lines').tBodies[0].replaceChildren(...answer.lines.map((line) => {
      const row = document.createElement('tr');
      for (const [text, cls] of [[line.file, 'name'], [String(line.line), 'num'], [formatValue(line.self_value, unit()), 'num'], [formatValue(line.total_value, unit()), 'num']]) {
        const td = document.createElement('td');
        td.textContent = text;
        td.className = cls;
        row.appendChild(td);
      }
      return row;
    }));
    $('source').replaceChildren(...answer.sources.map((source) => sourceBlock(source, answer.lines)));
    $('lines-section').hidden = false;
    $('lines-section').dataset.lines = String(numbered.length);
  } catch (error) {
    status('error', error.message);
  }
}

/** The source around the lines that have values, each line with its self and total. */
function sourceBlock(source, lines) {
  const values = new Map(lines.filter((l) => l.file === source.file).map((l) => [l.line, l]));
  const wanted = new Set();
  for (const line of values.keys()) for (let n = line - 3; n <= line + 3; n++) wanted.add(n);
  const figure = document.createElement('figure');
  const caption = document.createElement('figcaption');
  caption.textContent = source.origin;
  const table = document.createElement('table');
  table.className = 'source';
  let previous = 0;
  for (let n = 1; n <= source.lines.length; n++) {
    if (!wanted.has(n)) continue;
    if (previous && n > previous + 1) {
      const gap = table.insertRow();
      gap.className = 'gap';
      gap.insertCell().colSpan = 4;
    }
    previous = n;
    const value = values.get(n);
    const row = table.insertRow();
    if (value) row.className = 'hot';
    const cells = [String(n), value ? formatValue(value.self_value, unit()) : '', value ? formatValue(value.total_value, unit()) : '', source.lines[n - 1]];
    cells.forEach((text, i) => {
      const td = row.insertCell();
      td.textContent = text;
      td.className = i < 3 ? 'num' : 'code';
    });
  }
  figure.append(caption, table);
  return figure;
}

async function refresh() {
  const mine = ++generation;
  // `requested` and `ready` let a test wait until the latest refresh has drawn: an input's
  // own change event on blur can start one more than the test asked for.
  document.body.dataset.requested = String(mine);
  syncControls();
  if (!state.service) {
    await refreshOverview(mine);
    return;
  }
  if (!state.type) {
    status('empty', `No profiles yet. Push some to ${location.origin} (Pyroscope SDKs, OTLP, pprof to /ingest) and reload.`);
    document.body.dataset.ready = String(mine);
    return;
  }
  const [start, end] = range();
  status('loading', 'loading…');
  const step = Math.max(1, Math.round((end - start) / 1000 / 240));
  try {
    const compare = state.mode === 'compare';
    const seriesRequest = call('SelectSeries', {
      profileTypeID: state.type, labelSelector: selector(), start: String(start), end: String(end), step,
      groupBy: state.split ? [state.split] : [],
    });
    // A heatmap selection replaces the range's flame graph with its own profiles'.
    const rectangle = !compare && state.hm ? decodeRectangle(state.sel) : null;
    const second = rectangle ? decodeRectangle(state.sel2) : null;
    const graphRequest = compare
      ? call('Diff', {
        left: mergeRequest(toMillis(state.lfrom), toMillis(state.luntil), state.lsel || state.labels),
        right: mergeRequest(toMillis(state.rfrom), toMillis(state.runtil), state.rsel || state.labels),
      })
      : rectangle
        ? fetchJson('/api/v1/heatmap/flamegraph', { profile_type: state.type, selector: selector(), rectangle, compare: second, max_nodes: MAX_NODES })
        : call('SelectMergeStacktraces', mergeRequest(start, end));
    const rankRequest = compare ? compareRanking() : Promise.resolve(null);
    const heatmapRequest = state.hm && !compare
      ? fetchJson('/api/v1/heatmap', { profile_type: state.type, selector: selector(), from: start, until: end, columns: 60 })
      : Promise.resolve(null);
    const [series, graph, ranking, cells] = await Promise.all([seriesRequest, graphRequest, rankRequest, heatmapRequest]);
    if (mine !== generation) return;
    drawTimeline(series.series || [], start, end, step);
    $('heatmap-pane').hidden = !cells;
    $('heatmap-clear').hidden = !rectangle;
    $('heatmap-summary').textContent = rectangle ? rectangleSummary(graph) : cells ? `${cells.profiles} profiles` : '';
    if (cells) {
      heatmap.setData(cells, unit());
      heatmap.select([rectangle, second]);
    }
    const diff = compare || Boolean(second);
    const flamegraph = graph.flamegraph || { names: [], levels: [], total: 0 };
    const started = performance.now();
    flame.setData(flamegraph, unit(), diff);
    document.body.dataset.flameMillis = (performance.now() - started).toFixed(1);
    document.body.dataset.flameTotal = String(flame.total);
    document.body.dataset.flameNodes = String(flame.nodeCount);
    document.body.dataset.diffSides = diff ? `${flame.leftTotal}:${flame.rightTotal}` : '';
    document.body.dataset.selection = rectangle ? JSON.stringify({ left: graph.left, right: graph.right || null }) : '';
    tableRows = compare ? (ranking ? rankedRows(ranking) : diffRows()) : second ? diffRows() : flame.functions();
    $('compare-summary').textContent = compare ? compareSummary(ranking) : '';
    renderTable();
    renderSandwich();
    showUnnamed(diff ? [] : flame.functions(), flame.total, flamegraph.unnamedBinaries || []);
    $('single').hidden = !state.profile;
    $('single-label').textContent = state.profile ? `one profile: ${state.profile}` : '';
    $('export-pprof').href = `/pyroscope/render?format=pprof&query=${encodeURIComponent(state.type + selector())}&from=${Math.floor(start / 1000)}&until=${Math.ceil(end / 1000)}`;
    if (state.focus) flame.zoomToName(state.focus);
    renderBreadcrumbs(flame.path());
    showSearchResult(state.search ? flame.setSearch(state.search) : null);
    showLines();
    if (!flame.total) {
      status('empty', `No data for ${selector()} (${state.type}) between ${new Date(start).toLocaleString()} and ${new Date(end).toLocaleString()}. Widen the range, or check that your agents push to ${location.origin}.`);
    } else {
      status('', '');
    }
    document.body.dataset.ready = String(mine);
  } catch (error) {
    if (mine !== generation) return;
    status('error', error.message);
    document.body.dataset.ready = String(mine);
  }
}

/** Frames the server could not name show as `binary+0xoffset` (docs/symbolization.md):
 * when they hold 1% of the samples or more, a notice says how much and of which binaries,
 * largest first, with the build ids the server gave for them (`unnamedBinaries`: what
 * their debug files are found by), and how to name them. */
function showUnnamed(rows, total, binaryIds) {
  const byBinary = new Map();
  let unnamed = 0;
  for (const row of rows) {
    const match = /^(.+)\+0x[0-9a-f]+$/.exec(row.name);
    const binary = match ? match[1] : /^0x[0-9a-f]+$/.test(row.name) ? 'no mapping' : null;
    if (!binary) continue;
    unnamed += row.self;
    byBinary.set(binary, (byBinary.get(binary) || 0) + row.self);
  }
  const share = total ? unnamed / total : 0;
  document.body.dataset.unnamedShare = share.toFixed(4);
  const notice = $('symbols-notice');
  if (share < 0.01) {
    notice.hidden = true;
    notice.textContent = '';
    return;
  }
  const ids = new Map();
  for (const { binary, buildId } of binaryIds) {
    if (buildId) ids.set(binary, [...(ids.get(binary) || []), buildId]);
  }
  const binaries = [...byBinary.entries()].sort((a, b) => b[1] - a[1]).map(([binary]) => binary);
  const shown = (binary) => (ids.has(binary) ? `${binary}, build id ${ids.get(binary).join(' or ')}` : binary);
  const named = binaries.slice(0, 5).map(shown).join('; ') + (binaries.length > 5 ? '; …' : '');
  const count = binaries.length === 1 ? '1 binary' : `${binaries.length} binaries`;
  notice.textContent = `${(100 * share).toFixed(1)}% of this profile's samples are in frames with no symbols: ${count} (${named}). `
    + 'Upload their debug info (kiln debuginfo upload FILE) or name a debuginfod server (symbolization.debuginfod_urls); the frames are named at once, no re-ingest needed.';
  notice.hidden = false;
}

/** The server's ranked comparison of the two sides (docs/insight.md); null when it
 * fails, and the table falls back to the diff's own changes. */
async function compareRanking() {
  const side = (labels, from, until) => ({ selector: selector(labels), from: toMillis(from), until: toMillis(until) });
  try {
    return await fetchJson('/api/v1/compare', {
      profile_type: state.type,
      left: side(state.lsel || state.labels, state.lfrom, state.luntil),
      right: side(state.rsel || state.labels, state.rfrom, state.runtil),
      limit: 0,
    });
  } catch (error) {
    return { error: error.message };
  }
}

function rankedRows(ranking) {
  if (!ranking.functions) return diffRows();
  return ranking.functions.map((fn, rank) => ({
    name: fn.name, rank, self: fn.left_value, total: fn.right_value,
    change: fn.delta_share * 100, confidence: fn.confidence, significant: fn.significant,
  }));
}

function compareSummary(ranking) {
  if (!ranking) return '';
  if (ranking.error) return `ranking unavailable: ${ranking.error}`;
  const sides = `before: ${ranking.left.profiles} profiles, after: ${ranking.right.profiles} profiles.`;
  if (ranking.refused) return `${sides} ${ranking.refused}.`;
  const m = ranking.method;
  return `${sides} ${ranking.significant} of ${m.tested} functions changed significantly (${m.test}, ${m.correction} correction, family-wise α = ${m.alpha}); most important first.`;
}

/** The biggest changes of a diff, as table rows: self before and after, and the change of
 * the function's share of each side's total, in percentage points. */
function diffRows() {
  const rows = new Map();
  flame.levels.forEach((level) => {
    for (let i = 0; i < level.x.length; i++) {
      const name = flame.names[level.name[i]];
      const right = level.rightSelf[i];
      const left = level.self[i] - right;
      const row = rows.get(name) || { name, left: 0, right: 0 };
      row.left += left;
      row.right += right;
      rows.set(name, row);
    }
  });
  const lt = flame.leftTotal || 1;
  const rt = flame.rightTotal || 1;
  return [...rows.values()]
    .map((row) => ({ ...row, self: row.left, total: row.right, change: (row.right / rt - row.left / lt) * 100 }))
    .filter((row) => row.left || row.right);
}

// ---- controls ----

function syncControls() {
  const [start, end] = range();
  $('from').value = toLocalInput(start);
  $('until').value = toLocalInput(end);
  $('labels').value = state.labels;
  $('search').value = state.search;
  $('view').value = state.view;
  const overview = !state.service;
  document.body.dataset.view = overview ? 'overview' : 'explore';
  $('overview-section').hidden = !overview;
  $('explore').hidden = overview;
  $('overview-link').toggleAttribute('aria-current', overview);
  if (overview) $('overview-link').setAttribute('aria-current', 'page');
  $('explore-link').toggleAttribute('aria-current', !overview);
  if (!overview) $('explore-link').setAttribute('aria-current', 'page');
  $('explore-link').href = `/?service=${encodeURIComponent(state.service || ($('service').options[1] || {}).value || '')}`;
  $('type').disabled = overview;
  $('compare-toggle').disabled = overview;
  $('heatmap-toggle').setAttribute('aria-pressed', String(Boolean(state.hm)));
  $('panes').className = state.view === 'both' ? '' : state.view;
  for (const button of document.querySelectorAll('[data-range]')) {
    button.classList.toggle('active', state.from === `now-${button.dataset.range}` && state.until === 'now');
  }
  const compare = state.mode === 'compare';
  $('compare-toggle').setAttribute('aria-pressed', String(compare));
  $('compare-section').hidden = !compare;
  if (compare) {
    $('left-from').value = toLocalInput(toMillis(state.lfrom));
    $('left-until').value = toLocalInput(toMillis(state.luntil));
    $('right-from').value = toLocalInput(toMillis(state.rfrom));
    $('right-until').value = toLocalInput(toMillis(state.runtil));
    $('left-labels').value = state.lsel;
    $('right-labels').value = state.rsel;
  }
}

function halves() {
  const [start, end] = range();
  const middle = Math.floor((start + end) / 2);
  state.lfrom = String(start); state.luntil = String(middle);
  state.rfrom = String(middle); state.runtil = String(end);
}

function bind() {
  const change = (update) => () => { update(); writeUrl(); refresh(); };
  $('service').addEventListener('change', change(() => {
    state.service = $('service').value; state.focus = ''; state.sel = ''; state.sel2 = ''; state.fn = '';
    if (state.service) loadSplitLabels();
  }));
  // The overview: a row opens its service; headers sort.
  const openRow = (event) => {
    const row = event.target.closest('tr[data-service]');
    if (!row) return;
    event.preventDefault();
    openService(row.dataset.service, row.dataset.type);
  };
  $('overview').tBodies[0].addEventListener('click', openRow);
  $('overview').tBodies[0].addEventListener('keydown', (event) => { if (event.key === 'Enter') openRow(event); });
  for (const th of document.querySelectorAll('#overview th[data-sort]')) {
    const sort = () => {
      const current = overviewSort();
      const key = th.dataset.sort;
      const descending = current.key === key ? !current.descending : key !== 'service';
      state.osort = `${key}:${descending ? 'desc' : 'asc'}`;
      writeUrl(true);
      if (overviewData) drawOverview();
    };
    th.addEventListener('click', sort);
    th.addEventListener('keydown', (event) => { if (event.key === 'Enter') sort(); });
  }
  $('overview-link').addEventListener('click', (event) => {
    event.preventDefault();
    state.service = ''; state.fn = ''; state.sel = ''; state.sel2 = ''; state.profile = '';
    $('service').value = '';
    writeUrl();
    refresh();
  });
  $('heatmap-toggle').addEventListener('click', change(() => {
    state.hm = state.hm ? '' : '1';
    if (!state.hm) { state.sel = ''; state.sel2 = ''; }
  }));
  $('heatmap-clear').addEventListener('click', change(() => { state.sel = ''; state.sel2 = ''; }));
  $('lines-close').addEventListener('click', () => { state.fn = ''; writeUrl(true); $('lines-section').hidden = true; });
  // Escape closes what was opened last: the profile list, the lines, a heatmap selection.
  document.addEventListener('keydown', (event) => {
    if (event.key !== 'Escape' || event.target.closest('dialog')) return;
    if (!$('profiles-section').hidden) { $('profiles-section').hidden = true; return; }
    if (!$('lines-section').hidden) { $('lines-close').click(); return; }
    if (state.sel) $('heatmap-clear').click();
  });
  $('service').addEventListener('change', linkRegressions);
  $('type').addEventListener('change', change(() => { state.type = $('type').value; state.focus = ''; }));
  $('labels').addEventListener('change', change(() => { state.labels = $('labels').value; }));
  $('labels').addEventListener('input', () => suggestLabels());
  $('labels').addEventListener('focus', () => suggestLabels());
  $('split').addEventListener('change', change(() => { state.split = $('split').value; }));
  for (const button of document.querySelectorAll('[data-range]')) {
    button.addEventListener('click', change(() => { state.from = `now-${button.dataset.range}`; state.until = 'now'; }));
  }
  $('from').addEventListener('change', change(() => { state.from = fromLocalInput($('from').value) || state.from; }));
  $('until').addEventListener('change', change(() => { state.until = fromLocalInput($('until').value) || state.until; }));
  $('search').addEventListener('input', () => {
    state.search = $('search').value;
    flame.setHighlight(null);
    showSearchResult(flame.setSearch(state.search));
    writeUrl(true);
  });
  $('view').addEventListener('change', () => { state.view = $('view').value; syncControls(); writeUrl(true); flame.render(); renderSandwich(); });
  $('profiles-close').addEventListener('click', () => { $('profiles-section').hidden = true; });
  $('focus-full').addEventListener('click', change(() => {
    const path = flame.path().slice(1).map((node) => node.name);
    state.callsite = JSON.stringify(path);
    state.focus = path[path.length - 1] || '';
  }));
  $('focus-clear').addEventListener('click', change(() => { state.callsite = ''; }));
  $('single-close').addEventListener('click', () => { state.profile = ''; writeUrl(); refresh(); });
  const download = (name, blob) => {
    const link = document.createElement('a');
    link.href = URL.createObjectURL(blob);
    link.download = name;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 1000);
  };
  $('export-svg').addEventListener('click', () => download('flamegraph.svg', new Blob([toSvg(flame)], { type: 'image/svg+xml' })));
  $('export-png').addEventListener('click', () => $('flamegraph').toBlob((blob) => download('flamegraph.png', blob)));
  $('table-filter').addEventListener('input', renderTable);
  for (const th of document.querySelectorAll('#top th')) {
    const sort = () => {
      const key = th.dataset.sort;
      tableSort = { key, descending: tableSort.key === key ? !tableSort.descending : key !== 'name' };
      renderTable();
    };
    th.addEventListener('click', sort);
    th.addEventListener('keydown', (event) => { if (event.key === 'Enter') sort(); });
  }
  $('compare-toggle').addEventListener('click', change(() => {
    if (state.mode === 'compare') { state.mode = ''; tableSort = { key: 'self', descending: true }; return; }
    state.mode = 'compare';
    tableSort = { key: 'rank', descending: false };
    if (!state.lfrom) halves();
  }));
  $('compare-halves').addEventListener('click', change(halves));
  $('left-labels').addEventListener('change', change(() => { state.lsel = $('left-labels').value; }));
  $('right-labels').addEventListener('change', change(() => { state.rsel = $('right-labels').value; }));
  for (const [id, key] of [['left-from', 'lfrom'], ['left-until', 'luntil'], ['right-from', 'rfrom'], ['right-until', 'runtil']]) {
    $(id).addEventListener('change', change(() => { state[key] = fromLocalInput($(id).value) || state[key]; }));
  }
  $('share').addEventListener('click', async () => {
    // Sharing pins relative times to absolute ones, here and in the link, so the link
    // shows the same data later.
    const [start, end] = range();
    state.from = String(start);
    state.until = String(end);
    writeUrl();
    await refresh();
    const url = location.href;
    try { await navigator.clipboard.writeText(url); } catch { /* no clipboard: the title shows it */ }
    $('share').dataset.url = url;
    $('share').title = url;
  });
  window.addEventListener('popstate', () => { readUrl(); refresh(); });
  if (state.mode === 'compare') tableSort = { key: 'rank', descending: false };
  window.addEventListener('resize', () => { if (plot) plot.setSize({ width: $('timeline').clientWidth, height: 180 }); });
}

/** The regressions page, for the service in view. */
function linkRegressions() {
  $('regressions-link').href = state.service ? `/regressions?service=${encodeURIComponent(state.service)}` : '/regressions';
}

async function main() {
  readUrl();
  bind();
  syncControls();
  try {
    await loadPickers();
    linkRegressions();
  } catch (error) {
    status('error', error.message);
    return;
  }
  writeUrl(true);
  await refresh();
}

main();
