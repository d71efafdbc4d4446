// A run: the driver of both sides, crash location and episode replay.
import { Client } from '../../reactor/krpc/client.js'
import { CalculatorService } from '../../examples/calculator/index.js'
import { ClientSide } from './client-side.js'
import { startChild, startInProcess } from './fuzz-server.js'
import { hex } from './model.js'
import { FOUND_BUGS, type FoundBug, type FuzzFailure, type FuzzOptions, type FuzzResult, HOST, MAX_FAILURES_KEPT, type ServerReport } from './options.js'
import { mib } from './report.js'
import { Rng, mix } from './rng.js'
import { ServerSide } from './server-side.js'

/** Runs the fuzzer; resolves with the tallies (failures included, never thrown). */
export async function runFuzz (options: FuzzOptions): Promise<FuzzResult> {
  const started = Date.now()
  const seed = (options.seed ?? 1) >>> 0
  const log = options.log ?? (() => {})
  const clientShare = Math.min(1, Math.max(0, options.clientShare ?? 0.3))
  const clientTarget = Math.round(options.mutants * clientShare)
  const serverTarget = options.mutants - clientTarget
  const mode = options.server ?? 'child'
  const failures: FuzzFailure[] = []
  let failureCount = 0
  // Set when the server crashed: what follows (refused connections) is not news.
  let crashSuspects: number[] | null = null
  const fail = (f: FuzzFailure): void => {
    if (crashSuspects !== null && f.kind !== 'server crash') return
    failureCount++
    if (failures.length < MAX_FAILURES_KEPT) failures.push(f)
    if (failureCount <= 5) log(`FAILURE ${f.kind}: ${f.detail}${f.episode === undefined ? '' : ` (seed ${f.seed}, episode ${f.episode}, batch ${f.batch})`}`)
  }
  const crashes: string[] = []
  let onServerCrash = (): void => {}
  const onUncaught = (err: unknown): void => {
    crashes.push(`${mode === 'in-process' ? 'fuzzer process (server in it)' : 'fuzzer process'}: ${(err as Error)?.stack ?? String(err)}`)
    if (mode === 'in-process') onServerCrash()
  }
  const onRejection = (err: unknown): void => { crashes.push(`fuzzer process, unhandled rejection: ${(err as Error)?.stack ?? String(err)}`) }
  process.on('uncaughtException', onUncaught)
  process.on('unhandledRejection', onRejection)

  const server = mode === 'child' ? await startChild(options.execArgv ?? process.execArgv) : await startInProcess()
  const endpoint = `${HOST}:${server.port}`
  const pool = new Rng(mix(seed, 0x9001)).bytes(1 << 18)
  const serverSide = new ServerSide(seed, server.port, pool, new Set(options.foundBugs ?? FOUND_BUGS), fail)
  const clientSide = new ClientSide(seed, fail)
  await clientSide.start()
  onServerCrash = () => {
    if (crashSuspects !== null) return
    crashSuspects = [...serverSide.inFlight].sort((a, b) => a - b)
    serverSide.stop()
    clientSide.stop()
  }
  server.onCrash = onServerCrash

  // A good client keeps calling the server through the run.
  const probeClient = new Client({ endpoint })
  const probes = { ok: 0, failed: 0 }
  let probeCalls = 0
  let probing = true
  const probeLoop = (async () => {
    for (let i = 0; probing; i++) {
      probeCalls++
      try {
        const res = await probeClient.service(CalculatorService).Add({ x: i, y: 1 }, { timeoutMs: 15_000 })
        if (res.result === i + 1) probes.ok++
        else { probes.failed++; fail({ kind: 'probe', detail: `wrong Add result ${res.result}`, seed }) }
      } catch (err) {
        probes.failed++
        fail({ kind: 'probe', detail: `a normal Add failed during the run: ${(err as Error).message}`, seed })
      }
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
  })()

  let stoppedEarly = false
  const maxMs = (options.maxSeconds ?? 3600) * 1000
  const watchdog = setInterval(() => {
    if (server.crashed !== null || crashes.length > 0 || Date.now() - started > maxMs) {
      if (server.crashed === null && crashes.length === 0) stoppedEarly = true
      serverSide.stop()
      clientSide.stop()
    }
  }, 250)
  // Progress, with both processes' RSS: memory that keeps growing over a long run is a leak.
  const progress = setInterval(() => {
    const total = serverSide.mutants + clientSide.mutants
    void server.report().catch(() => null).then((r) => {
      log(`${total.toLocaleString('en-US')} mutants (server ${serverSide.mutants.toLocaleString('en-US')}, client ${clientSide.mutants.toLocaleString('en-US')}), ` +
        `${serverSide.episodes.toLocaleString('en-US')} episodes, ${clientSide.calls.toLocaleString('en-US')} client calls, failures ${failureCount}, ` +
        `RSS server ${r === null ? '?' : mib(r.rssBytes / 1024)} fuzzer ${mib(process.memoryUsage().rss / 1024)}, ${Math.round((Date.now() - started) / 1000)} s`)
    })
  }, 10_000)

  await Promise.all([serverSide.run(serverTarget, options.concurrency ?? 32), clientSide.run(clientTarget, options.clientConcurrency ?? 64)])
  clearInterval(watchdog)
  clearInterval(progress)
  probing = false
  await probeLoop

  const crashed = (): boolean => crashSuspects !== null
  const stillWork = await clientSide.finish(crashed() ? null : endpoint)
  let finalOk = false
  if (!crashed()) {
    // The server still answers a normal Add after the run.
    const after = new Client({ endpoint })
    try {
      finalOk = (await after.service(CalculatorService).Add({ x: 40, y: 2 }, { timeoutMs: 15_000 })).result === 42
    } catch (err) {
      fail({ kind: 'probe', detail: `Add after the run failed: ${(err as Error).message}`, seed })
    }
    after.close()
    if (!finalOk) probes.failed++
    else probes.ok++
  }
  probeClient.close()
  await clientSide.close()
  for (const s of serverSide.sockets) s.destroy()

  // Closed connections reach the server's books a moment after they close here.
  let report: ServerReport | null = null
  for (let i = 0; i < 100 && !crashed(); i++) {
    report = await server.report().catch(() => null)
    if (report === null || (report.stats.connectionsOpen === 0 && report.stats.callsInFlight === 0)) break
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  const final = await server.close().catch(() => report)
  if (report !== null && (report.stats.connectionsOpen !== 0 || report.stats.callsInFlight !== 0)) {
    fail({ kind: 'server leak', detail: `${report.stats.connectionsOpen} connections and ${report.stats.callsInFlight} calls left open on the server after every peer closed`, seed })
  }
  const serverCalls = report?.stats.callsReceived ?? 0
  // The probes, the Add after the run, and the fuzzed clients' calls to the real server.
  const extraCalls = probeCalls + 1 + clientSide.realServerCalls
  if (report !== null && !crashed() && serverCalls !== serverSide.callsAccepted + extraCalls) {
    fail({ kind: 'call count', detail: `the server received ${serverCalls} calls; the model accepted ${serverSide.callsAccepted} (+${extraCalls} normal calls)`, seed })
  }
  if ((report?.unauthenticatedCalls ?? 0) > 0) {
    const episodes = serverSide.refusalEpisodes.length > 0 ? `; episodes with calls behind a refused SASL step: ${serverSide.refusalEpisodes.join(', ')}` : ''
    fail({ kind: 'unauthenticated calls', detail: `${report!.unauthenticatedCalls} calls reached a handler on connections whose negotiation failed${episodes}`, seed })
  }
  if (server.crashed !== null) crashes.push(`server: ${server.crashed}`)
  if (crashSuspects !== null) {
    // Which episode did it: each one running at the crash, alone, against a fresh server.
    const suspects: number[] = crashSuspects
    crashSuspects = null
    const found = await locateCrash(seed, suspects, options, log)
    if (found !== null) fail(found)
    crashSuspects = suspects
  }
  // Give socket handles a turn to go.
  await new Promise((resolve) => setImmediate(resolve))
  process.off('uncaughtException', onUncaught)
  process.off('unhandledRejection', onRejection)
  const openSocketsAtEnd = serverSide.sockets.size + clientSide.conns.size
  const fuzzerPeak = process.resourceUsage().maxRSS
  const clientMutants = clientSide.mutants
  return {
    seed,
    mutants: { total: serverSide.mutants + clientMutants, serverFrames: serverSide.mutantsFrames, negotiation: serverSide.mutantsNegotiation, client: clientMutants },
    server: {
      mode,
      episodes: serverSide.episodes,
      batches: serverSide.batches,
      callsPredicted: serverSide.callsPredicted,
      callsAnsweredOnce: serverSide.callsAnsweredOnce,
      answersDroppedAtClose: serverSide.answersDroppedAtClose,
      closedAsPredicted: serverSide.closedAsPredicted,
      closedWhileWaiting: serverSide.closedWhileWaiting,
      badFramesClosed: final?.stats.badFrames ?? 0,
      badFramesModel: serverSide.badFramesModel,
      callsReceived: serverCalls,
      callsReceivedModel: serverSide.callsAccepted + extraCalls,
      unauthenticatedCalls: final?.unauthenticatedCalls ?? 0,
      probes,
      answersAfterRun: finalOk,
      connectionsOpenAtEnd: report?.stats.connectionsOpen ?? -1,
      callsInFlightAtEnd: report?.stats.callsInFlight ?? -1
    },
    client: {
      calls: clientSide.calls,
      settledOnce: clientSide.settledOnce,
      settledTwice: clientSide.settledTwice,
      settledBeforeReturn: clientSide.settledBeforeReturn,
      neverSettled: clientSide.neverSettled,
      outcomes: clientSide.outcomes,
      fakeConnections: clientSide.fakeConnections,
      stalledClosed: clientSide.stalledClosed,
      clientsClosed: clientSide.clientsClosed,
      stillWork
    },
    crashes: { count: crashes.length, details: crashes.slice(0, 5) },
    failures,
    failureCount,
    rss: { serverPeakKiB: final?.maxRssKiB ?? 0, fuzzerPeakKiB: fuzzerPeak, serverEndBytes: final?.rssBytes ?? 0 },
    cpuMs: { server: final?.cpuMs ?? 0, fuzzer: Math.round((process.cpuUsage().user + process.cpuUsage().system) / 1000) },
    openSocketsAtEnd,
    stoppedEarly,
    wallMs: Date.now() - started
  }
}

/** Replays each suspect episode alone against a fresh server; the first that crashes it, with its bytes. */
async function locateCrash (seed: number, suspects: readonly number[], options: FuzzOptions, log: (line: string) => void): Promise<FuzzFailure | null> {
  const pool = new Rng(mix(seed, 0x9001)).bytes(1 << 18)
  for (const index of suspects.slice(0, 64)) {
    const server = options.server === 'in-process' ? await startInProcess() : await startChild(options.execArgv ?? process.execArgv)
    let bytes = ''
    let thrown: string | null = null
    const onUncaught = (err: unknown): void => { thrown = (err as Error)?.stack ?? String(err) }
    if (options.server === 'in-process') process.on('uncaughtException', onUncaught)
    const side = new ServerSide(seed, server.port, pool, new Set(options.foundBugs ?? FOUND_BUGS), (f) => { bytes = f.bytesHex ?? bytes })
    await side.episode(index).catch(() => {})
    await new Promise((resolve) => setTimeout(resolve, 200))
    process.off('uncaughtException', onUncaught)
    const crash: string | null = server.crashed ?? thrown
    if (server.crashed === null) await server.close().catch(() => null)
    if (crash !== null) {
      log(`the server crash is episode ${index} of seed ${seed}`)
      return { kind: 'server crash', detail: `${crash.split('\n').slice(0, 3).join(' | ')}`, seed, episode: index, batch: -1, bytesHex: bytes }
    }
  }
  return { kind: 'server crash', detail: `not reproduced by any of the ${suspects.length} episodes running at the time, each alone`, seed }
}

/** Sends episode `index` of `seed` alone to a fresh server and prints what it wrote and what came back. */
export async function replayEpisode (seed: number, index: number, options: { foundBugs?: readonly FoundBug[], server?: 'child' | 'in-process' } = {}): Promise<number> {
  const failures: FuzzFailure[] = []
  const server = options.server === 'in-process' ? await startInProcess() : await startChild(process.execArgv)
  const pool = new Rng(mix(seed >>> 0, 0x9001)).bytes(1 << 18)
  const side = new ServerSide(seed >>> 0, server.port, pool, new Set(options.foundBugs ?? FOUND_BUGS), (f) => failures.push(f))
  const out = (line: string): void => { process.stdout.write(`${line}\n`) }
  const written = await side.episode(index, out)
  await new Promise((resolve) => setTimeout(resolve, 200))
  const crashed = server.crashed
  if (crashed === null) {
    const report = await server.close()
    out(`server: ${JSON.stringify(report.stats)}; unauthenticated calls ${report.unauthenticatedCalls}`)
    if (report.stats.callsReceived !== side.callsAccepted) {
      failures.push({ kind: 'call count', detail: `the server received ${report.stats.callsReceived} calls; the model accepted ${side.callsAccepted}`, seed, episode: index })
    }
    if (report.unauthenticatedCalls > 0) {
      failures.push({ kind: 'unauthenticated calls', detail: `${report.unauthenticatedCalls} calls reached a handler on a connection whose negotiation failed`, seed, episode: index })
    }
  }
  out(`bytes written (hex): ${written.toString('hex')}`)
  for (const f of failures) out(`FAILURE ${f.kind}: ${f.detail}`)
  if (failures.length === 0 && crashed === null) out('no failure')
  if (crashed !== null) out(`SERVER CRASHED: ${crashed}`)
  return failures.length > 0 || crashed !== null ? 1 : 0
}
