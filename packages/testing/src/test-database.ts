// The implementation is `useModuleDatabase` of @softcrum/core/testing (published); this keeps the repository's name.
export type { Connection, TestDatabase } from "../../core/src/testing/vitest.ts";
export { useModuleDatabase as useTestDatabase } from "../../core/src/testing/vitest.ts";
