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
 * The pattern is compiled once (`GlobPattern`; the last patterns used here
 * are kept compiled) and matched without recursion or backtracking (see
 * `GlobPattern`).
 */
export function globMatch (pattern: string, text: string, nocase = false): boolean {
  return compiledGlob(pattern, nocase).matches(text)
}

// Compiled patterns of globMatch's recent calls (KEYS, CONFIG GET, PUBSUB CHANNELS ask the same few again and again).
const CACHE_MAX_PATTERNS = 256
const CACHE_MAX_PATTERN_LENGTH = 1024
const cached = [new Map<string, GlobPattern>(), new Map<string, GlobPattern>()]

/** `pattern` compiled, from the cache when it was compiled lately. */
export function compiledGlob (pattern: string, nocase = false): GlobPattern {
  if (pattern.length > CACHE_MAX_PATTERN_LENGTH) return new GlobPattern(pattern, nocase)
  const cache = cached[nocase ? 1 : 0]!
  let glob = cache.get(pattern)
  if (glob === undefined) {
    glob = new GlobPattern(pattern, nocase)
    if (cache.size >= CACHE_MAX_PATTERNS) cache.delete(cache.keys().next().value!)
    cache.set(pattern, glob)
  }
  return glob
}

/**
 * The pattern between two `*` groups (or before the first, or after the
 * last): tokens that take exactly one byte each. `literal` is their text
 * when every token is a plain or escaped byte compared as is (found with
 * `indexOf`); otherwise `tokens` holds where each token starts in the
 * pattern, matched one by one.
 */
interface Segment {
  readonly length: number
  readonly literal: string | null
  readonly tokens: readonly number[] | null
}

const NO_SEGMENTS: readonly Segment[] = []

/**
 * A compiled glob pattern, matched as Redis's stringmatchlen (see
 * globMatch). Every token but `*` takes exactly one byte, so a pattern is
 * segments of fixed length between `*` groups: the first must match at
 * the text's start, the last at its end, and those between in order,
 * without overlap; taking each at its leftmost place is never worse (a
 * later place only leaves less text for the rest). Matching is thus one
 * pass: plain segments are found with `indexOf` (sublinear in practice),
 * segments with `?` or sets are tried place by place, at most
 * pattern × text steps, with no recursion and no backtracking.
 * Redis's backtracking costs seconds on `*` + 50 000 `a` + `b` against
 * 100 000 `a`s (a suffix compare here).
 */
export class GlobPattern {
  /** The pattern's text. */
  readonly source: string
  readonly #nocase: boolean
  /** Segments between `*` groups, in order. */
  readonly #segments: readonly Segment[]
  /** Whether the pattern starts, ends with a `*` group (then its first, last segment is not anchored). */
  readonly #starFirst: boolean
  readonly #starLast: boolean
  /** Matches no text (Redis's recursion limit), or only the empty text (the empty pattern). */
  readonly #never: boolean
  readonly #empty: boolean

  constructor (pattern: string, nocase = false) {
    this.source = pattern
    this.#nocase = nocase
    const m = pattern.length
    this.#empty = m === 0
    this.#never = starGroupsBeforeLast(pattern) > MAX_STAR_NESTING
    this.#starFirst = m > 0 && pattern.charCodeAt(0) === STAR
    let starLast = false
    const segments: Segment[] = []
    let tokens: number[] = []
    let literal: string | null = nocase ? null : ''
    for (let pi = 0; pi < m;) {
      if (pattern.charCodeAt(pi) === STAR) {
        while (pi < m && pattern.charCodeAt(pi) === STAR) pi++
        if (tokens.length > 0 || segments.length === 0) segments.push(segmentOf(tokens, literal))
        tokens = []
        literal = nocase ? null : ''
        starLast = true
        continue
      }
      starLast = false
      const end = tokenEnd(pattern, pi)
      tokens.push(pi)
      if (literal !== null) {
        const t = pattern.charCodeAt(pi)
        if (t === QUESTION || t === OPEN) literal = null
        else literal += pattern[end - 1]
      }
      pi = end
    }
    if (!starLast) segments.push(segmentOf(tokens, literal))
    this.#starLast = starLast
    // A leading `*` group pushed an empty first segment: drop it.
    if (this.#starFirst && segments.length > 0 && segments[0]!.length === 0) segments.shift()
    this.#segments = segments.length === 0 ? NO_SEGMENTS : segments
  }

  /** Whether `text` matches, as Redis's stringmatchlen answers. */
  matches (text: string): boolean {
    const n = text.length
    if (n === 0) return this.#empty
    if (this.#never || this.#empty) return false
    const segments = this.#segments
    const count = segments.length
    if (count === 0) return true // only `*`s
    let from = 0
    let end = n
    let first = 0
    let last = count
    if (!this.#starFirst) {
      const head = segments[0]!
      if (!this.#starLast && count === 1) return head.length === n && this.#at(head, text, 0)
      if (head.length > n || !this.#at(head, text, 0)) return false
      from = head.length
      first = 1
    }
    if (!this.#starLast) {
      const tail = segments[count - 1]!
      end = n - tail.length
      if (end < from || !this.#at(tail, text, end)) return false
      last = count - 1
    }
    for (let i = first; i < last; i++) {
      const at = this.#find(segments[i]!, text, from, end)
      if (at < 0) return false
      from = at + segments[i]!.length
    }
    return true
  }

  // Whether `segment` matches text at `at` (the caller checked it fits).
  #at (segment: Segment, text: string, at: number): boolean {
    const literal = segment.literal
    if (literal !== null) return text.startsWith(literal, at)
    const tokens = segment.tokens!
    const pattern = this.source
    const nocase = this.#nocase
    for (let k = 0; k < tokens.length; k++) {
      if (matchToken(pattern, tokens[k]!, text.charCodeAt(at + k), nocase) < 0) return false
    }
    return true
  }

  // The leftmost place >= from where `segment` matches and ends by `end`; -1 when none.
  #find (segment: Segment, text: string, from: number, end: number): number {
    const length = segment.length
    if (segment.literal !== null) {
      const at = text.indexOf(segment.literal, from)
      return at >= 0 && at + length <= end ? at : -1
    }
    for (let at = from; at + length <= end; at++) if (this.#at(segment, text, at)) return at
    return -1
  }
}

function segmentOf (tokens: number[], literal: string | null): Segment {
  return literal !== null ? { length: literal.length, literal, tokens: null } : { length: tokens.length, literal: null, tokens }
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
