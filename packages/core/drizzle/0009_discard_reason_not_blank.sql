-- softcrum-migrate: no-transaction
-- A discard's reason must not be blank (#10 item 7). The old CHECK used
-- btrim(), which strips only spaces: a reason of a tab or of line breaks
-- passed the database while the API refused it. The new CHECK refuses every
-- reason made only of what JavaScript's trim() strips (the API's rule): tabs,
-- line breaks, vertical tab, form feed and the Unicode spaces.
-- Outside a transaction (ADR 0008): each ALTER takes its ACCESS EXCLUSIVE lock
-- on core.dead_letters only for a catalog change, and the scans (the update
-- of old blank reasons, VALIDATE) run under locks that let writers on. In a
-- transaction the first ALTER's lock would be held through both scans.
-- migration-lint: allow metadata only (brief ACCESS EXCLUSIVE, no scan); drops a half-made constraint so an interrupted run can be rerun
ALTER TABLE "core"."dead_letters" DROP CONSTRAINT IF EXISTS "dead_letters_discard_reason_not_blank";--> statement-breakpoint
ALTER TABLE "core"."dead_letters" ADD CONSTRAINT "dead_letters_discard_reason_not_blank" CHECK ("core"."dead_letters"."status" <> 'discarded' or ("core"."dead_letters"."status_reason" is not null and "core"."dead_letters"."status_reason" ~ '[^\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]')) NOT VALID;--> statement-breakpoint
-- Discards the old CHECK let through with a blank reason keep a marker instead
-- (what the operator typed is still in core.ops_audit), so VALIDATE can pass.
UPDATE "core"."dead_letters" SET "status_reason" = '(blank reason, recorded before migration 0009)' WHERE "status" = 'discarded' AND ("status_reason" IS NULL OR "status_reason" !~ '[^\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]');--> statement-breakpoint
ALTER TABLE "core"."dead_letters" VALIDATE CONSTRAINT "dead_letters_discard_reason_not_blank";--> statement-breakpoint
-- migration-lint: allow metadata only (brief ACCESS EXCLUSIVE, no scan); the new CHECK above replaces it
ALTER TABLE "core"."dead_letters" DROP CONSTRAINT IF EXISTS "dead_letters_discard_needs_reason";
