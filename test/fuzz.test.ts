// The mutation fuzzer of bench/fuzz.ts as part of the suite: a
// short seeded run against a live server (mutated handshakes and request
// frames, checked against the codec's model of what must come back) and,
// through its fake server, against real clients (mutated answers, each call
// counted as it settles). Long runs: `npm run fuzz -- --mutants N`.
// Nothing here asserts a duration or a rate.
import t, { type Test } from 'tap'
import { formatResult, runFuzz, type FuzzResult } from '../bench/fuzz.js'

// Only the TypeScript loader goes to the server child: coverage and mocking hooks stay here.
const LOADER = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))

/** TCP handles (sockets and listeners) this process holds. */
function tcpHandles (): number {
  return process.getActiveResourcesInfo().filter((r) => r === 'TCPSocketWrap' || r === 'TCPServerWrap').length
}

function check (t: Test, result: FuzzResult, mutants: number): void {
  if (result.failureCount > 0 || result.crashes.count > 0) t.comment(formatResult(result))
  t.ok(result.mutants.total >= mutants, `${result.mutants.total} mutants sent`)
  t.ok(result.mutants.serverFrames > 0 && result.mutants.negotiation > 0 && result.mutants.client > 0, 'frames, handshakes and answers were all mutated')
  t.equal(result.crashes.count, 0, 'no uncaught exception or rejection: the server loop and the clients never threw')
  t.same(result.failures.map((f) => `${f.kind}: ${f.detail}`), [], 'the server did what the model predicted (answers, closes), and every check held')
  t.equal(result.failureCount, 0)

  // Every client call settled exactly once.
  const c = result.client
  t.ok(c.calls > 0, `${c.calls} client calls`)
  const settlements = Object.values(c.outcomes).reduce((a, b) => a + b, 0)
  t.equal(settlements, c.calls, 'one settlement per call, counted by outcome code')
  t.equal(c.settledOnce, c.calls, 'each call settled exactly once')
  t.equal(c.settledTwice, 0, 'none settled twice')
  t.equal(c.neverSettled, 0, 'none left unsettled past its deadline')
  t.equal(c.settledBeforeReturn, 0, 'no callback ran before its call returned')
  t.ok(c.stillWork, 'the fuzzed clients still call a real server afterwards')

  // The server still serves, and kept nothing.
  const s = result.server
  t.ok(s.callsAnsweredOnce > 0 && s.closedAsPredicted > 0, `${s.callsAnsweredOnce} calls answered once, ${s.closedAsPredicted} connections closed as predicted`)
  t.equal(s.probes.failed, 0, 'normal Add calls during the run were answered')
  t.ok(s.answersAfterRun, 'a normal Add is answered after the run')
  t.equal(s.callsReceived, s.callsReceivedModel, 'the server received the calls the model accepted')
  t.equal(s.badFramesClosed, s.badFramesModel, 'and counted the bad frames the model found')
  t.equal(s.unauthenticatedCalls, 0, 'no call ran on a connection that did not negotiate')
  t.equal(s.connectionsOpenAtEnd, 0, 'no connection left open on the server')
  t.equal(s.callsInFlightAtEnd, 0, 'no call left in flight on the server')
  t.equal(result.openSocketsAtEnd, 0, 'every socket of the fuzzer closed')
}

t.test('a seeded run: the server in this process', async (t) => {
  const before = tcpHandles()
  const mutants = 3000
  const result = await runFuzz({ mutants, seed: 20_251_130, server: 'in-process' })
  check(t, result, mutants)
  t.equal(result.server.mode, 'in-process')
  // Closed sockets give their handles back within a few turns.
  for (let i = 0; i < 50 && tcpHandles() > before; i++) await new Promise((resolve) => setTimeout(resolve, 10))
  t.equal(tcpHandles(), before, 'no TCP handle left behind in this process')
})

t.test('a seeded run: the server in a child process', async (t) => {
  const before = tcpHandles()
  const mutants = 1500
  const result = await runFuzz({ mutants, seed: 7, server: 'child', execArgv: LOADER })
  check(t, result, mutants)
  t.equal(result.server.mode, 'child')
  t.ok(result.rss.serverPeakKiB > 0, `the child reported its peak RSS (${Math.round(result.rss.serverPeakKiB / 1024)} MiB)`)
  for (let i = 0; i < 50 && tcpHandles() > before; i++) await new Promise((resolve) => setTimeout(resolve, 10))
  t.equal(tcpHandles(), before, 'no TCP handle left behind in this process')
})
