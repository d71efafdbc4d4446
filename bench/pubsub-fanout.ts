/**
 * Pub/Sub fan-out: the redis example on each transport beside
 * redis-server, 20 subscribers of one channel and one pipelining
 * publisher:
 *
 *   npx tsc -p tsconfig.json && node dist/bench/pubsub-fanout.js [--rounds 5] [--subscribers 20]
 *     [--messages 200000] [--io epoll,io_uring,node] [--max-minutes 3] [--profile-dir DIR]
 *
 * It starts `redis-server --save '' --appendonly no` and, per `--io` value,
 * `node dist/examples/redis/main.js --port 0 --reactors 1 --io IO`, and
 * opens `--subscribers` connections from this process to each server, each
 * SUBSCRIBEd to `ch`. A run is `redis-benchmark -P 16 -c 1 -n <messages>
 * -q publish ch msg` against one server; the subscribers count the bytes
 * they receive (every message is the same 34 bytes), and the run ends once
 * all subscribers have all the messages (or 5 s after the last byte, a
 * shortfall then printed). Delivered messages per second = messages
 * received by all subscribers / (time of the last byte - the publisher's
 * start). Each round runs every server once, the order rotating every
 * round, and prints each server's delivered/s and each example's ratio to
 * redis-server in the same round; then per transport the median ratio and
 * the rounds at or above 0.8. With `--profile-dir` each example runs with
 * `--cpu-prof` and writes its profile there when it exits.
 *
 * The subscribers share this process and the machine's cores with the
 * servers and redis-benchmark, the same for every server: hold the bench
 * lock (`flock /tmp/nyala-bench.lock`). Bounded: each run is given up
 * after two minutes, the whole bench after `--max-minutes`; every socket is
 * closed and every process it starts killed by PID at the end.
 */
import type { ChildProcess } from 'node:child_process'
import { connect, type Socket } from 'node:net'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { HOST, freePort, median, portProbe, runBounded, startNode, startProcess, stopAll, runAsProgram } from './processes.js'

const EXAMPLE = fileURLToPath(new URL('../examples/redis/main.js', import.meta.url))
const CHANNEL = 'ch'
const PAYLOAD = 'msg'
/** `*3 $7 message $2 ch $3 msg`, as both servers send it. */
const MESSAGE_BYTES = Buffer.byteLength(`*3\r\n$7\r\nmessage\r\n$${CHANNEL.length}\r\n${CHANNEL}\r\n$${PAYLOAD.length}\r\n${PAYLOAD}\r\n`)
const SUBSCRIBED = `*3\r\n$9\r\nsubscribe\r\n$${CHANNEL.length}\r\n${CHANNEL}\r\n:1\r\n`
const BAR = 0.8

/** Subscribers of one server: bytes received past each one's SUBSCRIBE answer, and when the last came. */
class Subscribers {
  readonly sockets: Socket[] = []
  bytes = 0
  lastAt = 0
  onData: (() => void) | null = null

  static async open (port: number, count: number): Promise<Subscribers> {
    const subs = new Subscribers()
    await Promise.all(Array.from({ length: count }, () => subs.#subscribe(port)))
    return subs
  }

  #subscribe (port: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const socket = connect(port, HOST)
      this.sockets.push(socket)
      let head = ''
      socket.once('error', reject)
      socket.once('connect', () => socket.write(`*2\r\n$9\r\nSUBSCRIBE\r\n$${CHANNEL.length}\r\n${CHANNEL}\r\n`))
      const onHead = (data: Buffer): void => {
        head += data.toString('latin1')
        if (head.length < SUBSCRIBED.length) return
        if (!head.startsWith(SUBSCRIBED)) { reject(new Error(`unexpected SUBSCRIBE answer ${JSON.stringify(head)}`)); return }
        socket.off('data', onHead)
        socket.on('data', (d: Buffer) => {
          this.bytes += d.length
          this.lastAt = performance.now()
          this.onData?.()
        })
        this.bytes += head.length - SUBSCRIBED.length
        resolve()
      }
      socket.on('data', onHead)
    })
  }

  close (): void {
    for (const socket of this.sockets) socket.destroy()
  }
}

async function startRedis (): Promise<{ child: ChildProcess, port: number }> {
  const port = await freePort()
  const child = await startProcess('redis-server', ['--save', '', '--appendonly', 'no', '--bind', HOST, '--port', String(port)], portProbe(port))
  return { child, port }
}

/** One run: the publisher against `port`; messages delivered per second and how many were missing. */
async function run (port: number, subs: Subscribers, messages: number): Promise<{ deliveredPerSec: number, publishPerSec: number, missing: number }> {
  const expected = messages * subs.sockets.length * MESSAGE_BYTES
  subs.bytes = 0
  const allIn = new Promise<void>((resolve) => {
    let quiet: NodeJS.Timeout | undefined
    const check = (): void => {
      clearTimeout(quiet)
      if (subs.bytes >= expected) { subs.onData = null; resolve(); return }
      quiet = setTimeout(() => { subs.onData = null; resolve() }, 5000)
    }
    subs.onData = check
    check()
  })
  const startAt = performance.now()
  const args = ['-h', HOST, '-p', String(port), '-P', '16', '-c', '1', '-n', String(messages), '-q', 'publish', CHANNEL, PAYLOAD]
  const { code, out } = await runBounded('redis-benchmark', args, 120_000)
  const m = /: ([\d.]+) requests per second/.exec(out)
  if (code !== 0 || m === null) throw new Error(`redis-benchmark ${args.join(' ')} failed (exit ${code}): ${out.slice(-500)}`)
  await allIn
  const received = Math.floor(subs.bytes / MESSAGE_BYTES)
  return { deliveredPerSec: received / ((subs.lastAt - startAt) / 1000), publishPerSec: Number(m[1]), missing: messages * subs.sockets.length - received }
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '5' },
      subscribers: { type: 'string', default: '20' },
      messages: { type: 'string', default: '200000' },
      io: { type: 'string', default: 'epoll,io_uring,node' },
      'max-minutes': { type: 'string', default: '3' },
      'profile-dir': { type: 'string' }
    },
    strict: true
  })
  const rounds = Number(values.rounds)
  const subscribers = Number(values.subscribers)
  const messages = Number(values.messages)
  const maxMinutes = Number(values['max-minutes'])
  const ios = values.io.split(',')
  // --profile-dir: each example writes a CPU profile there when it exits.
  const profile = values['profile-dir'] === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${values['profile-dir']}`]
  if (![rounds, subscribers, messages, maxMinutes].every((n) => Number.isInteger(n) && n >= 1)) throw new RangeError('--rounds, --subscribers, --messages and --max-minutes take positive integers')
  const all: Subscribers[] = []
  const deadline = setTimeout(() => {
    console.error(`--max-minutes ${maxMinutes} passed: stopping`)
    for (const subs of all) subs.close()
    void stopAll().then(() => process.exit(2))
  }, maxMinutes * 60_000)
  try {
    const servers = new Map<string, { port: number, subs: Subscribers }>()
    const redis = await startRedis()
    servers.set('redis', { port: redis.port, subs: await Subscribers.open(redis.port, subscribers) })
    all.push(servers.get('redis')!.subs)
    for (const io of ios) {
      const { port } = await startNode([...profile, EXAMPLE, '--port', '0', '--reactors', '1', '--io', io])
      const subs = await Subscribers.open(port, subscribers)
      all.push(subs)
      servers.set(io, { port, subs })
    }
    const names = [...servers.keys()]
    console.log(`${subscribers} subscribers of '${CHANNEL}' (node:net, in the bench process); publisher: redis-benchmark -P 16 -c 1 -n ${messages} -q publish ${CHANNEL} ${PAYLOAD}; ${rounds} rounds; servers ${names.join(', ')} (examples: --reactors 1 --io IO)`)
    console.log('cells: delivered messages/s (publishes/s by redis-benchmark) [ratio of delivered/s to redis-server in the same round]')
    const ratios = new Map<string, number[]>()
    for (let round = 0; round < rounds; round++) {
      const order = names.map((_, i) => names[(i + round) % names.length]!)
      const results = new Map<string, Awaited<ReturnType<typeof run>>>()
      for (const name of order) {
        const server = servers.get(name)!
        results.set(name, await run(server.port, server.subs, messages))
      }
      const base = results.get('redis')!.deliveredPerSec
      const cells = names.map((name) => {
        const r = results.get(name)!
        const ratio = r.deliveredPerSec / base
        if (name !== 'redis') ratios.set(name, [...(ratios.get(name) ?? []), ratio])
        return `${name} ${r.deliveredPerSec.toFixed(0)} (${r.publishPerSec.toFixed(0)})${name === 'redis' ? '' : ` [${ratio.toFixed(3)}]`}${r.missing > 0 ? ` MISSING ${r.missing}` : ''}`
      })
      console.log(`round ${round + 1}: ${cells.join(' | ')}  order ${order.join(',')}`)
    }
    for (const [io, list] of ratios) {
      console.log(`${io}: ratios ${list.map((r) => r.toFixed(3)).join(' ')}; median ${median(list).toFixed(3)}; ${list.filter((r) => r >= BAR).length} of ${list.length} rounds at or above ${BAR}`)
    }
  } finally {
    clearTimeout(deadline)
    for (const subs of all) subs.close()
    await stopAll()
  }
}

runAsProgram(import.meta.url, main)
