import { findPostgres } from "@softcrum/testing/postgres";
import { moduleGlobalSetup } from "../src/testing/index.ts";

export default moduleGlobalSetup({ name: "core", findServer: findPostgres });
