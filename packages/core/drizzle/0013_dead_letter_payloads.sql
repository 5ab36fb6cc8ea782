CREATE TABLE "core"."dead_letter_payloads" (
	"dead_letter_id" uuid NOT NULL,
	"payload_sha256" text NOT NULL,
	"payload" text NOT NULL,
	"payload_encoding" text NOT NULL,
	"last_error" text NOT NULL,
	"occurrences" integer DEFAULT 1 NOT NULL,
	"first_seen_at" timestamp with time zone DEFAULT now() NOT NULL,
	"last_seen_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "dead_letter_payloads_dead_letter_id_payload_sha256_pk" PRIMARY KEY("dead_letter_id","payload_sha256"),
	CONSTRAINT "dead_letter_payloads_encoding_valid" CHECK ("core"."dead_letter_payloads"."payload_encoding" in ('utf8', 'base64')),
	CONSTRAINT "dead_letter_payloads_last_error_bounded" CHECK (char_length("core"."dead_letter_payloads"."last_error") <= 4000)
);
--> statement-breakpoint
ALTER TABLE "core"."dead_letter_payloads" ADD CONSTRAINT "dead_letter_payloads_dead_letter_id_dead_letters_id_fk" FOREIGN KEY ("dead_letter_id") REFERENCES "core"."dead_letters"("id") ON DELETE cascade ON UPDATE no action;