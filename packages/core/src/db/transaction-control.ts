/**
 * Finds a statement that would end the work transaction (COMMIT, ROLLBACK,
 * END, ABORT, PREPARE TRANSACTION, …) in the text of a handler's query.
 *
 * The fence is written before the handler runs, so a handler that ended the
 * transaction through its `tx` would split the fence from the work: a COMMIT
 * in a batch commits the other jobs' fences without their work (jobs marked
 * done that never ran), and `rollback; begin` in a single job leaves its work
 * to commit in a new transaction, without the fence, while the connection's
 * status ('T') reads as if the work transaction were still open. So every
 * handler's gate (`Gate` in driver.ts) refuses such a statement before it is
 * sent, on every driver.
 *
 * The text is split into statements the way the server would — quoted
 * strings, quoted identifiers, dollar-quoted bodies and comments are skipped —
 * and the first words of each are read. A text is read both ways a plain
 * string can end (`standard_conforming_strings` on, and off: a database or
 * role may set either), and refused if either reading finds a statement. SAVEPOINT, RELEASE and ROLLBACK TO
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
 * Finds a statement that would change a setting for the rest of the session
 * (a plain or SESSION `SET`, `SET SESSION CHARACTERISTICS`, `RESET`) in the
 * text of a handler's query. The work transaction's connection goes back to
 * the pool: such a setting would outlive the job and run every later job
 * there, any consumer's, and the module's own queries, under it (a role, a
 * search_path, `default_transaction_read_only`, …). `SET LOCAL`, `SET
 * TRANSACTION` (or `SET transaction_isolation` and the like) and `SET
 * CONSTRAINTS` end with the transaction, and are allowed. (`set_config(name, value, false)` and a function that sets
 * something are not statements this can see.)
 */
export function sessionSettingIn(text: string): string | undefined {
  for (const [first, second, third] of headsOf(text)) {
    if (first === "reset") return "reset";
    if (first !== "set") continue;
    if (second === "local" || second === "transaction" || second === "constraints") continue;
    // transaction_isolation, transaction_read_only, transaction_deferrable: SET TRANSACTION by another name.
    if (second?.startsWith("transaction_")) continue;
    if (second === "session") return third === "characteristics" ? "set session characteristics" : "set session";
    return "set";
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
  if (text.length > MAX_KNOWN_TEXT) return bothReadings(text);
  let heads = knownHeads.get(text);
  if (heads === undefined) {
    heads = bothReadings(text);
    if (knownHeads.size >= MAX_KNOWN_TEXTS) knownHeads.clear();
    knownHeads.set(text, heads);
  }
  return heads;
}
const knownHeads = new Map<string, readonly (readonly string[])[]>();
const MAX_KNOWN_TEXTS = 256;
const MAX_KNOWN_TEXT = 2_048;

/**
 * The statement heads of both readings of a plain string: with
 * `standard_conforming_strings` off, a backslash escapes the quote after it
 * (`'a\''` is one string), with it on it does not (`'a\'` is one string, and
 * what follows is outside it). Only a text with a backslash reads two ways.
 */
function bothReadings(text: string): string[][] {
  const standard = statementHeads(text, false);
  return text.includes("\\") ? [...standard, ...statementHeads(text, true)] : standard;
}

/**
 * Identifiers as the server reads them: a letter, `_` or any non-ASCII
 * character starts one, and `$` and digits continue it, so `é$x$` is one
 * identifier, not `é` and a dollar quote.
 */
const WORD = /[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*/y;
const WORD_START = /[A-Za-z_\u0080-\uffff]/;
const DOLLAR_TAG = /\$([A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$/y;

/**
 * The first three lower-cased words of each statement of `text`; plain
 * strings take backslash escapes when `backslashQuotes`.
 */
function statementHeads(text: string, backslashQuotes: boolean): string[][] {
  const heads: string[][] = [];
  let words: string[] = [];
  let i = 0;
  const n = text.length;
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
      i = skipQuoted(text, i, "'", backslashQuotes);
      words.push("'");
    } else if (c === '"') {
      i = skipQuoted(text, i, '"', false);
      words.push('"');
    } else if (c === "$") {
      // Reached only outside an identifier (WORD takes a `$` inside one).
      DOLLAR_TAG.lastIndex = i;
      const m = DOLLAR_TAG.exec(text);
      if (m) {
        const end = text.indexOf(m[0], i + m[0].length);
        i = end === -1 ? n : end + m[0].length;
        words.push("$");
      } else {
        i++;
      }
    } else if (WORD_START.test(c)) {
      WORD.lastIndex = i;
      const m = WORD.exec(text) as RegExpExecArray;
      i += m[0].length;
      if ((m[0] === "e" || m[0] === "E") && text[i] === "'") {
        // E'...': an escape string, whatever the setting (only a lone E
        // starts one: in `x$e'...'` the E ends an identifier).
        i = skipQuoted(text, i, "'", true);
        words.push("'");
      } else if (words.length < 3) {
        words.push(m[0].toLowerCase());
      }
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
