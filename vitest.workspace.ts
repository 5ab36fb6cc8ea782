// The Vitest projects of the monorepo. Vitest 4 no longer reads this file by
// itself: vitest.config.ts imports it as `test.projects`.
export default ["packages/core", "apps/loyalty", "apps/notifications", "apps/ops"];
