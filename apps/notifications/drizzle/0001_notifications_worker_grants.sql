-- The module's consumers run as the shipped worker role (core migration
-- 0018_ops_roles creates it): they read and write the module's tables, and
-- nothing else of the module is theirs to change. Tables added later are
-- covered by the default privileges (for tables this deploy role creates).
GRANT USAGE ON SCHEMA "notifications" TO softcrum_worker;
--> statement-breakpoint
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "notifications" TO softcrum_worker;
--> statement-breakpoint
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA "notifications" TO softcrum_worker;
--> statement-breakpoint
ALTER DEFAULT PRIVILEGES IN SCHEMA "notifications" GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO softcrum_worker;
--> statement-breakpoint
ALTER DEFAULT PRIVILEGES IN SCHEMA "notifications" GRANT USAGE, SELECT ON SEQUENCES TO softcrum_worker;
