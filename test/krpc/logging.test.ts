/**
 * Logging (reactor/logger.ts, docs/logging.md): an embedded Server warns on
 * stderr by default and is silenced by `logger: null`; the console logger's
 * levels; structured fields reach a custom logger, also one whose methods
 * need their `this`; the pino adapter of docs/logging.md with a fake pino.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { connect, type Socket } from 'node:net'
import { fileURLToPath } from 'node:url'
import { consoleLogger, resolveLogger, silentLogger, type LogFields, type Logger } from '../../reactor/logger.js'
import { Server } from '../../reactor/krpc/server.js'
import { Client } from '../../reactor/krpc/client.js'
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'
import * as nyala from '../../reactor/index.js'
import { KrpcServer } from '../../reactor/krpc/index.js'
import { FakeServer } from '../helpers/krpc-peers.js'

t.setTimeout(120_000)

const SERVER = fileURLToPath(new URL('../../reactor/krpc/server.ts', import.meta.url))
const LOADER = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))

interface Event { level: string, message: string, fields: LogFields | undefined }

/** A logger that records every event; its methods use `this`, as a class-based logger's do. */
class Recorder implements Logger {
  readonly events: Event[] = []
  error (message: string, fields?: LogFields): void { this.events.push({ level: 'error', message, fields }) }
  warn (message: string, fields?: LogFields): void { this.events.push({ level: 'warn', message, fields }) }
  info (message: string, fields?: LogFields): void { this.events.push({ level: 'info', message, fields }) }
  debug (message: string, fields?: LogFields): void { this.events.push({ level: 'debug', message, fields }) }
  count (level: string): number { return this.events.filter(e => e.level === level).length }
}

/** Resolves when `predicate()` holds, polling (no duration is asserted). */
async function until (predicate: () => boolean, what: string, limitMs = 20_000): Promise<void> {
  const start = Date.now()
  while (!predicate()) {
    if (Date.now() - start > limitMs) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

/** Opens a socket, writes `bytes` and resolves once the server has closed it. */
async function sendGarbage (port: number, bytes = 'GET / HTTP/1.1\r\n\r\n'): Promise<void> {
  const socket = connect({ host: '127.0.0.1', port })
  socket.on('error', () => {})
  await new Promise<void>((resolve) => {
    socket.once('close', () => resolve())
    socket.once('connect', () => socket.write(bytes))
  })
}

/**
 * Runs, in a child process, a Server with `serverOptions` (source text) that
 * receives garbage on one connection and then closes; resolves with its stderr.
 */
async function childServer (serverOptions: string, env: NodeJS.ProcessEnv = {}): Promise<{ code: number | null, stderr: string }> {
  const script = `
    const { Server } = await import(${JSON.stringify(SERVER)})
    const { connect } = await import('node:net')
    const server = new Server(${serverOptions})
    const { port } = await server.listen(0, '127.0.0.1')
    await new Promise((resolve) => {
      const socket = connect({ host: '127.0.0.1', port })
      socket.on('error', () => {})
      socket.once('close', resolve)
      socket.once('connect', () => socket.write('GET / HTTP/1.1\\r\\n\\r\\n'))
    })
    await server.close({ graceMs: 0 })`
  const childEnv = { ...process.env, ...env }
  if (env.NYALA_LOG_LEVEL === undefined) delete childEnv.NYALA_LOG_LEVEL
  const child = spawn(process.execPath, [...LOADER, '--input-type=module', '-e', script], { stdio: ['ignore', 'ignore', 'pipe'], env: childEnv })
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000)
  let stderr = ''
  child.stderr!.on('data', (d: Buffer) => { stderr += d.toString() })
  const code = await new Promise<number | null>((resolve) => child.once('close', (c) => resolve(c)))
  clearTimeout(timer)
  return { code, stderr }
}

t.test('an embedded Server warns on stderr by default; logger: null and NYALA_LOG_LEVEL=error silence it', async (t) => {
  const byDefault = await childServer('{}')
  t.equal(byDefault.code, 0, byDefault.stderr)
  t.match(byDefault.stderr, /^\S+ WARN .*127\.0\.0\.1:\d+/m, 'a warning about the peer, on stderr')

  const silenced = await childServer('{ logger: null }')
  t.equal(silenced.code, 0, silenced.stderr)
  t.equal(silenced.stderr, '', 'logger: null writes nothing')

  const errorsOnly = await childServer('{}', { NYALA_LOG_LEVEL: 'error' })
  t.equal(errorsOnly.code, 0, errorsOnly.stderr)
  t.equal(errorsOnly.stderr, '', 'the level is settable from the environment')
})

t.test('consoleLogger: warnings and errors by default, levels, fields on request, one line per event', async (t) => {
  const lines: string[] = []
  const stream = { write: (line: string) => lines.push(line) }
  const log = consoleLogger({ stream })
  log.error('broke', { code: 'EADDRINUSE' })
  log.warn('odd\nthing')
  log.info('fyi')
  log.debug('detail')
  t.equal(lines.length, 2)
  t.match(lines[0], /^\d{4}-\d\d-\d\dT\S+ ERROR broke\n$/)
  t.match(lines[1], /^\S+ WARN odd\\nthing\n$/, 'a message stays on one line')

  lines.length = 0
  const all = consoleLogger({ stream, level: 'debug', fields: true })
  all.debug('d', { remote: '127.0.0.1:5', note: 'two words', n: 3, err: new Error('bad') })
  all.info('i')
  t.same(lines.map(l => l.split(' ').slice(1).join(' ')), ['DEBUG d remote=127.0.0.1:5 note="two words" n=3 err="bad"\n', 'INFO i\n'])

  // Text from peers: no control character reaches the terminal or the log file as it is.
  lines.length = 0
  all.warn('a\rb\r\nc\x1b[31md\x00e\x07f\tg\x7fh\u009bi', { peer: 'x\x1b[2Jy', line: 'one\rtwo', bell: '\x07' })
  t.equal(lines.length, 1)
  const [, rest] = /^\S+ (.*)\n$/s.exec(lines[0]!)!
  t.equal(rest, 'WARN a\\rb\\r\\nc\\x1b[31md\\x00e\\x07f\\tg\\x7fh\\x9bi peer="x\\u001b[2Jy" line="one\\rtwo" bell="\\u0007"')
  // eslint-disable-next-line no-control-regex
  t.notMatch(lines[0]!.slice(0, -1), /[\x00-\x1f\x7f-\x9f]/, 'no control character left but the final newline')

  lines.length = 0
  const silent = consoleLogger({ stream, level: 'silent' })
  silent.error('x')
  t.equal(lines.length, 0)
  const verbose = consoleLogger(true)
  t.type(verbose.info, 'function', 'the boolean form still works')

  t.equal(resolveLogger(null), silentLogger)
  const threeLevels = { error () {}, warn () {}, info () {} }
  t.type(resolveLogger(threeLevels).debug, 'function', 'a logger without debug is accepted')
})

t.test('structured fields reach a custom logger; a class-based logger keeps its this on rate-limited paths', async (t) => {
  const log = new Recorder()
  // One connection at most: a second one evicts the first, still negotiating (a rate-limited warning).
  const server = new Server({ logger: log, maxConnections: 1, idleTimeoutMs: 0 }).addService(CalculatorService, calculatorHandlers)
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 0 }))
  const sockets: Socket[] = []
  t.teardown(() => { for (const s of sockets) s.destroy() })
  const silent = connect({ host: '127.0.0.1', port })
  silent.on('error', () => {})
  sockets.push(silent)
  await new Promise((resolve) => silent.once('connect', resolve))
  await until(() => server.stats().connectionsOpen === 1, 'the first connection')
  const second = connect({ host: '127.0.0.1', port })
  second.on('error', () => {})
  sockets.push(second)
  await until(() => log.count('warn') >= 1, 'the eviction warning')
  const eviction = log.events.find(e => e.level === 'warn')!
  t.match(eviction.message, /closing the oldest negotiating connection/)
  t.match(eviction.fields, { protocol: 'krpc', remote: /^127\.0\.0\.1:\d+$/, maxNegotiating: Number })

  second.destroy()
  await until(() => server.stats().connectionsOpen === 0, 'both closed')
  await sendGarbage(port)
  await until(() => log.count('warn') >= 2, 'the bad-data warning')
  const bad = log.events.filter(e => e.level === 'warn')[1]!
  t.match(bad.fields, { protocol: 'krpc', remote: /^127\.0\.0\.1:\d+$/, code: /^RPC_ERR_/ })
  t.equal(log.count('error'), 0)
})

t.test('a Client logs to its logger: retries at debug, closed connections at info, with fields; null silences it', async (t) => {
  // A port with nothing on it: every attempt fails to connect and is retried.
  const probe = new Server({ logger: null })
  const { port } = await probe.listen(0, '127.0.0.1')
  await probe.close({ graceMs: 0 })
  const log = new Recorder()
  const client = new Client({ endpoint: `127.0.0.1:${port}`, logger: log, retry: { maxAttempts: 2 } })
  t.teardown(() => client.close())
  await t.rejects(client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 5000 }))
  t.ok(log.count('debug') >= 1, 'the retry at debug')
  t.match(log.events.find(e => e.level === 'debug')!.fields, { service: 'nyala.demo.CalculatorService', method: 'Add', attempt: 1, code: String })
  t.ok(log.count('info') >= 1, 'the failed connection at info')
  t.match(log.events.find(e => e.level === 'info')!.fields, { endpoint: `127.0.0.1:${port}`, negotiated: false })
  t.equal(log.count('warn') + log.count('error'), 0, 'what the call reports is not warned about again')

  const quiet = new Client({ endpoint: `127.0.0.1:${port}`, logger: null })
  t.teardown(() => quiet.close())
  await t.rejects(quiet.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 5000 }))
})

t.test('a Client warns when a KRPC server it negotiated with then breaks the protocol', async (t) => {
  const fake = await FakeServer.start()
  t.teardown(() => fake.close())
  const log = new Recorder()
  const client = new Client({ endpoint: fake.endpoint, logger: log })
  t.teardown(() => client.close())
  const call = client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 5000 })
  const peer = await fake.peer()
  await peer.nextCall()
  // A response frame whose header is garbage: four bytes of length, then nonsense.
  peer.write(Buffer.from([0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]))
  await t.rejects(call, { code: 'RPC_ERR_MALFORMED_FRAME' })
  await until(() => log.count('warn') === 1, 'the warning')
  t.match(log.events.find(e => e.level === 'warn')!.fields, { endpoint: fake.endpoint, negotiated: true, code: 'RPC_ERR_MALFORMED_FRAME' })
})

t.test('the pino adapter of docs/logging.md fits a pino-like logger (fields first, message second)', async (t) => {
  // A fake pino: level methods that take (object, message) and use their `this`.
  const written: Array<{ level: string, obj: object, msg: string }> = []
  const fakePino = {
    written,
    error (obj: object, msg: string) { this.written.push({ level: 'error', obj, msg }) },
    warn (obj: object, msg: string) { this.written.push({ level: 'warn', obj, msg }) },
    info (obj: object, msg: string) { this.written.push({ level: 'info', obj, msg }) },
    debug (obj: object, msg: string) { this.written.push({ level: 'debug', obj, msg }) }
  }
  // The adapter, as docs/logging.md gives it:
  const pino = fakePino
  const logger: nyala.Logger = {
    error: (m, f) => pino.error(f ?? {}, m), warn: (m, f) => pino.warn(f ?? {}, m),
    info: (m, f) => pino.info(f ?? {}, m), debug: (m, f) => pino.debug(f ?? {}, m)
  }
  const server = new KrpcServer({ logger }).addService(CalculatorService, calculatorHandlers)
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 0 }))
  await sendGarbage(port)
  await until(() => written.some(w => w.level === 'warn'), 'a warning through the adapter')
  const warning = written.find(w => w.level === 'warn')!
  t.type(warning.msg, 'string')
  t.match(warning.obj, { protocol: 'krpc', remote: /^127\.0\.0\.1:\d+$/ })
  logger.info('no fields')
  t.same(written.at(-1), { level: 'info', obj: {}, msg: 'no fields' })
  t.type(nyala.silentLogger.warn, 'function', 'silentLogger is exported by the package entry')
  t.type(nyala.consoleLogger, 'function')
})
