/**
 * Welch's two-sample t-test (unequal variances), as R's `t.test(a, b)`
 * reports it: t, the Welch–Satterthwaite degrees of freedom, the two-sided
 * p-value and a confidence interval of mean(a) − mean(b). Seeds 002 and 004
 * ran it by hand on rpc-bench's Reqs/sec; `nyala bench --compare` runs it.
 *
 * Student's t distribution is computed through the regularized incomplete
 * beta function (continued fraction, Numerical Recipes, section 6.4) and its
 * quantile by bisection, which is exact to the last few digits that matter
 * here and needs no dependency.
 */

/** The outcome of `welchTest`. */
export interface WelchResult {
  meanA: number
  meanB: number
  /** mean(a) − mean(b). */
  difference: number
  t: number
  /** Welch–Satterthwaite degrees of freedom. */
  df: number
  /** Two-sided p-value. */
  p: number
  /** Confidence level of the interval, e.g. 0.95. */
  confidence: number
  /** Confidence interval of mean(a) − mean(b). */
  low: number
  high: number
}

/** The median (the mean of the two middle values for an even count). */
export function median (values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Arithmetic mean. */
export function mean (values: readonly number[]): number {
  let sum = 0
  for (const v of values) sum += v
  return sum / values.length
}

/** Sample variance (n − 1 in the denominator). */
export function sampleVariance (values: readonly number[]): number {
  const m = mean(values)
  let sum = 0
  for (const v of values) sum += (v - m) * (v - m)
  return sum / (values.length - 1)
}

/** Welch's t-test of `a` against `b`; each needs at least two values. */
export function welchTest (a: readonly number[], b: readonly number[], confidence = 0.95): WelchResult {
  if (a.length < 2 || b.length < 2) throw new RangeError('Welch\'s t-test needs at least two values per sample')
  if (!(confidence > 0 && confidence < 1)) throw new RangeError('confidence must be in (0, 1)')
  const meanA = mean(a)
  const meanB = mean(b)
  const qa = sampleVariance(a) / a.length
  const qb = sampleVariance(b) / b.length
  const difference = meanA - meanB
  const se = Math.sqrt(qa + qb)
  if (se === 0) {
    // Both samples constant: the difference is certain (or there is none).
    const t = difference === 0 ? Number.NaN : Math.sign(difference) * Number.POSITIVE_INFINITY
    return { meanA, meanB, difference, t, df: Number.NaN, p: difference === 0 ? 1 : 0, confidence, low: difference, high: difference }
  }
  const df = (qa + qb) ** 2 / (qa * qa / (a.length - 1) + qb * qb / (b.length - 1))
  const t = difference / se
  const p = 2 * studentTUpperTail(Math.abs(t), df)
  const q = studentTQuantile(1 - (1 - confidence) / 2, df)
  return { meanA, meanB, difference, t, df, p: Math.min(1, p), confidence, low: difference - q * se, high: difference + q * se }
}

/** P(T > t) for t ≥ 0 and Student's t with `df` degrees of freedom (df > 0, not necessarily an integer). */
export function studentTUpperTail (t: number, df: number): number {
  if (t === Number.POSITIVE_INFINITY) return 0
  // P(|T| > t) = I_{df/(df+t²)}(df/2, 1/2).
  return 0.5 * regularizedIncompleteBeta(df / (df + t * t), df / 2, 0.5)
}

/** The cumulative distribution function of Student's t with `df` degrees of freedom. */
export function studentTCdf (t: number, df: number): number {
  const upper = studentTUpperTail(Math.abs(t), df)
  return t >= 0 ? 1 - upper : upper
}

/** The `p`-quantile of Student's t with `df` degrees of freedom (R's `qt(p, df)`). */
export function studentTQuantile (p: number, df: number): number {
  if (!(p > 0 && p < 1)) throw new RangeError('p must be in (0, 1)')
  if (p === 0.5) return 0
  if (p < 0.5) return -studentTQuantile(1 - p, df)
  // The CDF is increasing: bracket, then bisect to double precision.
  let low = 0
  let high = 1
  while (studentTCdf(high, df) < p) {
    low = high
    high *= 2
    if (high > 1e300) return Number.POSITIVE_INFINITY
  }
  for (let i = 0; i < 200 && high - low > 1e-15 * high; i++) {
    const mid = (low + high) / 2
    if (studentTCdf(mid, df) < p) low = mid
    else high = mid
  }
  return (low + high) / 2
}

/** The regularized incomplete beta function I_x(a, b). */
export function regularizedIncompleteBeta (x: number, a: number, b: number): number {
  if (x <= 0) return 0
  if (x >= 1) return 1
  const front = Math.exp(logGamma(a + b) - logGamma(a) - logGamma(b) + a * Math.log(x) + b * Math.log(1 - x))
  // The continued fraction converges fast for x < (a + 1) / (a + b + 2); use the symmetry otherwise.
  if (x < (a + 1) / (a + b + 2)) return front * betaContinuedFraction(x, a, b) / a
  return 1 - front * betaContinuedFraction(1 - x, b, a) / b
}

// Modified Lentz's method for the continued fraction of I_x(a, b) (Numerical Recipes `betacf`).
function betaContinuedFraction (x: number, a: number, b: number): number {
  const tiny = 1e-300
  const epsilon = 1e-16
  const qab = a + b
  const qap = a + 1
  const qam = a - 1
  let c = 1
  let d = 1 - qab * x / qap
  if (Math.abs(d) < tiny) d = tiny
  d = 1 / d
  let h = d
  for (let m = 1; m <= 10_000; m++) {
    const m2 = 2 * m
    let aa = m * (b - m) * x / ((qam + m2) * (a + m2))
    d = 1 + aa * d
    if (Math.abs(d) < tiny) d = tiny
    c = 1 + aa / c
    if (Math.abs(c) < tiny) c = tiny
    d = 1 / d
    h *= d * c
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
    d = 1 + aa * d
    if (Math.abs(d) < tiny) d = tiny
    c = 1 + aa / c
    if (Math.abs(c) < tiny) c = tiny
    d = 1 / d
    const delta = d * c
    h *= delta
    if (Math.abs(delta - 1) < epsilon) break
  }
  return h
}

const LANCZOS = [
  0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
  -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7
]

/** ln Γ(x) for x > 0 (Lanczos approximation, g = 7; about 15 significant digits). */
export function logGamma (x: number): number {
  if (x < 0.5) return Math.log(Math.PI / Math.sin(Math.PI * x)) - logGamma(1 - x)
  const z = x - 1
  let sum = LANCZOS[0]!
  for (let i = 1; i < 9; i++) sum += LANCZOS[i]! / (z + i)
  const t = z + 7.5
  return 0.5 * Math.log(2 * Math.PI) + (z + 0.5) * Math.log(t) - t + Math.log(sum)
}
