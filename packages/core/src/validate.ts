import { InvalidConfigError } from "./errors.ts";

/** `value` if it is a whole number ≥ 1, else an InvalidConfigError naming the option. */
export function positiveInteger(value: number, name: string): number {
  if (!Number.isInteger(value) || value < 1)
    throw new InvalidConfigError(`${name} must be a positive integer, got ${value}`);
  return value;
}

/** `value` if it is a finite number ≥ 0, else an InvalidConfigError naming the option. */
export function nonNegative(value: number, name: string): number {
  if (!Number.isFinite(value) || value < 0)
    throw new InvalidConfigError(`${name} must be a non-negative number, got ${value}`);
  return value;
}

/** `value` if it is a finite number > 0, else an InvalidConfigError naming the option. */
export function positive(value: number, name: string): number {
  if (!Number.isFinite(value) || value <= 0)
    throw new InvalidConfigError(`${name} must be a positive number, got ${value}`);
  return value;
}
