// The heatmap of individual profiles (POST /api/v1/heatmap): time on x, each profile's
// value on y in the server's log rows (four per doubling), each cell coloured by how many
// profiles it holds. Dragging selects a rectangle of cells; shift-dragging a second one
// compares the two. A selection is handed on as the server's own bounds (column times,
// row `min` and `max`), so the flame graph selects exactly the profiles counted.

import { formatValue } from './flamegraph.js';

const LEFT = 70;
const BOTTOM = 20;
const HEIGHT = 200;

export class Heatmap {
  constructor(canvas, { onSelect } = {}) {
    this.canvas = canvas;
    this.onSelect = onSelect || (() => {});
    this.data = null;
    this.unit = '';
    this.selections = [null, null];
    this.drag = null;
    canvas.addEventListener('mousedown', (event) => {
      const cell = this.cellAt(event);
      if (!cell) return;
      this.drag = { start: cell, end: cell, second: event.shiftKey };
    });
    canvas.addEventListener('mousemove', (event) => {
      if (!this.drag) return;
      const cell = this.cellAt(event, true);
      if (cell) { this.drag.end = cell; this.render(); }
    });
    window.addEventListener('mouseup', () => {
      if (!this.drag) return;
      const { start, end, second } = this.drag;
      this.drag = null;
      const cells = {
        c1: Math.min(start.column, end.column), c2: Math.max(start.column, end.column),
        r1: Math.min(start.row, end.row), r2: Math.max(start.row, end.row),
      };
      this.selections[second && this.selections[0] ? 1 : 0] = cells;
      if (!second) this.selections[1] = null;
      this.render();
      this.onSelect(this.selections.map((s) => (s ? this.rectangle(s) : null)));
    });
    new ResizeObserver(() => this.render()).observe(canvas.parentElement);
  }

  setData(data, unit) {
    this.data = data;
    this.unit = unit;
    this.counts = new Map((data.cells || []).map((cell) => [`${cell.column}:${cell.row}`, cell.count]));
    this.render();
  }

  /** Restores selections given as rectangles (from the URL), when they match cells. */
  select(rectangles) {
    this.selections = rectangles.map((r) => (r ? this.cellsOf(r) : null));
    this.render();
  }

  /** A selection's rectangle in the API's terms. */
  rectangle({ c1, c2, r1, r2 }) {
    const { from_ms: from, step_ms: step, rows } = this.data;
    const low = rows[r1] || {};
    const high = rows[r2] || {};
    return { from: from + c1 * step, until: from + (c2 + 1) * step, min_value: low.min ?? null, max_value: high.max ?? null };
  }

  cellsOf(rectangle) {
    if (!this.data || !this.data.rows.length) return null;
    const { from_ms: from, step_ms: step, rows } = this.data;
    const c1 = Math.round((rectangle.from - from) / step);
    const c2 = Math.round((rectangle.until - from) / step) - 1;
    const r1 = rows.findIndex((r) => (r.min ?? null) === rectangle.min_value);
    let r2 = rows.findIndex((r) => (r.max ?? null) === rectangle.max_value);
    if (r2 < 0 && rectangle.max_value === null) r2 = rows.length - 1;
    if (c2 < c1 || r1 < 0 || r2 < r1) return null;
    return { c1, c2, r1, r2 };
  }

  geometry() {
    const width = this.canvas.parentElement.clientWidth || 800;
    const rows = this.data ? this.data.rows.length : 0;
    const columns = this.data ? this.data.columns : 1;
    return { width, cellWidth: (width - LEFT) / columns, cellHeight: rows ? (HEIGHT - BOTTOM) / rows : 0, rows, columns };
  }

  cellAt(event, clamp = false) {
    if (!this.data || !this.data.rows.length) return null;
    const rect = this.canvas.getBoundingClientRect();
    const { cellWidth, cellHeight, rows, columns } = this.geometry();
    let column = Math.floor((event.clientX - rect.left - LEFT) / cellWidth);
    let row = rows - 1 - Math.floor((event.clientY - rect.top) / cellHeight);
    if (clamp) {
      column = Math.max(0, Math.min(columns - 1, column));
      row = Math.max(0, Math.min(rows - 1, row));
    }
    if (column < 0 || column >= columns || row < 0 || row >= rows) return null;
    return { column, row };
  }

  render() {
    const canvas = this.canvas;
    const { width, cellWidth, cellHeight, rows } = this.geometry();
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio;
    canvas.height = HEIGHT * ratio;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${HEIGHT}px`;
    const ctx = canvas.getContext('2d');
    ctx.scale(ratio, ratio);
    const style = getComputedStyle(document.body);
    const fg = style.color;
    const accent = style.getPropertyValue('--accent').trim() || '#c2410c';
    ctx.clearRect(0, 0, width, HEIGHT);
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = fg;
    if (!this.data || !rows) {
      ctx.fillText('no profiles in this range', LEFT, HEIGHT / 2);
      canvas.dataset.cells = '0';
      return;
    }
    const { rows: bounds, from_ms: from, step_ms: step, columns } = this.data;
    const rowIndex = new Map(bounds.map((r, i) => [r.row, i]));
    const most = Math.log1p(this.data.max_count || 1);
    ctx.fillStyle = accent;
    for (const cell of this.data.cells) {
      const r = rowIndex.get(cell.row);
      ctx.globalAlpha = 0.15 + 0.85 * (Math.log1p(cell.count) / most);
      ctx.fillRect(LEFT + cell.column * cellWidth, HEIGHT - BOTTOM - (r + 1) * cellHeight, Math.max(1, cellWidth - 1), Math.max(1, cellHeight - 1));
    }
    ctx.globalAlpha = 1;
    ctx.fillStyle = fg;
    // Value axis: a few row bounds; time axis: a few column starts.
    const labelEvery = Math.max(1, Math.ceil(rows / 6));
    for (let i = 0; i < rows; i += labelEvery) {
      const bound = bounds[i].min ?? 0;
      ctx.fillText(formatValue(bound, this.unit), 2, HEIGHT - BOTTOM - i * cellHeight - 2);
    }
    const timeEvery = Math.max(1, Math.ceil(columns / 6));
    for (let c = 0; c < columns; c += timeEvery) {
      const at = new Date(from + c * step);
      ctx.fillText(at.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' }), LEFT + c * cellWidth, HEIGHT - 5);
    }
    const outline = (s, colour, dashed) => {
      if (!s) return;
      ctx.strokeStyle = colour;
      ctx.lineWidth = 2;
      ctx.setLineDash(dashed ? [4, 3] : []);
      ctx.strokeRect(LEFT + s.c1 * cellWidth, HEIGHT - BOTTOM - (s.r2 + 1) * cellHeight, (s.c2 - s.c1 + 1) * cellWidth, (s.r2 - s.r1 + 1) * cellHeight);
    };
    outline(this.selections[0], fg, false);
    outline(this.selections[1], fg, true);
    if (this.drag) {
      const { start, end } = this.drag;
      outline({ c1: Math.min(start.column, end.column), c2: Math.max(start.column, end.column), r1: Math.min(start.row, end.row), r2: Math.max(start.row, end.row) }, accent, true);
    }
    canvas.dataset.cells = String(this.data.cells.length);
    canvas.dataset.profiles = String(this.data.profiles);
  }

  /** The cells inside a selection and the profiles they count (what the test checks). */
  countIn(s) {
    let profiles = 0;
    for (const cell of this.data.cells) {
      const r = this.data.rows.findIndex((row) => row.row === cell.row);
      if (cell.column >= s.c1 && cell.column <= s.c2 && r >= s.r1 && r <= s.r2) profiles += cell.count;
    }
    return profiles;
  }
}
