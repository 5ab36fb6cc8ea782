-- The module's consumers run as the shipped worker role (core migration
-- 0018_ops_roles creates it): they read and write the module's tables, and
-- nothing else of the module is theirs to change. Tables added later are
-- covered by the default privileges (for tables this deploy role creates).
GRANT USAGE ON SCHEMA "loyalty" TO softcrum_worker;
--> statement-breakpoint
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "loyalty" TO softcrum_worker;
--> statement-breakpoint
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA "loyalty" TO softcrum_worker;
--> statement-breakpoint
ALTER DEFAULT PRIVILEGES IN SCHEMA "loyalty" GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO softcrum_worker;
--> statement-breakpoint
ALTER DEFAULT PRIVILEGES IN SCHEMA "loyalty" GRANT USAGE, SELECT ON SEQUENCES TO softcrum_worker;
