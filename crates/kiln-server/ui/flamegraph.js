// Kiln's flame graph: a canvas renderer over the querier's flame graph levels
// ([x offset delta, total, self, name index] per node, level by level).
//
// Written here rather than taken from a library: the flame graph components on npm either
// draw one DOM node per frame (too slow past ~10k nodes) or bring a framework; this one keeps
// every level in typed arrays, skips nodes narrower than a pixel, and draws 50k+ nodes in a
// few milliseconds (docs/ui.md has the figures).

const ROW = 18;
const FONT = '12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace';

/** The package or module of a frame name, which picks its colour. */
export function packageOf(name) {
  const paren = name.indexOf('(');
  const head = paren > 0 ? name.slice(0, paren) : name;
  for (const separator of ['::', '.', '/']) {
    const at = head.lastIndexOf(separator);
    if (at > 0) return head.slice(0, at);
  }
  return head;
}

function hash(text) {
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

/** Text made safe inside HTML or SVG markup and attribute values. */
export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

/** Formats a value in the profile's unit. */
export function formatValue(value, unit) {
  const scaled = (v, steps) => {
    for (const [size, suffix] of steps) {
      if (Math.abs(v) >= size) return `${(v / size).toFixed(2).replace(/\.?0+$/, '')} ${suffix}`;
    }
    return `${v}`;
  };
  switch (unit) {
    case 'nanoseconds':
      return scaled(value, [[3600e9, 'h'], [60e9, 'min'], [1e9, 's'], [1e6, 'ms'], [1e3, 'µs'], [1, 'ns']]);
    case 'bytes':
      return scaled(value, [[2 ** 40, 'TiB'], [2 ** 30, 'GiB'], [2 ** 20, 'MiB'], [2 ** 10, 'KiB'], [1, 'B']]);
    default:
      return scaled(value, [[1e9, 'G'], [1e6, 'M'], [1e3, 'k'], [1, '']]).trim();
  }
}

export class FlameGraph {
  constructor(canvas, tooltip, { onZoom } = {}) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.onZoom = onZoom || (() => {});
    this.levels = [];
    this.names = [];
    this.unit = '';
    this.total = 0;
    this.zoom = { level: 0, index: 0 };
    this.search = '';
    this.highlight = null;
    this.mode = 'single';
    canvas.addEventListener('mousemove', (event) => this.hover(event));
    canvas.addEventListener('mouseleave', () => { this.tooltip.hidden = true; });
    canvas.addEventListener('click', (event) => {
      const node = this.nodeAt(event);
      if (node) this.zoomTo(node.level, node.index);
    });
    new ResizeObserver(() => this.render()).observe(canvas.parentElement);
  }

  /** Loads a flame graph: `levels` of quadruples, or of 7-tuples for a diff. */
  setData(graph, unit, diff = false) {
    const width = diff ? 7 : 4;
    this.mode = diff ? 'diff' : 'single';
    this.names = graph.names || [];
    this.unit = unit;
    this.levels = (graph.levels || []).map((level) => {
      const values = (Array.isArray(level) ? level : level.values || []).map(Number);
      const count = Math.floor(values.length / width);
      const x = new Float64Array(count);
      const total = new Float64Array(count);
      const self = new Float64Array(count);
      const name = new Int32Array(count);
      const right = diff ? new Float64Array(count) : null;
      const rightSelf = diff ? new Float64Array(count) : null;
      let cursor = 0;
      for (let i = 0; i < count; i++) {
        const at = i * width;
        if (diff) {
          // left x, left total, left self, right x, right total, right self, name; the
          // node's width is the sum of both sides.
          cursor += values[at] + values[at + 3];
          x[i] = cursor;
          total[i] = values[at + 1] + values[at + 4];
          self[i] = values[at + 2] + values[at + 5];
          right[i] = values[at + 4];
          rightSelf[i] = values[at + 5];
          name[i] = values[at + 6];
        } else {
          cursor += values[at];
          x[i] = cursor;
          total[i] = values[at + 1];
          self[i] = values[at + 2];
          name[i] = values[at + 3];
        }
        cursor += total[i];
      }
      return { x, total, self, name, right, rightSelf, parent: new Int32Array(count) };
    });
    // Parents: nodes of a level are sorted by x, so one walk per level finds them.
    for (let l = 1; l < this.levels.length; l++) {
      const above = this.levels[l - 1];
      const level = this.levels[l];
      let p = 0;
      for (let i = 0; i < level.x.length; i++) {
        while (p + 1 < above.x.length && above.x[p] + above.total[p] <= level.x[i]) p++;
        level.parent[i] = p;
      }
    }
    this.total = this.levels.length ? this.levels[0].total[0] || 0 : 0;
    if (diff && this.levels.length) {
      this.rightTotal = this.levels[0].right[0];
      this.leftTotal = this.total - this.rightTotal;
    }
    this.nodeCount = this.levels.reduce((sum, level) => sum + level.x.length, 0);
    this.zoom = { level: 0, index: 0 };
    this.render();
  }

  /** Zooms so that node `index` of `level` spans the width. */
  zoomTo(level, index) {
    if (!this.levels[level] || index >= this.levels[level].x.length) return;
    this.zoom = { level, index };
    this.render();
    this.onZoom(this.path());
  }

  /** Zooms to the widest node of a function name (for restored views). */
  zoomToName(name) {
    const id = this.names.indexOf(name);
    if (id < 0) return false;
    let best = null;
    this.levels.forEach((level, l) => level.name.forEach((n, i) => {
      if (n === id && (!best || level.total[i] > this.levels[best.level].total[best.index])) best = { level: l, index: i };
    }));
    if (best) this.zoomTo(best.level, best.index);
    return !!best;
  }

  /** The zoomed node and its ancestors, root first: [{level, index, name}]. */
  path() {
    const path = [];
    let { level, index } = this.zoom;
    while (level >= 0 && this.levels[level]) {
      path.unshift({ level, index, name: this.names[this.levels[level].name[index]] });
      if (level === 0) break;
      index = this.levels[level].parent[index];
      level -= 1;
    }
    return path;
  }

  setSearch(text) {
    this.search = text || '';
    this.render();
    return this.matchedShare();
  }

  setHighlight(name) {
    this.highlight = name;
    this.render();
  }

  matches(nameId) {
    const name = this.names[nameId] || '';
    if (this.highlight !== null && this.highlight !== undefined) return name === this.highlight;
    if (!this.search) return false;
    return name.toLowerCase().includes(this.search.toLowerCase());
  }

  /** Total of the matched nodes that have no matched ancestor, and its share. */
  matchedShare() {
    if (!this.search && !this.highlight) return null;
    let sum = 0;
    let under = [];
    this.levels.forEach((level, l) => {
      const now = new Uint8Array(level.x.length);
      for (let i = 0; i < level.x.length; i++) {
        const inherited = l > 0 && under[level.parent[i]];
        if (inherited) { now[i] = 1; continue; }
        if (this.matches(level.name[i])) { now[i] = 1; sum += level.total[i]; }
      }
      under = now;
    });
    return { value: sum, share: this.total ? sum / this.total : 0 };
  }

  colour(nameId, level, i, dark) {
    const name = this.names[nameId] || '';
    if (this.mode === 'diff') {
      const right = level.right[i];
      const left = level.total[i] - right;
      // The change of this node's share of each side's total, red when it grew.
      const lt = this.leftTotal || 1;
      const rt = this.rightTotal || 1;
      const change = right / rt - left / lt;
      const strength = Math.min(1, Math.abs(change) * 8);
      if (Math.abs(change) < 1e-9) return dark ? 'hsl(0,0%,35%)' : 'hsl(0,0%,78%)';
      const hue = change > 0 ? 0 : 120;
      return `hsl(${hue}, ${40 + strength * 45}%, ${dark ? 45 - strength * 10 : 80 - strength * 30}%)`;
    }
    const h = hash(packageOf(name));
    const hue = h % 360;
    return `hsl(${hue}, ${dark ? 45 : 60}%, ${dark ? 38 : 72}%)`;
  }

  render() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.parentElement.clientWidth;
    const height = Math.max(ROW, this.levels.length * ROW);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    canvas.width = Math.max(1, Math.floor(width * ratio));
    canvas.height = Math.max(1, Math.floor(height * ratio));
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    if (!this.levels.length) return;
    const dark = window.matchMedia('(prefers-color-scheme: dark)').matches;
    const started = performance.now();
    const zoomLevel = this.levels[this.zoom.level];
    const x0 = zoomLevel.x[this.zoom.index];
    const span = zoomLevel.total[this.zoom.index] || 1;
    const scale = width / span;
    const searching = !!this.search || (this.highlight !== null && this.highlight !== undefined);
    ctx.font = FONT;
    ctx.textBaseline = 'middle';
    const charWidth = ctx.measureText('m').width;
    let drawn = 0;
    const ancestors = new Set(this.path().map((p) => `${p.level}:${p.index}`));
    this.levels.forEach((level, l) => {
      const y = l * ROW;
      for (let i = 0; i < level.x.length; i++) {
        let px, w;
        if (l < this.zoom.level) {
          if (!ancestors.has(`${l}:${i}`)) continue;
          px = 0; w = width;
        } else {
          const end = level.x[i] + level.total[i];
          if (end <= x0 || level.x[i] >= x0 + span) continue;
          px = (level.x[i] - x0) * scale;
          w = level.total[i] * scale;
          if (w < 0.5) continue;
        }
        drawn++;
        const matched = searching && this.matches(level.name[i]);
        ctx.fillStyle = searching && !matched
          ? (dark ? 'hsl(0,0%,22%)' : 'hsl(0,0%,88%)')
          : this.colour(level.name[i], level, i, dark);
        if (l < this.zoom.level) ctx.globalAlpha = 0.55;
        ctx.fillRect(px, y, Math.max(w - 0.5, 0.5), ROW - 1);
        ctx.globalAlpha = 1;
        if (matched) {
          ctx.strokeStyle = dark ? '#ffd54a' : '#8a5a00';
          ctx.lineWidth = 1.5;
          ctx.strokeRect(px + 0.75, y + 0.75, Math.max(w - 2, 0.5), ROW - 2.5);
        }
        if (w > charWidth * 3) {
          const name = this.names[level.name[i]] || '';
          const fits = Math.floor((w - 6) / charWidth);
          const label = name.length > fits ? `${name.slice(0, Math.max(0, fits - 1))}…` : name;
          ctx.fillStyle = dark ? '#eee' : '#111';
          ctx.fillText(label, px + 3, y + ROW / 2);
        }
      }
    });
    this.lastRender = { millis: performance.now() - started, drawn, nodes: this.nodeCount };
    this.canvas.dataset.rendered = String(drawn);
    this.canvas.dataset.renderMillis = this.lastRender.millis.toFixed(2);
  }

  nodeAt(event) {
    const rect = this.canvas.getBoundingClientRect();
    const mx = event.clientX - rect.left;
    const l = Math.floor((event.clientY - rect.top) / ROW);
    const level = this.levels[l];
    if (!level) return null;
    if (l < this.zoom.level) {
      const path = this.path();
      const node = path[l];
      return node ? { level: l, index: node.index } : null;
    }
    const zoomLevel = this.levels[this.zoom.level];
    const x0 = zoomLevel.x[this.zoom.index];
    const span = zoomLevel.total[this.zoom.index] || 1;
    const at = x0 + (mx / rect.width) * span;
    // binary search: last node starting at or before `at`
    let lo = 0;
    let hi = level.x.length - 1;
    let found = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (level.x[mid] <= at) { found = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    if (found < 0 || at >= level.x[found] + level.total[found]) return null;
    return { level: l, index: found };
  }

  hover(event) {
    const node = this.nodeAt(event);
    if (!node) { this.tooltip.hidden = true; return; }
    const level = this.levels[node.level];
    const name = this.names[level.name[node.index]];
    const total = level.total[node.index];
    const self = level.self[node.index];
    const pct = (v) => (this.total ? `${((v / this.total) * 100).toFixed(2)} %` : '');
    let text = `<strong></strong><br>total ${formatValue(total, this.unit)} (${pct(total)})`
      + `<br>self ${formatValue(self, this.unit)} (${pct(self)})`;
    if (this.mode === 'diff') {
      const right = level.right[node.index];
      const left = total - right;
      text = `<strong></strong><br>before ${formatValue(left, this.unit)}`
        + ` (${((left / (this.leftTotal || 1)) * 100).toFixed(2)} %)`
        + `<br>after ${formatValue(right, this.unit)}`
        + ` (${((right / (this.rightTotal || 1)) * 100).toFixed(2)} %)`;
    }
    this.tooltip.innerHTML = text;
    this.tooltip.querySelector('strong').textContent = name;
    this.tooltip.hidden = false;
    const box = this.canvas.parentElement.getBoundingClientRect();
    this.tooltip.style.left = `${Math.min(event.clientX - box.left + 12, box.width - 260)}px`;
    this.tooltip.style.top = `${event.clientY - box.top + 14}px`;
  }

  /** Per function: self, and total counted once per stack however deep it recurses. */
  functions() {
    const byName = new Map();
    const add = (id, field, v) => {
      let row = byName.get(id);
      if (!row) { row = { name: this.names[id], self: 0, total: 0 }; byName.set(id, row); }
      row[field] += v;
    };
    this.levels.forEach((level, l) => {
      for (let i = 0; i < level.x.length; i++) {
        const id = level.name[i];
        add(id, 'self', level.self[i]);
        let recursive = false;
        let pl = l - 1;
        let pi = level.parent[i];
        while (pl >= 0) {
          if (this.levels[pl].name[pi] === id) { recursive = true; break; }
          pi = this.levels[pl].parent[pi];
          pl -= 1;
        }
        if (!recursive) add(id, 'total', level.total[i]);
      }
    });
    return [...byName.values()].filter((row) => row.name !== 'total');
  }
}

/** Levels (quadruples, x delta-encoded) of a tree of {name, total, self, children: Map}. */
export function treeToGraph(root) {
  const names = [];
  const ids = new Map();
  const id = (name) => {
    if (!ids.has(name)) { ids.set(name, names.length); names.push(name); }
    return ids.get(name);
  };
  const levels = [];
  // Breadth-first keeps each level's nodes in x order, as the format requires.
  let frontier = [{ node: root, x: 0 }];
  while (frontier.length) {
    const values = [];
    const next = [];
    let cursor = 0;
    for (const { node, x } of frontier) {
      values.push(x - cursor, node.total, node.self, id(node.name));
      cursor = x + node.total;
      let childX = x;
      const children = [...node.children.values()].sort((a, b) => b.total - a.total);
      for (const child of children) {
        next.push({ node: child, x: childX });
        childX += child.total;
      }
    }
    levels.push(values);
    frontier = next;
  }
  return { names, levels, total: root.total };
}

/**
 * Callers and callees of one function (a sandwich view), from a loaded flame graph: the
 * callees merge every subtree rooted at the function; the callers merge every path from
 * the root to it, upside down. Nested calls of the function count once, at the outermost.
 */
export function sandwich(graph, name) {
  const id = graph.names.indexOf(name);
  const callees = { name, total: 0, self: 0, children: new Map() };
  const callers = { name, total: 0, self: 0, children: new Map() };
  if (id < 0) return { callers: treeToGraph(callers), callees: treeToGraph(callees) };
  const child = (node, childName) => {
    let found = node.children.get(childName);
    if (!found) { found = { name: childName, total: 0, self: 0, children: new Map() }; node.children.set(childName, found); }
    return found;
  };
  const levels = graph.levels;
  // For every node: the callee-tree node it merges into (when under the function).
  let mapped = [];
  levels.forEach((level, l) => {
    const now = new Array(level.x.length).fill(null);
    for (let i = 0; i < level.x.length; i++) {
      const parentNode = l > 0 ? mapped[level.parent[i]] : null;
      const total = level.total[i];
      const self = level.self[i];
      if (parentNode) {
        const node = child(parentNode, graph.names[level.name[i]]);
        node.total += total; node.self += self;
        now[i] = node;
      } else if (level.name[i] === id) {
        callees.total += total; callees.self += self;
        now[i] = callees;
        callers.total += total; callers.self += self;
        // the path above, innermost caller first
        let node = callers;
        let pl = l - 1;
        let pi = level.parent[i];
        while (pl >= 0) {
          node = child(node, graph.names[levels[pl].name[pi]]);
          node.total += total;
          pi = levels[pl].parent[pi];
          pl -= 1;
        }
      }
    }
    mapped = now;
  });
  return { callers: treeToGraph(callers), callees: treeToGraph(callees) };
}

/** The visible graph as SVG, for export. */
export function toSvg(graph, width = 1200) {
  const rows = [];
  const zoomLevel = graph.levels[graph.zoom.level];
  const x0 = zoomLevel.x[graph.zoom.index];
  const span = zoomLevel.total[graph.zoom.index] || 1;
  const scale = width / span;
  const escape = escapeHtml;
  graph.levels.forEach((level, l) => {
    if (l < graph.zoom.level) return;
    for (let i = 0; i < level.x.length; i++) {
      const px = (level.x[i] - x0) * scale;
      const w = level.total[i] * scale;
      if (w < 0.5 || px + w < 0 || px > width) continue;
      const name = graph.names[level.name[i]] || '';
      const y = (l - graph.zoom.level) * ROW;
      const fill = graph.colour(level.name[i], level, i, false);
      rows.push(`<g><title>${escape(name)} (${formatValue(level.total[i], graph.unit)})</title>`
        + `<rect x="${px.toFixed(1)}" y="${y}" width="${Math.max(w - 0.5, 0.5).toFixed(1)}" height="${ROW - 1}" fill="${fill}"/>`
        + (w > 30 ? `<text x="${(px + 3).toFixed(1)}" y="${y + 13}" clip-path="inset(0 0 0 0)">${escape(name.slice(0, Math.floor(w / 7)))}</text>` : '')
        + '</g>');
    }
  });
  const height = (graph.levels.length - graph.zoom.level) * ROW;
  return `<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="monospace" font-size="12">\n${rows.join('\n')}\n</svg>\n`;
}
