// Axis scales for the console's charts: nice numeric and calendar ticks, their labels, and
// the parsing of the time values query results hold. Pure functions, no canvas.

const SEC = 1000;
export const MIN = 60 * SEC;
const HOUR = 60 * MIN;
export const DAY = 24 * HOUR;

// ---------------------------------------------------------------------------------------------
// Ticks and labels (pure functions, unit-testable without a DOM)

/** The 1-2-5 step nearest above raw: 0.2, 0.5, 1, 2, 5, 10, 20... */
export function niceStep(raw) {
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const exp = Math.floor(Math.log10(raw));
  const base = 10 ** exp;
  const f = raw / base;
  const nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nice * base;
}

function decimalsFor(step) {
  return Math.max(0, Math.min(12, -Math.floor(Math.log10(step) + 1e-9)));
}

/** An axis from min to max widened to whole steps, with about `target` ticks. */
export function niceTicks(min, max, target = 5) {
  if (!Number.isFinite(min) || !Number.isFinite(max)) {
    min = 0;
    max = 1;
  }
  if (min > max) [min, max] = [max, min];
  if (min === max) {
    const d = Math.abs(min) * 0.1 || 1;
    // A flat series of non-negative values (rates at zero) keeps its axis at or above 0.
    min = min >= 0 ? Math.max(0, min - d) : min - d;
    max += d;
  }
  const step = niceStep((max - min) / Math.max(1, target));
  const lo = Math.floor(min / step + 1e-9) * step;
  const hi = Math.ceil(max / step - 1e-9) * step;
  const dec = decimalsFor(step);
  const ticks = [];
  for (let i = 0; lo + i * step <= hi + step * 1e-6 && i < 1000; i++) {
    ticks.push(Number((lo + i * step).toFixed(dec)));
  }
  return { min: Number(lo.toFixed(dec)), max: Number(hi.toFixed(dec)), step, ticks };
}

/**
 * A tick label with as many decimals as the step needs; large axes use k/M/G/T so labels stay
 * short. `scale` is the largest magnitude on the axis, so all its labels share one unit.
 */
export function formatTick(v, step, scale = Math.abs(v)) {
  if (v === 0) return '0';
  const units = [
    [1e12, 'T'],
    [1e9, 'G'],
    [1e6, 'M'],
    [1e4, 'k'],
  ];
  for (const [u, suffix] of units) {
    if (scale >= u) {
      const div = suffix === 'k' ? 1e3 : u;
      const dec = decimalsFor(step / div);
      return `${noNegativeZero((v / div).toFixed(dec))}${suffix}`;
    }
  }
  return noNegativeZero(v.toFixed(decimalsFor(step)));
}

/** "-0.0" (from rounding a tiny negative) reads as a bug: zero has no sign. */
function noNegativeZero(s) {
  return Number(s) === 0 ? s.replace('-', '') : s;
}

/** A value for a tooltip or tile: full precision where it matters, grouped thousands. */
export function formatValue(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return '-';
  const a = Math.abs(v);
  const digits = Number.isInteger(v) || a >= 1000 ? 0 : a >= 100 ? 1 : a >= 1 ? 2 : a === 0 ? 0 : 4;
  return v.toLocaleString('en-US', { maximumFractionDigits: digits });
}

const TIME_STEPS = [
  1, 2, 5, 10, 20, 50, 100, 200, 500,
  SEC, 2 * SEC, 5 * SEC, 10 * SEC, 15 * SEC, 30 * SEC,
  MIN, 2 * MIN, 5 * MIN, 10 * MIN, 15 * MIN, 30 * MIN,
  HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR,
  DAY, 2 * DAY, 7 * DAY, 14 * DAY,
];
const MONTH_STEPS = [1, 2, 3, 6, 12, 24, 60, 120, 240, 600, 1200];

/** Date parts of an epoch-ms value in UTC or local time. */
function parts(ms, utc) {
  const d = new Date(ms);
  return utc
    ? { y: d.getUTCFullYear(), mo: d.getUTCMonth(), d: d.getUTCDate(), h: d.getUTCHours(), mi: d.getUTCMinutes(), s: d.getUTCSeconds(), ms: d.getUTCMilliseconds() }
    : { y: d.getFullYear(), mo: d.getMonth(), d: d.getDate(), h: d.getHours(), mi: d.getMinutes(), s: d.getSeconds(), ms: d.getMilliseconds() };
}

function makeTime(utc, y, mo, d = 1, h = 0, mi = 0) {
  return utc ? Date.UTC(y, mo, d, h, mi) : new Date(y, mo, d, h, mi).getTime();
}

/**
 * Ticks on round times (whole seconds, minutes, hours, days, months, years) with about
 * `target` of them between min and max. Returns {ticks, step} with step in ms (months: 30 d
 * per month, used only to pick label formats).
 */
export function timeTicks(min, max, target = 6, utc = true) {
  if (!(max > min)) return { ticks: Number.isFinite(min) ? [min] : [], step: SEC };
  const raw = (max - min) / Math.max(1, target);
  const step = TIME_STEPS.find((s) => s >= raw);
  const ticks = [];
  if (step !== undefined && step < DAY) {
    // Steps below a day divide it, so aligning on the zone's midnight gives round labels.
    const offset = utc ? 0 : -new Date(min).getTimezoneOffset() * MIN;
    let t = Math.ceil((min + offset) / step) * step - offset;
    for (; t <= max && ticks.length < 500; t += step) ticks.push(t);
    return { ticks, step };
  }
  if (step !== undefined) {
    // Whole days (every 1, 2, 7 or 14), built from calendar dates so DST shifts don't skew them.
    const days = step / DAY;
    const p = parts(min, utc);
    let t = makeTime(utc, p.y, p.mo, p.d);
    if (t < min) t = makeTime(utc, p.y, p.mo, p.d + 1);
    while (t <= max && ticks.length < 500) {
      ticks.push(t);
      const q = parts(t, utc);
      t = makeTime(utc, q.y, q.mo, q.d + days);
    }
    return { ticks, step };
  }
  const months = MONTH_STEPS.find((m) => m * 30 * DAY >= raw) || MONTH_STEPS[MONTH_STEPS.length - 1];
  const p = parts(min, utc);
  let y = p.y;
  let mo = Math.ceil(p.mo / months) * months;
  if (months >= 12) {
    const years = months / 12;
    y = Math.ceil((p.mo > 0 || p.d > 1 || p.h > 0 ? p.y + 1 : p.y) / years) * years;
    mo = 0;
  }
  for (let t = makeTime(utc, y, mo); t <= max && ticks.length < 500; ) {
    if (t >= min) ticks.push(t);
    mo += months;
    t = makeTime(utc, y, mo);
  }
  return { ticks, step: months * 30 * DAY };
}

const pad = (n, w = 2) => String(n).padStart(w, '0');

/** The date of a tick: 2024-05-01. */
export function formatDate(ms, utc = true) {
  const p = parts(ms, utc);
  return `${p.y}-${pad(p.mo + 1)}-${pad(p.d)}`;
}

/**
 * A time tick label fitted to the step: HH:MM:SS.mmm, HH:MM:SS, HH:MM for spans within a day
 * or so, dates for longer spans, YYYY-MM and YYYY for very long ones.
 */
export function formatTimeTick(ms, step, utc = true) {
  const p = parts(ms, utc);
  if (step < SEC) return `${pad(p.h)}:${pad(p.mi)}:${pad(p.s)}.${pad(p.ms, 3)}`;
  if (step < MIN) return `${pad(p.h)}:${pad(p.mi)}:${pad(p.s)}`;
  if (step < DAY) return `${pad(p.h)}:${pad(p.mi)}`;
  if (step < 28 * DAY) return formatDate(ms, utc);
  if (step < 360 * DAY) return `${p.y}-${pad(p.mo + 1)}`;
  return String(p.y);
}

/** A full timestamp for a tooltip. */
export function formatTimeFull(ms, utc = true) {
  const p = parts(ms, utc);
  const frac = p.ms ? `.${pad(p.ms, 3)}` : '';
  return `${formatDate(ms, utc)} ${pad(p.h)}:${pad(p.mi)}:${pad(p.s)}${frac}${utc ? ' UTC' : ''}`;
}

/**
 * Epoch ms of a time value from a result: "2016-01-01T00:00:00", "2016-01-01 00:00:00.123456",
 * with or without Z/+00:00, or a date. Times without a zone are UTC, which is how Sluice
 * stores them. NaN when it is not a time.
 */
export function parseTime(v) {
  if (v === null || v === undefined) return NaN;
  if (typeof v === 'number') return Number.isFinite(v) ? v : NaN;
  const s = String(v).trim();
  const m = /^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2})(:\d{2})?(\.\d+)?)?\s*(Z|UTC|[+-]\d{2}:?\d{2})?$/i.exec(s);
  if (!m) {
    const t = Date.parse(s);
    return Number.isNaN(t) ? NaN : t;
  }
  const [, date, hm = '00:00', sec = ':00', frac = '', zone = 'Z'] = m;
  // Date.parse handles milliseconds portably; finer digits only matter below 1 ms.
  const ms = frac ? frac.slice(0, 4).padEnd(4, '0') : '';
  let z = zone.toUpperCase() === 'UTC' ? 'Z' : zone;
  if (/^[+-]\d{4}$/.test(z)) z = `${z.slice(0, 3)}:${z.slice(3)}`;
  return Date.parse(`${date}T${hm}${sec}${ms}${z}`);
}
