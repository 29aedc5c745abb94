// The service overview, the home page: every service of the tenant from one call
// (GET /api/v1/overview), each with a sparkline of its main profile type, its top three
// functions and its change against the previous period of equal length. Rows are built
// as one HTML string (names escaped), so 500 services draw in one layout pass.

import { fetchJson } from './api.js';
import { escapeHtml as escape, formatValue } from './flamegraph.js';

/** The overview of `[from, until]` (epoch ms), narrowed by a label selector. */
export async function fetchOverview(from, until, selector) {
  const params = new URLSearchParams({ from: String(from), until: String(until), points: '40' });
  if (selector) params.set('selector', selector);
  return fetchJson(`/api/v1/overview?${params}`, undefined, 'overview');
}

function sparkline(points) {
  const width = 160;
  const height = 28;
  const max = Math.max(1, ...points);
  const step = points.length > 1 ? width / (points.length - 1) : width;
  const coordinates = points.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`).join(' ');
  return `<svg class="spark" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" aria-hidden="true"><polyline points="${coordinates}"/></svg>`;
}

/** `+12.5 %`, `−40 %`, or `new` for a service absent from the previous period. */
export function formatChange(change) {
  if (change === null || change === undefined) return 'new';
  const percent = change * 100;
  const digits = Math.abs(percent) < 10 ? 1 : 0;
  return `${percent > 0 ? '+' : percent < 0 ? '−' : '±'}${Math.abs(percent).toFixed(digits)} %`;
}

const SORTS = {
  change: (s) => (s.change === null ? Infinity : Math.abs(s.change)),
  service: (s) => s.service,
  total: (s) => s.total,
};

/** Draws the overview into `table` (a <table> with a thead of data-sort headers),
 * sorted by `sort` ({key, descending}); returns the order drawn. */
export function renderOverview(table, overview, sort) {
  const services = [...(overview.services || [])];
  const key = SORTS[sort.key] || SORTS.change;
  services.sort((a, b) => {
    const av = key(a);
    const bv = key(b);
    const order = av < bv ? -1 : av > bv ? 1 : 0;
    // Ties by name, A to Z, whichever way the column sorts.
    return (sort.descending ? -order : order) || a.service.localeCompare(b.service);
  });
  for (const th of table.querySelectorAll('th[data-sort]')) {
    th.setAttribute('aria-sort', th.dataset.sort === sort.key ? (sort.descending ? 'descending' : 'ascending') : 'none');
  }
  const rows = services.map((s) => {
    const unit = s.profile_type.split(':')[2] || '';
    const type = s.profile_type.split(':').slice(0, 2).join(' ');
    const grew = s.change === null ? 'new' : s.change > 0.05 ? 'up' : s.change < -0.05 ? 'down' : '';
    const top = s.top.map((f) => `<li title="${escape(f.name)}">${escape(f.name)} <span class="muted">${s.total ? ((f.self_value / s.total) * 100).toFixed(1) : '0'} %</span></li>`).join('');
    return `<tr tabindex="0" data-service="${escape(s.service)}" data-type="${escape(s.profile_type)}">`
      + `<td class="name"><a tabindex="-1" href="?service=${encodeURIComponent(s.service)}&amp;type=${encodeURIComponent(s.profile_type)}">${escape(s.service)}</a><br><span class="muted">${escape(type)}</span></td>`
      + `<td>${sparkline(s.points)}</td>`
      + `<td class="num">${escape(formatValue(s.total, unit))}</td>`
      + `<td class="num change ${grew}" data-change="${s.change === null ? '' : s.change}">${formatChange(s.change)}</td>`
      + `<td><ol class="top3">${top}</ol></td></tr>`;
  });
  table.tBodies[0].innerHTML = rows.join('');
  return services.map((s) => s.service);
}
