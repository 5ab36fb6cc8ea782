/**
 * The job id of chunk `chunk` of blast `blastId`: derived from the two, so
 * starting the same blast again publishes the same job_ids and the chunk
 * consumer's fence applies each once. It is a UUID v7 (the harness refuses any
 * other) whose time is the blast id's own: a chunk is as old as its blast.
 *
 * The derivation is the core's fan-out one (`fanOutJobId`: a time plus a
 * sha256 of three values), with the chunk's key in the slot fan-out uses for
 * the tenant; the kind keeps the two families of ids apart.
 */
import { fanOutJobId, jobCreatedAt } from "@softcrum/core";
import { z } from "zod";
import { InvalidBlastError } from "./errors.ts";

export const BLAST_CHUNK_KIND = "notifications.blast-chunk.v1";

const blastIdSchema = z.uuid({ version: "v7", error: "must be a UUID version 7" });

/** The blast id, lowercased; throws `InvalidBlastError` for anything but a UUID v7. */
export function checkBlastId(blastId: unknown): string {
  const parsed = blastIdSchema.safeParse(blastId);
  if (!parsed.success)
    throw new InvalidBlastError([`blastId: must be a UUID version 7, got ${JSON.stringify(blastId)}`]);
  return parsed.data.toLowerCase();
}

export function blastChunkJobId(blastId: string, chunk: number): string {
  const id = checkBlastId(blastId);
  if (!Number.isInteger(chunk) || chunk < 0) {
    throw new InvalidBlastError([`chunk: must be a non-negative integer, got ${String(chunk)}`]);
  }
  return fanOutJobId({ kind: BLAST_CHUNK_KIND, tenantId: `${id}/${chunk}`, tick: new Date(jobCreatedAt(id)) });
}
