import hdr from 'hdr-histogram-js'
import type { Histogram } from 'hdr-histogram-js'

/**
 * Call latencies in microseconds, recorded in each load process with an
 * HdrHistogram (3 significant digits, 1 µs to 60 s) and merged in the bench
 * process. A histogram crosses the process boundary as HdrHistogram's
 * compressed base64 encoding, so merging is exact: the merged percentiles
 * are those of all the calls, not an average of per-process percentiles.
 */
export type LatencyHistogram = Histogram

/** Largest latency recorded exactly; longer calls are clamped to it. */
export const MAX_LATENCY_US = 60_000_000

/** A new, empty latency histogram. */
export function createLatencyHistogram (): LatencyHistogram {
  return hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: MAX_LATENCY_US, numberOfSignificantValueDigits: 3 })
}

/** Records one call that took `micros` µs (rounded; at least 1, at most MAX_LATENCY_US). */
export function recordLatency (histogram: LatencyHistogram, micros: number): void {
  histogram.recordValue(micros < 1 ? 1 : micros > MAX_LATENCY_US ? MAX_LATENCY_US : Math.round(micros))
}

/** The histogram as a string that `mergeLatencies` reads back. */
export function encodeLatencies (histogram: LatencyHistogram): string {
  return hdr.encodeIntoCompressedBase64(histogram)
}

/** One histogram holding every value of the encoded histograms (from several load processes). */
export function mergeLatencies (encoded: readonly string[]): LatencyHistogram {
  const merged = createLatencyHistogram()
  for (const e of encoded) merged.add(hdr.decodeFromCompressedBase64(e))
  return merged
}

/** Calls recorded and the percentiles `nyala bench` reports, in µs (NaN when nothing was recorded). */
export interface LatencySummary {
  count: number
  p50Us: number
  p99Us: number
  p999Us: number
}

/** The reported percentiles of `histogram`. */
export function summarizeLatencies (histogram: LatencyHistogram): LatencySummary {
  const count = histogram.totalCount
  if (count === 0) return { count, p50Us: Number.NaN, p99Us: Number.NaN, p999Us: Number.NaN }
  return {
    count,
    p50Us: histogram.getValueAtPercentile(50),
    p99Us: histogram.getValueAtPercentile(99),
    p999Us: histogram.getValueAtPercentile(99.9)
  }
}
