/**
 * One scenario's row: what the calls saw, judged against the targets.
 *
 * - success: idempotent calls answered within their deadline, of those
 *   started outside a detection window (one deadline from each fault);
 *   target ≥ 99.9 %.
 * - executed twice: non-idempotent ids the hosts ran more than once; target 0.
 * - eject: from the fault to the client's ejecting every bad host (its
 *   stats), '-' when the client never did.
 * - take back: from the last heal (once in effect: a restarted host
 *   listening again) to the first answer served by every bad host;
 *   target ≤ 5 s.
 * - left: what the client left open after close(), processes that
 *   crashed, calls that never settled; target none.
 */
import type { LoadResult } from './load.js'

/** The targets. */
export const TARGETS = { successShare: 0.999, takeBackMs: 5000 }

/** The measured row of one scenario. */
export interface Row {
  protocol: string
  scenario: string
  offered: number
  /** Idempotent calls judged (outside detection windows) and those of them answered in time. */
  judged: number
  succeeded: number
  /** Every call answered within its deadline, windows included. */
  succeededAll: number
  failedByCode: Record<string, number>
  executedTwice: number
  ejectMs: number | null
  takeBackMs: number | null
  problems: string[]
  missed: string[]
}

/** What the runner knows of one run, besides the load's result. */
export interface RunFacts {
  protocol: string
  scenario: string
  deadlineMs: number
  faults: number[]
  /** ms from the load's start when the last heal had taken effect. */
  lastHeal: number
  /** The bad hosts' names ('h1') and their endpoint keys ('10.201.1.2:7000'). */
  badNames: string[]
  badKeys: string[]
  executions: Map<string, number>
  /** Processes that died unasked, a load that did not exit by itself... */
  problems: string[]
}

/** The row of `result` under `facts`. */
export function rowOf (result: LoadResult, facts: RunFacts): Row {
  const failedByCode: Record<string, number> = {}
  let judged = 0
  let succeeded = 0
  let succeededAll = 0
  const inWindow = (start: number): boolean => facts.faults.some((f) => start >= f && start < f + facts.deadlineMs)
  const firstServed = new Map<string, number>()
  for (const [start, latency, code, host, idempotent] of result.calls) {
    const ok = code === 'OK' && latency <= facts.deadlineMs
    if (ok) succeededAll++
    else failedByCode[code === 'OK' ? 'LATE' : code] = (failedByCode[code === 'OK' ? 'LATE' : code] ?? 0) + 1
    if (idempotent === 1 && !inWindow(start)) {
      judged++
      if (ok) succeeded++
    }
    if (ok && start + latency >= facts.lastHeal && facts.badNames.includes(host)) {
      const at = start + latency - facts.lastHeal
      if (!firstServed.has(host) || firstServed.get(host)! > at) firstServed.set(host, at)
    }
  }
  let executedTwice = 0
  for (const n of facts.executions.values()) if (n > 1) executedTwice++
  const faultAt = facts.faults[0] ?? 0
  let ejectMs: number | null = null
  for (const [at, hosts] of result.ejections) {
    if (at >= faultAt && facts.badKeys.every((k) => hosts.includes(k))) { ejectMs = at - faultAt; break }
  }
  const takeBackMs = facts.badNames.every((n) => firstServed.has(n)) ? Math.max(...facts.badNames.map((n) => firstServed.get(n)!)) : null
  const problems = [...facts.problems]
  if (result.calls.length !== result.issued) problems.push(`${result.issued - result.calls.length} calls never settled`)
  if (result.leftovers.length > 0) problems.push(`left open after close(): ${result.leftovers.join(', ')}`)
  const missed: string[] = []
  if (judged === 0 || succeeded / judged < TARGETS.successShare) missed.push(`success ${pct(succeeded, judged)} < 99.9 %`)
  if (executedTwice > 0) missed.push(`${executedTwice} non-idempotent calls ran twice`)
  if (takeBackMs === null || takeBackMs > TARGETS.takeBackMs) missed.push(`take back ${takeBackMs === null ? 'never' : `${Math.round(takeBackMs)} ms`} > 5 s`)
  if (problems.length > 0) missed.push(...problems)
  return { protocol: facts.protocol, scenario: facts.scenario, offered: result.issued, judged, succeeded, succeededAll, failedByCode, executedTwice, ejectMs, takeBackMs, problems, missed }
}

function pct (n: number, of: number): string {
  return of === 0 ? '-' : `${(100 * n / of).toFixed(2)} %`
}

function ms (v: number | null): string {
  return v === null ? '-' : `${(v / 1000).toFixed(2)} s`
}

function codes (c: Record<string, number>): string {
  const parts = Object.entries(c).sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k.replace(/^RPC_ERR_/, '')} ${n}`)
  return parts.length === 0 ? '-' : parts.join(', ')
}

/** The table of `rows`, as Markdown. */
export function formatTable (rows: readonly Row[]): string {
  const lines = [
    '| protocol | scenario | offered | ok in deadline (all) | ok after detection (target ≥ 99.9 %) | failed by code | executed twice | eject | take back | verdict |',
    '|---|---|---:|---:|---:|---|---:|---:|---:|---|'
  ]
  for (const r of rows) {
    lines.push(`| ${r.protocol} | ${r.scenario} | ${r.offered} | ${r.succeededAll} | ${r.succeeded}/${r.judged} = ${pct(r.succeeded, r.judged)} | ${codes(r.failedByCode)} | ${r.executedTwice} | ${ms(r.ejectMs)} | ${ms(r.takeBackMs)} | ${r.missed.length === 0 ? 'pass' : `MISS: ${r.missed.join('; ')}`} |`)
  }
  return lines.join('\n')
}
