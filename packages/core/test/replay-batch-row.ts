/**
 * A replay batch as `core.ops_create_batch` takes it (its jsonb row), for
 * tests that call the database's ops functions by hand, as an operator's own
 * login could: one hour to run, one letter a second, chunks of 10.
 */
export function replayBatchRow(id: string) {
  return {
    id,
    filter: {},
    reason: "by hand",
    rate_per_second: 1,
    batch_size: 10,
    max_failure_rate: 0.2,
    max_duplicate_rate: 0.5,
    expires_at: new Date(Date.now() + 3_600_000).toISOString(),
  };
}
