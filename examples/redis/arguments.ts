/**
 * Integer arguments and index ranges as the commands of several data types
 * read them.
 */

/** An integer argument (`RespRequest.int`) as a number; null stays null. */
export function asNumber (n: number | bigint | null): number | null {
  if (n === null) return null
  return typeof n === 'bigint' ? Number(n) : n
}

/** LRANGE's and ZRANGE's index arithmetic: [start, end] inclusive within [0, length), or null when empty. */
export function rangeOf (start: number, stop: number, length: number): [number, number] | null {
  if (start < 0) start += length
  if (stop < 0) stop += length
  if (start < 0) start = 0
  if (start > stop || start >= length) return null
  if (stop >= length) stop = length - 1
  return [start, stop]
}
