/**
 * A postgres.js client of one connection that records every statement it
 * sends (text and parameters), for tests that check what the library sends:
 * no unbounded count over the fence table, the plans of the ops' queries.
 */
import postgres from "postgres";

export interface RecordedStatement {
  readonly query: string;
  readonly parameters: unknown[];
}

export function recordingClient(url: string): { client: postgres.Sql; statements: RecordedStatement[] } {
  const statements: RecordedStatement[] = [];
  const client = postgres(url, {
    max: 1,
    onnotice: () => {},
    debug: (_connection, query, parameters) => statements.push({ query, parameters }),
  });
  return { client, statements };
}
