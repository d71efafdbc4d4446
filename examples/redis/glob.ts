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

/*
 * A compiled pattern is segments: the tokens between two `*` groups (or
 * before the first, or after the last), each taking exactly one byte. A
 * segment of plain (or escaped) bytes compared as they are is kept as its
 * text, found with `indexOf`. Any other is kept as a code string, one
 * string so that matching a pattern touches few objects (a PUBLISH walks
 * every pattern): SEGMENT_CODE, its length in tokens (two chars, low then
 * high 16 bits), then per token a byte to compare (lowered under nocase),
 * OP_ANY (`?`), OP_SET and the set's place in the pattern (two chars), or
 * OP_BYTE and a byte at or above OP_FIRST (which would read as an op).
 */
const SEGMENT_CODE = 0xfffb
const OP_BYTE = 0xfffc
const OP_SET = 0xfffe
const OP_ANY = 0xffff
const OP_FIRST = 0xfffb

// Flags of a compiled pattern.
const STAR_FIRST = 1
const STAR_LAST = 2
/** Matches nothing (Redis's recursion limit). */
const NEVER = 4
/** The empty pattern: matches only the empty text. */
const EMPTY = 8
const NOCASE = 16

/**
 * A compiled glob pattern, matched as Redis's stringmatchlen (see
 * globMatch). Every token but `*` takes exactly one byte, so a pattern is
 * segments of fixed length between `*` groups: the first must match at
 * the text's start, the last at its end, and those between in order,
 * without overlap; taking each at its leftmost place is never worse (a
 * later place only leaves less text for the rest). Matching is thus one
 * pass: plain segments are found with `indexOf` (sublinear in practice),
 * the others are tried place by place, at most pattern × text steps, with
 * no recursion and no backtracking. Redis's backtracking costs seconds on
 * `*` + 50 000 `a` + `b` against 100 000 `a`s (a suffix compare here).
 */
export class GlobPattern {
  /** The pattern's text. */
  readonly source: string
  readonly #flags: number
  /** The one segment, or the segments in order (see above); none for a pattern of `*`s only. */
  readonly #segments: string | readonly string[]

  constructor (pattern: string, nocase = false) {
    this.source = pattern
    const m = pattern.length
    let flags = nocase ? NOCASE : 0
    if (m === 0) flags |= EMPTY
    if (starGroupsBeforeLast(pattern) > MAX_STAR_NESTING) flags |= NEVER
    const segments: string[] = []
    let ops: string[] = []
    let plain = !nocase
    let tokens = 0
    const close = (): void => {
      if (tokens === 0) return
      segments.push(plain ? ops.join('') : String.fromCharCode(SEGMENT_CODE, tokens & 0xffff, tokens >>> 16) + ops.join(''))
      ops = []
      plain = !nocase
      tokens = 0
    }
    for (let pi = 0; pi < m;) {
      const t = pattern.charCodeAt(pi)
      if (t === STAR) {
        while (pi < m && pattern.charCodeAt(pi) === STAR) pi++
        if (pi === m) flags |= STAR_LAST
        if (tokens === 0 && segments.length === 0) flags |= STAR_FIRST
        close()
        continue
      }
      const end = tokenEnd(pattern, pi)
      tokens++
      if (t === QUESTION) {
        plain = false
        ops.push(String.fromCharCode(OP_ANY))
      } else if (t === OPEN) {
        plain = false
        ops.push(String.fromCharCode(OP_SET, pi & 0xffff, pi >>> 16))
      } else {
        const c = pattern.charCodeAt(end - 1)
        if (c >= OP_FIRST) {
          plain = false
          ops.push(String.fromCharCode(OP_BYTE, c))
        } else {
          ops.push(String.fromCharCode(nocase ? lower(c) : c))
        }
      }
      pi = end
    }
    close()
    this.#flags = flags
    this.#segments = segments.length === 1 ? segments[0]! : segments
  }

  /** Whether `text` matches, as Redis's stringmatchlen answers. */
  matches (text: string): boolean {
    const n = text.length
    const flags = this.#flags
    if (n === 0) return (flags & EMPTY) !== 0
    if ((flags & (NEVER | EMPTY)) !== 0) return false
    const one = this.#segments
    if (typeof one === 'string') {
      // One segment: anchored at both ends, at the start, at the end, or found anywhere.
      const length = segmentLength(one)
      switch (flags & (STAR_FIRST | STAR_LAST)) {
        case 0: return length === n && this.#at(one, text, 0)
        case STAR_LAST: return length <= n && this.#at(one, text, 0)
        case STAR_FIRST: return length <= n && this.#at(one, text, n - length)
        default: return this.#find(one, length, text, 0, n) >= 0
      }
    }
    const segments = one
    const count = segments.length
    if (count === 0) return true // only `*`s
    let from = 0
    let end = n
    let first = 0
    let last = count
    if ((flags & STAR_FIRST) === 0) {
      const head = segments[0]!
      const length = segmentLength(head)
      if (length > n || !this.#at(head, text, 0)) return false
      from = length
      first = 1
    }
    if ((flags & STAR_LAST) === 0) {
      const tail = segments[count - 1]!
      end = n - segmentLength(tail)
      if (end < from || !this.#at(tail, text, end)) return false
      last = count - 1
    }
    for (let i = first; i < last; i++) {
      const segment = segments[i]!
      const length = segmentLength(segment)
      const at = this.#find(segment, length, text, from, end)
      if (at < 0) return false
      from = at + length
    }
    return true
  }

  // Whether `segment` matches text at `at` (the caller checked it fits).
  #at (segment: string, text: string, at: number): boolean {
    if (segment.charCodeAt(0) !== SEGMENT_CODE) return text.startsWith(segment, at)
    const nocase = (this.#flags & NOCASE) !== 0
    const m = segment.length
    for (let i = 3, k = at; i < m; k++) {
      const op = segment.charCodeAt(i)
      const c = text.charCodeAt(k)
      if (op < OP_FIRST) {
        if ((nocase ? lower(c) : c) !== op) return false
        i++
      } else if (op === OP_ANY) {
        i++
      } else if (op === OP_SET) {
        if (matchToken(this.source, segment.charCodeAt(i + 1) | (segment.charCodeAt(i + 2) << 16), c, nocase) < 0) return false
        i += 3
      } else {
        if (c !== segment.charCodeAt(i + 1)) return false
        i += 2
      }
    }
    return true
  }

  // The leftmost place >= from where `segment` (`length` tokens) matches and ends by `end`; -1 when none.
  #find (segment: string, length: number, text: string, from: number, end: number): number {
    if (segment.charCodeAt(0) !== SEGMENT_CODE) {
      const at = text.indexOf(segment, from)
      return at >= 0 && at + length <= end ? at : -1
    }
    for (let at = from; at + length <= end; at++) if (this.#at(segment, text, at)) return at
    return -1
  }
}

/** A segment's length in tokens (text bytes). */
function segmentLength (segment: string): number {
  return segment.charCodeAt(0) === SEGMENT_CODE ? segment.charCodeAt(1) | (segment.charCodeAt(2) << 16) : segment.length
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
