import { moduleGlobalSetup } from "@softcrum/core/testing";
import { findPostgres } from "@softcrum/testing/postgres";
import { notificationsMigrations } from "../src/migrations.ts";

export default moduleGlobalSetup({
  name: "notifications",
  migrations: [notificationsMigrations],
  findServer: findPostgres,
});
