/**
 * Finds a statement that would end the work transaction (COMMIT, ROLLBACK,
 * END, ABORT, PREPARE TRANSACTION, …) in the text of a handler's query.
 *
 * In a batched work transaction (`batch.ts`) the fences of every job of the
 * batch are written before the first handler runs: a handler that committed
 * through its `tx` would commit the other jobs' fences without their work —
 * jobs marked done that never ran. So the batch's gate refuses such a
 * statement before it is sent. (A single-job transaction needs no such check:
 * a handler that commits there commits its own fence with its own work, and
 * the engine's commit proof makes the delivery a retry that finds it.)
 *
 * The text is split into statements the way the server would — quoted
 * strings, quoted identifiers, dollar-quoted bodies and comments are skipped —
 * and the first words of each are read. SAVEPOINT, RELEASE and ROLLBACK TO
 * (what a nested `tx.transaction()` sends) are allowed.
 */
export function transactionControlIn(text: string): string | undefined {
  for (const words of headsOf(text)) {
    const [first, second, third] = words;
    switch (first) {
      case "commit":
      case "end":
      case "abort":
        return first;
      case "rollback":
        // ROLLBACK TO [SAVEPOINT] name undoes a savepoint; ROLLBACK [WORK|TRANSACTION] [AND CHAIN] ends the transaction.
        if (second === "to" || (second !== undefined && third === "to")) continue;
        return "rollback";
      case "prepare":
        if (second === "transaction") return "prepare transaction";
        continue;
      default:
        continue;
    }
  }
  return undefined;
}

/**
 * Finds a savepoint statement (SAVEPOINT, RELEASE, ROLLBACK TO) in the text
 * of a handler's query. The handlers of a concurrent batch share one
 * transaction at the same time, and savepoints are a stack of the
 * transaction's: one handler's ROLLBACK TO would undo another's work, and
 * keep some of its own, so there they are refused (`batch.ts`).
 */
export function savepointIn(text: string): string | undefined {
  for (const [first, second, third] of headsOf(text)) {
    if (first === "savepoint" || first === "release") return first;
    if (first === "rollback" && (second === "to" || (second !== undefined && third === "to"))) return "rollback to";
  }
  return undefined;
}

/**
 * `statementHeads(text)`, remembered: a batched handler's gate reads every
 * query's text, and a handler sends the same texts job after job (a
 * prepared query, the builder's output for one shape). Short texts only, and
 * a bounded number of them: texts with inlined values are each new.
 */
function headsOf(text: string): readonly (readonly string[])[] {
  if (text.length > MAX_KNOWN_TEXT) return statementHeads(text);
  let heads = knownHeads.get(text);
  if (heads === undefined) {
    heads = statementHeads(text);
    if (knownHeads.size >= MAX_KNOWN_TEXTS) knownHeads.clear();
    knownHeads.set(text, heads);
  }
  return heads;
}
const knownHeads = new Map<string, readonly (readonly string[])[]>();
const MAX_KNOWN_TEXTS = 256;
const MAX_KNOWN_TEXT = 2_048;

/** The first three lower-cased words of each statement of `text`. */
function statementHeads(text: string): string[][] {
  const heads: string[][] = [];
  let words: string[] = [];
  let i = 0;
  const n = text.length;
  const word = /[A-Za-z_][A-Za-z0-9_$]*/y;
  while (i < n) {
    const c = text[i] as string;
    if (c === ";") {
      if (words.length > 0) heads.push(words);
      words = [];
      i++;
    } else if (c === "-" && text[i + 1] === "-") {
      const end = text.indexOf("\n", i);
      i = end === -1 ? n : end + 1;
    } else if (c === "/" && text[i + 1] === "*") {
      i = skipBlockComment(text, i);
    } else if (c === "'") {
      // E'...' strings take backslash escapes; standard ones only ''.
      const escapes = i > 0 && /[eE]/.test(text[i - 1] as string) && !/[A-Za-z0-9_]/.test(text[i - 2] ?? " ");
      i = skipQuoted(text, i, "'", escapes);
      words.push("'");
    } else if (c === '"') {
      i = skipQuoted(text, i, '"', false);
      words.push('"');
    } else if (c === "$") {
      const tag = /\$([A-Za-z_][A-Za-z0-9_]*)?\$/y;
      tag.lastIndex = i;
      const m = tag.exec(text);
      if (m) {
        const end = text.indexOf(m[0], i + m[0].length);
        i = end === -1 ? n : end + m[0].length;
        words.push("$");
      } else {
        i++;
      }
    } else if (/[A-Za-z_]/.test(c)) {
      word.lastIndex = i;
      const m = word.exec(text) as RegExpExecArray;
      if (words.length < 3) words.push(m[0].toLowerCase());
      i += m[0].length;
    } else {
      if (!/\s/.test(c) && words.length < 3) words.push(c);
      i++;
    }
  }
  if (words.length > 0) heads.push(words);
  return heads;
}

function skipQuoted(text: string, start: number, quote: string, backslashEscapes: boolean): number {
  let i = start + 1;
  while (i < text.length) {
    const c = text[i];
    if (backslashEscapes && c === "\\") {
      i += 2;
      continue;
    }
    if (c === quote) {
      if (text[i + 1] === quote) {
        i += 2;
        continue;
      }
      return i + 1;
    }
    i++;
  }
  return text.length;
}

/** Block comments nest in Postgres. */
function skipBlockComment(text: string, start: number): number {
  let depth = 0;
  let i = start;
  while (i < text.length) {
    if (text[i] === "/" && text[i + 1] === "*") {
      depth++;
      i += 2;
    } else if (text[i] === "*" && text[i + 1] === "/") {
      depth--;
      i += 2;
      if (depth === 0) return i;
    } else {
      i++;
    }
  }
  return text.length;
}
