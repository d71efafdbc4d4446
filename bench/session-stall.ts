/**
 * Does a slow session hold up another's next request? The issue-38 case:
 * N connections each sleep in a handler (PostgreSQL's `pg_sleep`), then one
 * more connection sends a quick request; its latency is printed for the
 * server's groups with the default workers (10) run concurrently and run
 * sequentially (`execution: 'sequential'`, where a group's workers count
 * sessions, one per admitted connection by default).
 *
 *   node dist/bench/session-stall.js [--sessions 12] [--sleep-ms 500] [--rounds 5]
 *
 * Prints one JSON line per mode: `{ execution, sessions, sleepMs, quickMs: [...], medianMs,
 * quickRefused, sleepersRefused }`: the quick request's latency each round (a refusal, `busy`,
 * comes fast too: see `quickRefused`), and the sleepers' requests refused over all rounds.
 */
import { connect, type Socket } from 'node:net'
import { once } from 'node:events'
import { parseArgs } from 'node:util'
import { ProtocolServer, type ServerProtocol } from '../reactor/index.js'

const { values } = parseArgs({ options: { sessions: { type: 'string', default: '12' }, 'sleep-ms': { type: 'string', default: '500' }, rounds: { type: 'string', default: '5' } } })
const sessions = Number(values.sessions)
const sleepMs = Number(values['sleep-ms'])
const rounds = Number(values.rounds)

// `route argument\n` lines, answered in order with `argument\n`.
const lines: ServerProtocol<string, string> = {
  name: 'lines',
  ordering: 'in-order',
  framing: { scanner: () => ({ scan: (buf, start, end) => { const at = buf.indexOf(10, start); return at >= 0 && at < end ? at + 1 - start : 0 }, reset () {} }) },
  decodeHead (buf, start, end, head) { const line = buf.toString('latin1', start, end - 1); const space = line.indexOf(' '); head.service = 'q'; head.method = line.slice(0, space); head.data = line.slice(space + 1); return null },
  decodeRequest: (_route, _buf, head) => head.data as string,
  encode (_call, answer, out) { out.append(Buffer.from(`${answer}\n`)) },
  refusal: (_call, reason) => [Buffer.from(`-ERR ${reason}\n`)]
}

async function open (port: number): Promise<Socket> {
  const socket = connect(port, '127.0.0.1')
  socket.setNoDelay(true)
  await once(socket, 'connect')
  return socket
}

async function answer (socket: Socket): Promise<string> {
  const [data] = await once(socket, 'data') as [Buffer]
  return data.toString('latin1')
}

for (const execution of ['concurrent', 'sequential'] as const) {
  const server = new ProtocolServer({ ...lines, execution }, { logger: null })
  server.addRoutes('q', {
    sleep: (ms: string) => new Promise<string>(resolve => setTimeout(() => resolve('slept'), Number(ms))),
    quick: (arg: string) => arg
  })
  const { port } = await server.listen(0)
  const sleepers = await Promise.all(Array.from({ length: sessions }, () => open(port)))
  const quick = await open(port)
  const quickMs: number[] = []
  let quickRefused = 0
  let sleepersRefused = 0
  for (let round = 0; round < rounds; round++) {
    const slept = sleepers.map(answer)
    for (const socket of sleepers) socket.write(`sleep ${sleepMs}\n`)
    await new Promise(resolve => setTimeout(resolve, 20))
    const start = performance.now()
    const got = answer(quick)
    quick.write('quick 1\n')
    if ((await got).startsWith('-ERR')) quickRefused++
    quickMs.push(Math.round((performance.now() - start) * 10) / 10)
    for (const text of await Promise.all(slept)) if (text.startsWith('-ERR')) sleepersRefused++
  }
  for (const socket of [...sleepers, quick]) socket.destroy()
  await server.close({ graceMs: 0 })
  const sorted = [...quickMs].sort((a, b) => a - b)
  console.log(JSON.stringify({ execution, sessions, sleepMs, quickMs, medianMs: sorted[Math.floor(sorted.length / 2)], quickRefused, sleepersRefused }))
}
