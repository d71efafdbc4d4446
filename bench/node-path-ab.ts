/**
 * The node:net path A/B: the memcached example of a base tree (a built
 * worktree of an earlier commit) against this tree's on `--io node`, under
 * memcaslap, in alternating pairs:
 *
 *   npx tsc -p tsconfig.json && node dist/bench/node-path-ab.js --base DIR [--pairs 6] [--seconds 5]
 *     [--base-args ARGS] [--max-minutes 3]
 *
 * DIR is a worktree with its own dist/ (e.g. `git worktree add DIR REV`,
 * node_modules hard-linked, `npx tsc -p tsconfig.json`). It starts `node
 * DIR/dist/examples/memcached/main.js --port 0 --reactors 1` (plus
 * `--base-args`, space-separated, e.g. `--io node` when the base has the
 * flag; a base from before the flag serves on node:net anyway) and this
 * tree's example with `--port 0 --reactors 1 --io node`. Each pair runs
 * `memcaslap -T 1 -c 16 -B -t <seconds>s` once against each, this tree
 * first in even pairs and the base first in odd ones, and prints both TPS,
 * both servers' CPU µs per operation (utime + stime from /proc) and the
 * ratios this / base; then the median ratios and the pairs this tree won
 * (TPS above the base's, CPU per op below it).
 *
 * Hold the bench lock (`flock /tmp/nyala-bench.lock`). Bounded: each
 * memcaslap run is killed after twice its time and 10 s, the whole bench
 * after `--max-minutes`; both servers are killed by PID at the end.
 */
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { CLOCK_TICKS, HOST, cpuTicks, median, runBounded, startNode, stopAll, runAsProgram } from './processes.js'

const EXAMPLE = fileURLToPath(new URL('../examples/memcached/main.js', import.meta.url))

interface Run { tps: number, cpuUsPerOp: number }

/** One memcaslap run against `port`: TPS and the server's CPU µs per operation. */
export async function memcaslapRun (port: number, seconds: number, serverPid: number): Promise<Run> {
  const before = cpuTicks(serverPid)
  const { out } = await runBounded('memcaslap', ['-s', `${HOST}:${port}`, '-T', '1', '-c', '16', '-t', `${seconds}s`, '-B'], (2 * seconds + 10) * 1000)
  const after = cpuTicks(serverPid)
  const m = /Ops:\s*(\d+)\s+TPS:\s*(\d+)/.exec(out.trim().split('\n').at(-1) ?? '')
  if (m === null) throw new Error(`memcaslap printed no TPS line: ${out.slice(-500)}`)
  const ops = Number(m[1])
  return { tps: Number(m[2]), cpuUsPerOp: ops === 0 ? NaN : ((after - before) / CLOCK_TICKS) * 1e6 / ops }
}

async function main (): Promise<void> {
  const { values } = parseArgs({
    options: {
      base: { type: 'string' },
      pairs: { type: 'string', default: '6' },
      seconds: { type: 'string', default: '5' },
      'base-args': { type: 'string', default: '' },
      'max-minutes': { type: 'string', default: '3' }
    },
    strict: true
  })
  if (values.base === undefined) throw new RangeError('--base DIR (a built worktree) is required')
  const pairs = Number(values.pairs)
  const seconds = Number(values.seconds)
  const maxMinutes = Number(values['max-minutes'])
  if (![pairs, seconds, maxMinutes].every((n) => Number.isInteger(n) && n >= 1)) throw new RangeError('--pairs, --seconds and --max-minutes take positive integers')
  const deadline = setTimeout(() => {
    console.error(`--max-minutes ${maxMinutes} passed: stopping`)
    void stopAll().then(() => process.exit(2))
  }, maxMinutes * 60_000)
  try {
    const baseArgs = values['base-args'] === '' ? [] : values['base-args'].split(' ')
    const base = await startNode([join(resolve(values.base), 'dist/examples/memcached/main.js'), '--port', '0', '--reactors', '1', ...baseArgs])
    const work = await startNode([EXAMPLE, '--port', '0', '--reactors', '1', '--io', 'node'])
    console.log(`memcaslap -s 127.0.0.1:PORT -T 1 -c 16 -B -t ${seconds}s; base ${values.base} (--reactors 1 ${baseArgs.join(' ')}) against this tree (--reactors 1 --io node); ${pairs} pairs`)
    console.log('pair  base TPS  µs/op   this TPS  µs/op   TPS ratio  CPU ratio  (this / base)')
    const tpsRatios: number[] = []
    const cpuRatios: number[] = []
    for (let pair = 0; pair < pairs; pair++) {
      const workFirst = pair % 2 === 0
      const runs: { base?: Run, work?: Run } = {}
      for (const which of workFirst ? ['work', 'base'] as const : ['base', 'work'] as const) {
        const server = which === 'base' ? base : work
        runs[which] = await memcaslapRun(server.port, seconds, server.child.pid!)
      }
      const b = runs.base!
      const w = runs.work!
      tpsRatios.push(w.tps / b.tps)
      cpuRatios.push(w.cpuUsPerOp / b.cpuUsPerOp)
      console.log(`${String(pair + 1).padStart(4)}  ${String(b.tps).padStart(8)}  ${b.cpuUsPerOp.toFixed(2).padStart(5)}  ${String(w.tps).padStart(9)}  ${w.cpuUsPerOp.toFixed(2).padStart(5)}   ${(w.tps / b.tps).toFixed(3).padStart(9)}  ${(w.cpuUsPerOp / b.cpuUsPerOp).toFixed(3).padStart(9)}${workFirst ? '  (this first)' : ''}`)
    }
    console.log(`TPS this / base: median ${median(tpsRatios).toFixed(3)}, this tree faster in ${tpsRatios.filter((r) => r > 1).length} of ${pairs} pairs`)
    console.log(`CPU per op this / base: median ${median(cpuRatios).toFixed(3)}, this tree cheaper in ${cpuRatios.filter((r) => r < 1).length} of ${pairs} pairs`)
  } finally {
    clearTimeout(deadline)
    await stopAll()
  }
}

runAsProgram(import.meta.url, main)
