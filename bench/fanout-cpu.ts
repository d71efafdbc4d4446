/**
 * The server CPU of channel fan-out: redis-server beside the redis example
 * on each `--io`, one channel with many subscribers, one PUBLISH at a time:
 *
 *   npx tsc -p tsconfig.json && node dist/bench/fanout-cpu.js [--rounds 4] [--subscribers 1000]
 *     [--publishes 400] [--warmup 40] [--payload-bytes 32] [--io auto,epoll] [--max-minutes 10]
 *     [--profile-dir DIR]
 *
 * It starts `redis-server --save '' --appendonly no` and, per `--io` value,
 * `node dist/examples/redis/main.js --port 0 --reactors 1 --io IO`; all stay
 * up for the whole run. A measurement on one server: `--subscribers`
 * connections of this process SUBSCRIBE to `fan`, one more PUBLISHes a
 * message of `--payload-bytes` bytes, the next once every subscriber has the
 * last one and the publisher its reply (`:N`), `--warmup` times unmeasured,
 * then `--publishes` times between two readings of the server's CPU
 * (utime + stime in /proc, of the process and its children); the figure is
 * that CPU per PUBLISH, i.e. per `--subscribers` deliveries. Then the
 * connections close. Each round measures every server once, the order
 * rotating every round, and prints each figure and each example's ratio to
 * redis-server in the same round; then per server the median ratio. The
 * CPU clock ticks (10 ms): with 400 PUBLISHes of ~2 ms each, one tick is
 * ~1 % of a figure.
 *
 * The subscribers share this process and the machine's cores with the
 * servers, the same for every server: hold the bench lock (`flock
 * /tmp/nyala-bench.lock`). Bounded: a PUBLISH whose deliveries do not all
 * arrive within 30 s fails the run, the whole bench stops after
 * `--max-minutes`; every socket is closed and every process it starts
 * killed by PID at the end. With `--profile-dir` each example runs with
 * `--cpu-prof` and writes its profile there when it exits.
 */
import { connect, type Socket } from 'node:net'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { CLOCK_TICKS, HOST, cpuTicks, freePort, median, portProbe, runAsProgram, startNode, startProcess, stopAll } from './processes.js'

const EXAMPLE = fileURLToPath(new URL('../examples/redis/main.js', import.meta.url))
const CHANNEL = 'fan'
const SUBSCRIBED = `*3\r\n$9\r\nsubscribe\r\n$${CHANNEL.length}\r\n${CHANNEL}\r\n:1\r\n`
/** Subscribers connecting at once (each waits for its SUBSCRIBE answer). */
const CONNECT_BATCH = 100
const PUBLISH_TIMEOUT_MS = 30_000

function encode (args: string[]): Buffer {
  let out = `*${args.length}\r\n`
  for (const a of args) out += `$${Buffer.byteLength(a, 'latin1')}\r\n${a}\r\n`
  return Buffer.from(out, 'latin1')
}

/** One server's subscribers and publisher, counting the bytes they receive. */
class FanOut {
  readonly #subs: Socket[] = []
  #pub: Socket | null = null
  /** Bytes received by all subscribers past their SUBSCRIBE answers, and by the publisher. */
  #subBytes = 0
  #pubBytes = 0
  #wake: (() => void) | null = null

  static async open (port: number, subscribers: number): Promise<FanOut> {
    const fan = new FanOut()
    try {
      for (let at = 0; at < subscribers; at += CONNECT_BATCH) {
        await Promise.all(Array.from({ length: Math.min(CONNECT_BATCH, subscribers - at) }, () => fan.#subscribe(port)))
      }
      const pub = connect(port, HOST)
      fan.#pub = pub
      await new Promise<void>((resolve, reject) => {
        pub.once('error', reject)
        pub.once('connect', () => resolve())
      })
      pub.on('data', (d: Buffer) => { fan.#pubBytes += d.length; fan.#wake?.() })
    } catch (err) {
      fan.close()
      throw err
    }
    return fan
  }

  #subscribe (port: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const socket = connect(port, HOST)
      this.#subs.push(socket)
      let head = ''
      socket.once('error', reject)
      socket.once('connect', () => socket.write(encode(['SUBSCRIBE', CHANNEL])))
      const onHead = (data: Buffer): void => {
        head += data.toString('latin1')
        if (head.length < SUBSCRIBED.length) return
        if (!head.startsWith(SUBSCRIBED)) { reject(new Error(`unexpected SUBSCRIBE answer ${JSON.stringify(head)}`)); return }
        socket.off('data', onHead)
        socket.on('data', (d: Buffer) => { this.#subBytes += d.length; this.#wake?.() })
        this.#subBytes += head.length - SUBSCRIBED.length
        resolve()
      }
      socket.on('data', onHead)
    })
  }

  /** PUBLISHes `message` `count` times, each once the one before reached every subscriber and its reply came. */
  async publish (message: string, count: number): Promise<void> {
    const n = this.#subs.length
    const command = encode(['PUBLISH', CHANNEL, message])
    const delivery = encode(['message', CHANNEL, message]).length
    const reply = `:${n}\r\n`.length
    for (let i = 0; i < count; i++) {
      const subTarget = this.#subBytes + n * delivery
      const pubTarget = this.#pubBytes + reply
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => { this.#wake = null; reject(new Error(`PUBLISH ${i}: ${this.#subBytes - subTarget + n * delivery} of ${n * delivery} bytes delivered after ${PUBLISH_TIMEOUT_MS} ms`)) }, PUBLISH_TIMEOUT_MS)
        this.#wake = () => {
          if (this.#subBytes < subTarget || this.#pubBytes < pubTarget) return
          if (this.#subBytes > subTarget || this.#pubBytes > pubTarget) reject(new Error(`PUBLISH ${i}: more bytes than one message each`))
          clearTimeout(timer)
          this.#wake = null
          resolve()
        }
        this.#pub!.write(command)
      })
    }
  }

  close (): void {
    for (const socket of this.#subs) socket.destroy()
    this.#pub?.destroy()
  }
}

/** The server's CPU (ms) per PUBLISH over `publishes`, after `warmup` unmeasured, with `subscribers` fresh subscribers. */
async function measure (pid: number, port: number, o: { subscribers: number, publishes: number, warmup: number, message: string }): Promise<{ cpuMs: number, wallMs: number }> {
  const fan = await FanOut.open(port, o.subscribers)
  try {
    await fan.publish(o.message, o.warmup)
    const ticks = cpuTicks(pid)
    const start = performance.now()
    await fan.publish(o.message, o.publishes)
    const wallMs = performance.now() - start
    const used = cpuTicks(pid) - ticks
    return { cpuMs: used * 1000 / CLOCK_TICKS / o.publishes, wallMs: wallMs / o.publishes }
  } finally {
    fan.close()
    // The server closes the connections before the next measurement starts (its CPU for that is in no figure).
    await new Promise((resolve) => setTimeout(resolve, 300))
  }
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '4' },
      subscribers: { type: 'string', default: '1000' },
      publishes: { type: 'string', default: '400' },
      warmup: { type: 'string', default: '40' },
      'payload-bytes': { type: 'string', default: '32' },
      io: { type: 'string', default: 'auto,epoll' },
      'max-minutes': { type: 'string', default: '10' },
      'profile-dir': { type: 'string' }
    },
    strict: true
  })
  const [rounds, subscribers, publishes, warmup, payload, maxMinutes] = [values.rounds, values.subscribers, values.publishes, values.warmup, values['payload-bytes'], values['max-minutes']].map(Number) as [number, number, number, number, number, number]
  if (![rounds, subscribers, publishes, payload, maxMinutes].every((n) => Number.isInteger(n) && n >= 1) || !Number.isInteger(warmup) || warmup < 0) {
    throw new RangeError('--rounds, --subscribers, --publishes, --payload-bytes and --max-minutes take positive integers, --warmup one >= 0')
  }
  const profile = values['profile-dir'] === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${values['profile-dir']}`]
  const deadline = setTimeout(() => {
    console.error(`--max-minutes ${maxMinutes} passed: stopping`)
    void stopAll().then(() => process.exit(2))
  }, maxMinutes * 60_000)
  try {
    const servers = new Map<string, { pid: number, port: number }>()
    const redisPort = await freePort()
    const redis = await startProcess('redis-server', ['--save', '', '--appendonly', 'no', '--bind', HOST, '--port', String(redisPort), '--maxclients', String(subscribers + 100)], portProbe(redisPort))
    servers.set('redis', { pid: redis.pid!, port: redisPort })
    for (const io of values.io.split(',')) {
      const { child, port } = await startNode([...profile, EXAMPLE, '--port', '0', '--reactors', '1', '--io', io])
      servers.set(io, { pid: child.pid!, port })
    }
    const names = [...servers.keys()]
    const message = 'm'.repeat(payload)
    console.log(`${subscribers} subscribers of '${CHANNEL}' (node:net, in the bench process), PUBLISH of ${payload} bytes one at a time: ${warmup} unmeasured, then ${publishes} measured; ${rounds} rounds; servers ${names.join(', ')} (examples: --reactors 1 --io IO)`)
    console.log('cells: server CPU ms per PUBLISH (wall ms per PUBLISH) [ratio of CPU to redis-server in the same round]')
    const ratios = new Map<string, number[]>()
    for (let round = 0; round < rounds; round++) {
      const order = names.map((_, i) => names[(i + round) % names.length]!)
      const results = new Map<string, { cpuMs: number, wallMs: number }>()
      for (const name of order) {
        const { pid, port } = servers.get(name)!
        results.set(name, await measure(pid, port, { subscribers, publishes, warmup, message }))
      }
      const base = results.get('redis')!.cpuMs
      const cells = names.map((name) => {
        const r = results.get(name)!
        const ratio = r.cpuMs / base
        if (name !== 'redis') ratios.set(name, [...(ratios.get(name) ?? []), ratio])
        return `${name} ${r.cpuMs.toFixed(3)} (${r.wallMs.toFixed(2)})${name === 'redis' ? '' : ` [${ratio.toFixed(3)}]`}`
      })
      console.log(`round ${round + 1}: ${cells.join(' | ')}  order ${order.join(',')}`)
    }
    for (const [io, list] of ratios) {
      console.log(`${io} / redis: ratios ${list.map((r) => r.toFixed(3)).join(' ')}; median ${median(list).toFixed(3)}`)
    }
  } finally {
    clearTimeout(deadline)
    await stopAll()
  }
}

runAsProgram(import.meta.url, main)
