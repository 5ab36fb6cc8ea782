/**
 * What the CLI prints for people (#10 item 13): tables that fit the terminal
 * (cells cut with …, `--wide` for everything), ages and durations as
 * `3h 12m`, payloads pretty-printed, and errors that name the flags the
 * operator typed instead of the library's field names.
 */

export interface TableOptions {
  /** Columns the table may use; past it, the widest columns are cut with … @default terminalWidth() */
  readonly width?: number;
  /** Print every cell whole, whatever the width. */
  readonly wide?: boolean;
  /** Columns never cut (what an operator copies into the next command). @default KEEP_WHOLE */
  readonly keep?: readonly string[];
}

/** Ids are what an operator copies into the next command (or a log search): never cut. */
export const KEEP_WHOLE = ["id", "batchId", "replayedFrom", "replayBatchId", "jobId", "correlationId"];

/**
 * Free text (an error, a reason): such a column takes the slack — it is
 * narrowed first, down to MIN_SLACK, before any other column loses a
 * character (#21 item 9: queue names and classes stay whole, the error gives way).
 */
export const SLACK_COLUMNS = ["lastError", "error", "detail", "stopReason", "reason", "statusReason"];
const MIN_SLACK = 24;

/** The terminal's width: COLUMNS, else the TTY's, else 120 (a pipe or a file). */
export function terminalWidth(): number {
  const fromEnv = Number(process.env["COLUMNS"]);
  if (Number.isInteger(fromEnv) && fromEnv > 20) return fromEnv;
  return process.stdout.columns && process.stdout.columns > 20 ? process.stdout.columns : 120;
}

const GAP = 2;
/** Narrowest a column is cut to (its header may be cut too). */
const MIN_COLUMN = 6;

export function table(rows: Record<string, unknown>[], columns: string[], options: TableOptions = {}): string {
  if (rows.length === 0) return "(none)";
  const keep = options.keep ?? KEEP_WHOLE;
  const width = options.width ?? terminalWidth();
  let shown = [...columns];
  let widths = naturalWidths(rows, shown);
  const hidden: string[] = [];
  if (!options.wide) {
    // Cut the widest cells first; when even the narrowest cells do not fit, leave out the last columns.
    for (;;) {
      widths = naturalWidths(rows, shown);
      if (
        fitColumns(
          widths,
          width,
          shown.map((c) => !keep.includes(c)),
          shown.map((c) => SLACK_COLUMNS.includes(c)),
        )
      )
        break;
      const last = shown.findLastIndex((c, i) => i > 0 && !keep.includes(c));
      if (last < 0) break;
      hidden.unshift(shown[last] as string);
      shown = shown.filter((_, i) => i !== last);
    }
  }
  const line = (values: string[]) =>
    values
      .map((v, i) => cut(v, widths[i] as number).padEnd(widths[i] as number))
      .join(" ".repeat(GAP))
      .trimEnd();
  const cells = rows.map((row) => shown.map((c) => text(row[c])));
  const lines = [line(shown), line(widths.map((w) => "-".repeat(w))), ...cells.map(line)];
  if (hidden.length)
    lines.push(cut(`(${hidden.join(", ")} left out to fit ${width} columns: --wide shows all)`, width));
  return lines.join("\n");
}

function naturalWidths(rows: Record<string, unknown>[], columns: string[]): number[] {
  return columns.map((c) => Math.max(c.length, ...rows.map((row) => text(row[c]).length)));
}

/**
 * Fits the row into `width`: first the free-text columns give way (down to
 * MIN_SLACK), then the widest of the other columns that may be cut, one
 * character at a time (down to MIN_COLUMN); false when it cannot.
 */
function fitColumns(widths: number[], width: number, cuttable: boolean[], slack: boolean[]): boolean {
  const over = () => widths.reduce((a, b) => a + b, 0) + GAP * (widths.length - 1) - width;
  for (let i = 0; i < widths.length && over() > 0; i++) {
    if (!cuttable[i] || !slack[i]) continue;
    widths[i] = Math.max(Math.min(widths[i] as number, MIN_SLACK), (widths[i] as number) - over());
  }
  while (over() > 0) {
    let widest = -1;
    for (let i = 0; i < widths.length; i++) {
      if (cuttable[i] && (widest < 0 || (widths[i] as number) > (widths[widest] as number))) widest = i;
    }
    if (widest < 0 || (widths[widest] as number) <= MIN_COLUMN) return false;
    widths[widest] = (widths[widest] as number) - 1;
  }
  return true;
}

/**
 * `value` in `width` characters: elided in the middle, so both ends stay
 * (`loyalty.…-points`, the start and the end of an error); never an id (KEEP_WHOLE).
 */
function cut(value: string, width: number): string {
  if (value.length <= width) return value;
  if (width <= 1) return "…".slice(0, width);
  const head = Math.ceil((width - 1) / 2);
  const tail = width - 1 - head;
  return `${value.slice(0, head)}…${tail > 0 ? value.slice(value.length - tail) : ""}`;
}

export function text(value: unknown): string {
  if (value === null || value === undefined) return "";
  if (value instanceof Date) return value.toISOString().replace(/\.\d{3}Z$/, "Z");
  if (typeof value === "object") return JSON.stringify(value);
  return String(value).replace(/\s+/g, " ");
}

/** One record, a field a line; a long value is elided in the middle to the width, never an id (KEEP_WHOLE). */
export function fields(record: Record<string, unknown>, keys: string[], options: TableOptions = {}): string {
  const keep = options.keep ?? KEEP_WHOLE;
  const width = Math.max(...keys.map((k) => k.length));
  const room = Math.max(20, (options.width ?? terminalWidth()) - width - GAP);
  return keys
    .map((k) => {
      const value = text(record[k]);
      return `${k.padEnd(width)}  ${options.wide || keep.includes(k) ? value : cut(value, room)}`.trimEnd();
    })
    .join("\n");
}

/** JSON with dates as ISO strings. */
export function json(value: unknown): string {
  return JSON.stringify(value, null, 2);
}

/** One line of NDJSON (one event of a stream). */
export function ndjson(value: unknown): string {
  return JSON.stringify(value);
}

/** A duration for people: `850ms`, `42s`, `3m 5s`, `3h 12m`, `2d 4h`. */
export function duration(ms: number): string {
  if (!Number.isFinite(ms)) return "?";
  const abs = Math.max(0, Math.round(ms));
  if (abs < 1000) return `${abs}ms`;
  const s = Math.floor(abs / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m}m ${s % 60}s` : `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 24) return m % 60 ? `${h}h ${m % 60}m` : `${h}h`;
  const d = Math.floor(h / 24);
  return h % 24 ? `${d}d ${h % 24}h` : `${d}d`;
}

type Instant = Date | string | null | undefined;

function timeOf(at: Instant): number {
  if (!at) return Number.NaN;
  return at instanceof Date ? at.getTime() : Date.parse(at);
}

/** How long ago `at` was, for people: `3h 12m ago`. */
export function age(at: Instant, now = Date.now()): string {
  const time = timeOf(at);
  return Number.isFinite(time) ? `${duration(now - time)} ago` : "";
}

/** `at` relative to now, either way: `3h 12m ago`, or `in 5m` for a time still to come. */
export function relative(at: Instant, now = Date.now()): string {
  const time = timeOf(at);
  if (!Number.isFinite(time)) return "";
  return time > now ? `in ${duration(time - now)}` : `${duration(now - time)} ago`;
}

/** A time for people with its timestamp: `3h 12m ago (2026-11-30T08:48:00Z)`, `in 5m (…)`; "" when there is none. */
export function when(at: Instant, now = Date.now()): string {
  const time = timeOf(at);
  return Number.isFinite(time) ? `${relative(at, now)} (${text(new Date(time))})` : "";
}

/**
 * The library's messages count time in milliseconds (`did not resolve within
 * 600000 ms`): for people, the same time in human units (`within 10m`).
 * Only that phrase is rewritten, so the text an operator typed stays as typed.
 */
export function humanMs(message: string): string {
  return message.replace(/\bwithin (\d+) ?ms\b/g, (_, ms: string) => `within ${duration(Number(ms))}`);
}

/** A payload for reading: JSON indented, anything else as it is. */
export function prettyPayload(payload: string): string {
  try {
    return JSON.stringify(JSON.parse(payload), null, 2);
  } catch {
    return payload;
  }
}

/**
 * Rewrites the library's field names in a validation message into the flags
 * the operator typed (`createdAfter` → `--since` or `--created-after`).
 */
export function nameFlags(message: string, flags: Readonly<Record<string, string>>): string {
  let out = message;
  for (const [field, flag] of Object.entries(flags)) {
    out = out.replace(new RegExp(`(^|[\\s:;(])(?:filter\\.|batch\\.)?${field}(?=[:\\s]|$)`, "g"), `$1${flag}`);
  }
  return out.replace(/\binvalid (filter|batch|page|prune): /, "invalid input: ");
}

/** What a running batch is doing, for the progress bar and the NDJSON events. */
export function phaseOf(b: {
  status: string;
  sampleSize: number | null;
  samplePassedAt: Date | null;
  selected: number;
  replayed: number;
  skipped: number;
  succeeded: number;
  duplicates?: number;
  failedAgain: number;
  ratePerSecond: number;
}): string {
  if (b.status !== "running") return b.status;
  const sample = b.sampleSize ? Math.min(b.sampleSize, b.selected) : 0;
  if (sample > 0 && !b.samplePassedAt && b.replayed + b.skipped >= sample) {
    return `waiting for the sample check (${b.succeeded + (b.duplicates ?? 0) + b.failedAgain} of ${b.replayed} resolved)`;
  }
  return `paced at ${perSecond(b.ratePerSecond)}/s`;
}

/** A rate for people: at most 4 significant digits (a rate paced by live traffic is any fraction). */
function perSecond(rate: number): string {
  return String(Number(rate.toPrecision(4)));
}

/** Time left for people, in whole seconds and up (`0s` when nothing is left, `?` when it cannot be known). */
export function etaText(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "?";
  return duration(Math.ceil(seconds) * 1000).replace(/^0ms$/, "0s");
}

/**
 * Progress when stderr is not a terminal (#21 item 8): a line when the run
 * starts, then one every `everyMs` (10 s) or every `everyShare` (10 %) of the
 * letters, whichever comes first, and the latest state at the end — not a
 * line every second.
 */
export class ProgressLines {
  readonly #write: (line: string) => void;
  readonly #now: () => number;
  readonly #everyMs: number;
  readonly #everyShare: number;
  #last: { at: number; done: number } | undefined;
  #unwritten: string | undefined;

  constructor(
    write: (line: string) => void,
    options: { now?: () => number; everyMs?: number; everyShare?: number } = {},
  ) {
    this.#write = write;
    this.#now = options.now ?? Date.now;
    this.#everyMs = options.everyMs ?? 10_000;
    this.#everyShare = options.everyShare ?? 0.1;
  }

  update(total: number, done: number, p: { rate: string; etaText: string; failedAgain: number; phase: string }): void {
    const line = `replay ${done}/${total} | ${p.rate}/s | ETA ${p.etaText} | failed again ${p.failedAgain} | ${p.phase}`;
    const now = this.#now();
    const last = this.#last;
    if (
      last === undefined ||
      now - last.at >= this.#everyMs ||
      done - last.done >= Math.max(1, total * this.#everyShare)
    ) {
      this.#write(line);
      this.#last = { at: now, done };
      this.#unwritten = undefined;
    } else {
      this.#unwritten = line;
    }
  }

  /** The latest state, if the last update was not written. */
  finish(): void {
    if (this.#unwritten !== undefined) this.#write(this.#unwritten);
    this.#unwritten = undefined;
  }
}
