/**
 * Redis's glob matcher (util.c stringmatchlen), for KEYS, CONFIG GET,
 * PSUBSCRIBE's patterns and PUBSUB CHANNELS: the same answers, in bounded
 * time and constant space.
 */

// Redis's guard against abusive patterns (stringmatchlen's nesting limit):
// a pattern that needs more than this many `*` before its last stops matching.
const MAX_STAR_NESTING = 1000

/**
 * Redis's stringmatchlen: `*`, `?`, `[abc]`, `[^a]`, `[a-z]`, `\x`, with the
 * same answers, quirks included: an empty text matches only an empty
 * pattern; an unclosed `[` takes the rest of the pattern as its set; a
 * reversed range (`[z-a]`) is swapped; bytes compare as C's signed chars;
 * `nocase` lowers ASCII letters only, and not a `\`-escaped byte in a set;
 * a pattern with more than 1000 `*` groups before its last one matches
 * nothing (Redis's limit on its recursion).
 *
 * Unlike Redis's recursion, this is a loop in O(pattern × text) time and
 * constant space: every token but `*` takes exactly one byte, so when the
 * rest fails, only the latest `*` needs to take one byte more (any
 * earlier `*` taking more only moves the later ones' starting points to
 * places they could already reach). A hostile pattern
 * (`*a*a*a*a*a*a*a*a*b` against a long run of `a`s, CVE-2022-36021) or a
 * very long one thus costs at most pattern × text steps, with no stack.
 */
export function globMatch (pattern: string, text: string, nocase = false): boolean {
  const m = pattern.length
  const n = text.length
  if (n === 0) return m === 0
  if (starGroupsBeforeLast(pattern) > MAX_STAR_NESTING) return false
  let pi = 0
  let si = 0
  // The pattern position after the latest `*` group, and the text position it was last tried at.
  let starP = -1
  let starS = 0
  while (si < n) {
    if (pi < m && pattern.charCodeAt(pi) === STAR) {
      while (pi < m && pattern.charCodeAt(pi) === STAR) pi++
      if (pi === m) return true
      starP = pi
      starS = si
      continue
    }
    if (pi < m) {
      const next = matchToken(pattern, pi, text.charCodeAt(si), nocase)
      if (next >= 0) {
        pi = next
        si++
        continue
      }
    }
    if (starP < 0) return false
    // Backtrack: the latest `*` takes one byte more.
    pi = starP
    si = ++starS
  }
  while (pi < m && pattern.charCodeAt(pi) === STAR) pi++
  return pi === m
}

const STAR = 0x2a
const QUESTION = 0x3f
const OPEN = 0x5b
const CLOSE = 0x5d
const BACKSLASH = 0x5c
const CARET = 0x5e
const DASH = 0x2d

/** C's signed char of a latin1 code unit (Redis compares set ranges as `int` of `char`). */
function signedChar (c: number): number {
  return (c << 24) >> 24
}

/** C's tolower in the C locale: ASCII letters only. */
function lower (c: number): number {
  return c >= 0x41 && c <= 0x5a ? c | 0x20 : c
}

/** Groups of `*` with more pattern after them (Redis recurses once per group it passes; a trailing group returns at once). */
function starGroupsBeforeLast (pattern: string): number {
  const m = pattern.length
  let groups = 0
  for (let pi = 0; pi < m;) {
    if (pattern.charCodeAt(pi) === STAR) {
      while (pi < m && pattern.charCodeAt(pi) === STAR) pi++
      if (pi < m) groups++
    } else {
      pi = tokenEnd(pattern, pi)
    }
  }
  return groups
}

/** Where the token other than `*` at pattern[pi] ends (matchToken's walk, without a byte to match). */
function tokenEnd (p: string, pi: number): number {
  const m = p.length
  const t = p.charCodeAt(pi)
  if (t === OPEN) {
    pi++
    if (pi < m && p.charCodeAt(pi) === CARET) pi++
    for (;;) {
      const left = m - pi
      if (left >= 2 && p.charCodeAt(pi) === BACKSLASH) pi++
      else if (left > 0 && p.charCodeAt(pi) === CLOSE) break
      else if (left === 0) { pi--; break } else if (left >= 3 && p.charCodeAt(pi + 1) === DASH) pi += 2
      pi++
    }
    return pi + 1
  }
  if (t === BACKSLASH && m - pi >= 2) pi++
  return pi + 1
}

/**
 * One token other than `*` at pattern[pi] against the text byte `c`: the
 * pattern position after it when it matches, -1 when not. Step by step
 * stringmatchlen's `?`, `[...]`, `\x` and literal cases.
 */
function matchToken (p: string, pi: number, c: number, nocase: boolean): number {
  const m = p.length
  const t = p.charCodeAt(pi)
  if (t === QUESTION) return pi + 1
  if (t === OPEN) {
    pi++
    const not = pi < m && p.charCodeAt(pi) === CARET
    if (not) pi++
    let match = false
    for (;;) {
      const left = m - pi
      if (left >= 2 && p.charCodeAt(pi) === BACKSLASH) {
        pi++
        if (p.charCodeAt(pi) === c) match = true
      } else if (left > 0 && p.charCodeAt(pi) === CLOSE) {
        break
      } else if (left === 0) {
        // An unclosed set ends with the pattern.
        pi--
        break
      } else if (left >= 3 && p.charCodeAt(pi + 1) === DASH) {
        let start = signedChar(p.charCodeAt(pi))
        let end = signedChar(p.charCodeAt(pi + 2))
        let x = signedChar(c)
        if (start > end) [start, end] = [end, start]
        if (nocase) {
          start = lower(start)
          end = lower(end)
          x = lower(x)
        }
        pi += 2
        if (x >= start && x <= end) match = true
      } else if (nocase ? lower(p.charCodeAt(pi)) === lower(c) : p.charCodeAt(pi) === c) {
        match = true
      }
      pi++
    }
    if (not) match = !match
    return match ? pi + 1 : -1
  }
  if (t === BACKSLASH && m - pi >= 2) pi++
  const l = p.charCodeAt(pi)
  return (nocase ? lower(l) === lower(c) : l === c) ? pi + 1 : -1
}
