/**
 * The resilience suite (bench/resilience): its row arithmetic on made-up
 * calls, always; and, where this process is root and `ip netns` works,
 * the quick run itself (`--quick`, compiled, about 2.5 minutes), whose
 * exit status and rows are checked, and after which no namespace or
 * process of its own is left. Elsewhere that part is skipped with the reason.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { execFileSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { netnsUnavailable } from '../../bench/resilience/netns.js'
import { SCENARIOS } from '../../bench/resilience/scenarios.js'
import { rowOf, type Row, type RunFacts } from '../../bench/resilience/table.js'
import type { CallRecord, LoadResult } from '../../bench/resilience/load.js'
import { ProtocolClient } from '../../reactor/protocol-client.js'
import { taggedClientProtocol } from '../helpers/toy-client-protocols.js'

t.setTimeout(300_000)

const MAIN = fileURLToPath(new URL('../../dist/bench/resilience/main.js', import.meta.url))

function facts (over: Partial<RunFacts> = {}): RunFacts {
  return { protocol: 'p', scenario: 's', deadlineMs: 1000, faults: [1000], lastHeal: 3000, badNames: ['h1'], badKeys: ['10.201.1.2:7000'], executions: new Map(), problems: [], ...over }
}

function result (calls: CallRecord[], over: Partial<LoadResult> = {}): LoadResult {
  return { type: 'result', issued: calls.length, calls, ejections: [], stats: null, messages: {}, leftovers: [], ...over }
}

t.test('a row: the detection window is not judged, late answers fail, take back is the first answer from the bad host', async t => {
  const calls: CallRecord[] = [
    [0, 5, 'OK', 'h1', 1, 0],
    [1200, 1000, 'RPC_ERR_DEADLINE_EXCEEDED', '', 1, 1], // in the window
    [2500, 5, 'OK', 'h2', 1, 2],
    [2600, 1001, 'OK', 'h2', 1, 3], // late
    [3100, 10, 'OK', 'h1', 1, 4],
    [3200, 10, 'RPC_ERR_CONNECTION_CLOSED', '', 0, 5] // not idempotent: not judged
  ]
  const row = rowOf(result(calls, { ejections: [[0, []], [1300, ['10.201.1.2:7000']], [2000, []]] }), facts())
  t.equal(row.offered, 6)
  t.equal(row.judged, 4)
  t.equal(row.succeeded, 3)
  t.equal(row.succeededAll, 3)
  t.same(row.failedByCode, { RPC_ERR_DEADLINE_EXCEEDED: 1, LATE: 1, RPC_ERR_CONNECTION_CLOSED: 1 })
  t.equal(row.ejectMs, 300)
  t.equal(row.takeBackMs, 110)
  t.match(row.missed, [/success 75.00 %/])
})

t.test('a row: ids run twice, calls that never settled and leftovers are misses', async t => {
  const calls: CallRecord[] = [[3500, 5, 'OK', 'h1', 1, 0]]
  const row: Row = rowOf(result(calls, { issued: 2, leftovers: ['TCPSocketWrap'] }), facts({ executions: new Map([['7', 1], ['8', 2]]) }))
  t.equal(row.executedTwice, 1)
  t.match(row.missed, [/1 non-idempotent calls ran twice/, /1 calls never settled/, /left open after close\(\): TCPSocketWrap/])
  const never = rowOf(result([[0, 5, 'OK', 'h2', 1, 0]]), facts())
  t.match(never.missed, [/take back never/])
  t.equal(never.ejectMs, null)
})

const unavailable = netnsUnavailable()

// The targets need the clients' outlier ejection; a client without it (no `ejection` in its stats) runs the suite with the verdict as a todo.
function clientsEject (): boolean {
  const client = new ProtocolClient(taggedClientProtocol(), { endpoint: '127.0.0.1:1', logger: null })
  const has = 'ejection' in client.stats()
  void client.close()
  return has
}

t.test('the quick run in network namespaces', { skip: unavailable === null ? false : `no network namespaces here: ${unavailable}` }, async t => {
  const todo = clientsEject() ? false : 'the clients have no outlier ejection yet'
  t.ok(existsSync(MAIN), 'the suite is compiled (npm test runs tsc first)')
  const dir = mkdtempSync(join(tmpdir(), 'nyala-resilience-test-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const json = join(dir, 'rows.json')
  const child = spawn(process.execPath, [MAIN, '--quick', '--json', json], { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stdout.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr.on('data', (d: Buffer) => { out += d.toString() })
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve))
  const pid = child.pid!
  t.not(code, 2, `the suite ran to its end:\n${out}`)
  const rows = JSON.parse(readFileSync(json, 'utf8')) as Row[]
  t.same(rows.map((r) => `${r.protocol} ${r.scenario}`), ['krpc', 'memcached'].flatMap((p) => SCENARIOS.map((s) => `${p} ${s.name}`)), 'one row per protocol and scenario')
  // The take-back target is a duration (a restarted host serving again
  // within 5 s of the heal, its process start and the clients' backoff
  // included): on a loaded machine it can pass it, so here it is reported
  // (a todo), and `npm run resilience` on its own is its judge. Every other
  // target counts outcomes and is asserted.
  const timed = (m: string): boolean => m.startsWith('take back')
  const missedTime = rows.some((r) => r.missed.some(timed))
  t.equal(code, 0, `the quick run met every target:\n${out}`, { todo: todo !== false ? todo : missedTime ? 'a take back past 5 s on this machine (a duration; npm run resilience judges it)' : false })
  for (const row of rows) {
    t.same(row.missed.filter((m) => !timed(m)), [], `${row.protocol} ${row.scenario}: no target missed`, { todo })
    const late = row.missed.filter(timed)
    t.same(late, [], `${row.protocol} ${row.scenario}: taken back within 5 s`, { todo: todo !== false ? todo : late.length > 0 ? 'a duration on a loaded machine; npm run resilience judges it' : false })
    t.equal(row.executedTwice, 0, `${row.protocol} ${row.scenario}: no non-idempotent call ran twice`)
    t.ok(row.offered > 0, `${row.protocol} ${row.scenario}: load was offered`)
  }
  const left = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }).split('\n').filter((l) => l.startsWith(`nyr${pid}`))
  t.same(left, [], 'no namespace of the run is left')
})
