/** Plain-text tables and values for the terminal. */
export function table(rows: Record<string, unknown>[], columns: string[]): string {
  if (rows.length === 0) return "(none)";
  const cells = rows.map((row) => columns.map((c) => text(row[c])));
  const widths = columns.map((c, i) => Math.min(60, Math.max(c.length, ...cells.map((r) => (r[i] as string).length))));
  const line = (values: string[]) =>
    values
      .map((v, i) =>
        v.length > (widths[i] as number) ? `${v.slice(0, (widths[i] as number) - 1)}…` : v.padEnd(widths[i] as number),
      )
      .join("  ")
      .trimEnd();
  return [line(columns), line(widths.map((w) => "-".repeat(w))), ...cells.map(line)].join("\n");
}

export function text(value: unknown): string {
  if (value === null || value === undefined) return "";
  if (value instanceof Date) return value.toISOString().replace(/\.\d{3}Z$/, "Z");
  if (typeof value === "object") return JSON.stringify(value);
  return String(value).replace(/\s+/g, " ");
}

export function fields(record: Record<string, unknown>, keys: string[]): string {
  const width = Math.max(...keys.map((k) => k.length));
  return keys.map((k) => `${k.padEnd(width)}  ${text(record[k])}`).join("\n");
}

/** JSON with dates as ISO strings. */
export function json(value: unknown): string {
  return JSON.stringify(value, null, 2);
}
