/** Where the harness says what went wrong outside a job's own outcome (alert sink down, dead-letter write failed). */
export interface Logger {
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

export const consoleLogger: Logger = {
  warn: (message, fields) => console.warn(`[softcrum] ${message}`, fields ?? ""),
  error: (message, fields) => console.error(`[softcrum] ${message}`, fields ?? ""),
};
