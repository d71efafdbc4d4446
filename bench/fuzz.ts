/**
 * A mutation fuzzer for nyala's KRPC server and client.
 *
 *   node dist/bench/fuzz.js --mutants N [--seed S] [--json] [--concurrency C]
 *       [--client-share F] [--in-process] [--max-seconds T] [--found-bugs LIST]
 *   node dist/bench/fuzz.js --replay-episode I [--seed S] [--found-bugs LIST]
 *
 * Server side: a real `Server` with the demo CalculatorService (in a child
 * process by default, so its crashes show as exits and its peak RSS is its
 * own) takes raw loopback connections. Each connection (an "episode") sends
 * the handshake, sometimes mutated (noise before or inside negotiation, bad
 * preambles, wrong steps, refused credentials), then batches of request
 * frames of Add, Echo, PushStrings and EchoSidecars, most of them mutated:
 * bit flips, truncations, insertions, lying length prefixes and varints,
 * random header protobufs, bad sidecar offsets, splices and noise. A model
 * built from the codec (`ServerModel`) reads the same bytes as the server
 * would and predicts what must come back: each negotiation answer byte for
 * byte, exactly one answer per accepted call (with the right result or
 * error code), and whether the connection must be closed. The server may
 * only differ where the model says it is waiting for bytes (a partial
 * frame or an unfinished negotiation: a limit or a deadline may close it).
 * Everything else is a failure, reported with the seed, the episode and the
 * bytes written, which `--replay-episode` sends again alone.
 *
 * Client side: real `Client`s call a fake server that negotiates (sometimes
 * with noise or mutated answers) and answers each call with a mutated
 * response frame: wrong call ids, lying lengths, bad sidecar offsets, error
 * frames with any code, duplicates, noise, splits, delays, no answer,
 * closes. Every call must settle exactly once, never before it returned
 * (callback form), and by its deadline plus a grace period.
 *
 * A mutant is one mutated input: a mutated frame or noise burst sent to the
 * server, a mutated handshake, or a mutated answer (or negotiation) of the
 * fake server. Each episode's bytes depend only on the seed and its index;
 * the client side's answers depend on the seed, the connection and the
 * calls that arrive (so on timing).
 *
 * Inputs that found product bugs stay in the mix (`--found-bugs`, default
 * `all`; a comma-separated list, or '' to leave them out): method names
 * that are Object.prototype keys (`toString`, `constructor`, ...: the
 * server threw out of its read callback and died), and calls pipelined
 * behind credentials the asynchronous authenticator refuses, with no
 * ConnectionContext (they reached their handlers). Both are fixed and
 * have regression tests in test/krpc/hostile.test.ts.
 *
 * This file is the command line and the run's public face; the parts live
 * in bench/fuzz/ by role: options.ts (options, results, shared constants),
 * rng.ts (the seeded PRNG), frames.ts (frame writing), request-mutator.ts
 * and handshake-mutator.ts (the server side's inputs), model.ts (the
 * oracle), fuzz-server.ts (the server under test, here or in a child),
 * server-side.ts (the episodes against it), fake-server.ts and
 * client-side.ts (real clients against mutated answers), run.ts (the
 * driver, crash location, replay) and report.ts (the result as text).
 */
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { serverChild } from './fuzz/fuzz-server.js'
import { FOUND_BUGS, type FoundBug } from './fuzz/options.js'
import { formatResult } from './fuzz/report.js'
import { replayEpisode, runFuzz } from './fuzz/run.js'

export { FOUND_BUGS, FUZZ_MAX_MESSAGE_BYTES, type FoundBug, type FuzzFailure, type FuzzOptions, type FuzzResult, type ServerReport } from './fuzz/options.js'
export { Rng, mix } from './fuzz/rng.js'
export { formatResult } from './fuzz/report.js'
export { replayEpisode, runFuzz } from './fuzz/run.js'

async function main (): Promise<number> {
  const { values } = parseArgs({
    options: {
      mutants: { type: 'string', default: '10000' },
      seed: { type: 'string', default: '1' },
      json: { type: 'boolean', default: false },
      concurrency: { type: 'string' },
      'client-concurrency': { type: 'string' },
      'client-share': { type: 'string' },
      'in-process': { type: 'boolean', default: false },
      'max-seconds': { type: 'string' },
      'found-bugs': { type: 'string', default: 'all' },
      'replay-episode': { type: 'string' }
    },
    strict: true
  })
  const seed = Number(values.seed)
  if (!Number.isInteger(seed)) throw new Error(`--seed must be an integer, got '${values.seed}'`)
  const names = values['found-bugs'] === 'all' ? FOUND_BUGS : values['found-bugs'].split(',').filter(b => b !== '')
  for (const b of names) if (!(FOUND_BUGS as readonly string[]).includes(b)) throw new Error(`unknown --found-bugs entry '${b}'; known: ${FOUND_BUGS.join(', ')}, all`)
  const foundBugs = names as FoundBug[]
  if (values['replay-episode'] !== undefined) {
    return await replayEpisode(seed, Number(values['replay-episode']), { foundBugs, server: values['in-process'] ? 'in-process' : 'child' })
  }
  const mutants = Number(values.mutants)
  if (!Number.isInteger(mutants) || mutants < 0) throw new Error(`--mutants must be a non-negative integer, got '${values.mutants}'`)
  const num = (v: string | undefined): number | undefined => v === undefined ? undefined : Number(v)
  const result = await runFuzz({
    mutants,
    seed,
    concurrency: num(values.concurrency),
    clientConcurrency: num(values['client-concurrency']),
    clientShare: num(values['client-share']),
    server: values['in-process'] ? 'in-process' : 'child',
    maxSeconds: num(values['max-seconds']),
    foundBugs,
    log: values.json ? undefined : (line) => process.stderr.write(`${line}\n`)
  })
  process.stdout.write(values.json ? `${JSON.stringify(result)}\n` : `${formatResult(result)}\n`)
  const ok = result.crashes.count === 0 && result.failureCount === 0
  return ok ? 0 : 1
}

const entry = process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]
if (process.argv[2] === '--server-child') {
  await serverChild()
} else if (entry) {
  process.exitCode = await main()
}
