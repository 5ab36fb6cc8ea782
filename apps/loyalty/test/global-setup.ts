import { moduleGlobalSetup } from "@softcrum/core/testing";
import { findPostgres } from "@softcrum/testing/postgres";
import { loyaltyMigrations } from "../src/migrations.ts";

export default moduleGlobalSetup({ name: "loyalty", migrations: [loyaltyMigrations], findServer: findPostgres });
