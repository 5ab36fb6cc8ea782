-- A copy of a job that folds into its pending letter after more runs of the
-- handler than the letter records replaces the letter's error, class and
-- attempts together (db/dead-letter-write.ts): a letter's class never
-- contradicts its error. Copies whose handler ran no more often (one past the
-- budget after a lost ack, one expired on arrival) change none of them. So
-- the worker may update error_class too; a letter's status, and who changed
-- it, stay the operators' (migration 0018).
GRANT UPDATE (error_class) ON core.dead_letters TO softcrum_worker;
