/**
 * What server-instructions.ts and client-instructions.ts share: the port a
 * `nyala serve` child prints, and the instructions callgrind counted in the
 * dumps of a run (`--separate-threads=yes`).
 */
import type { ChildProcess } from 'node:child_process'
import { readFileSync, readdirSync } from 'node:fs'
import { join, resolve } from 'node:path'

/** The options both take (node:util parseArgs): the tree measured, the lockstep load, and where to keep the dumps. */
export const COUNT_OPTIONS = {
  tree: { type: 'string' },
  batches: { type: 'string', default: '1000' },
  batch: { type: 'string', default: '100' },
  'warmup-batches': { type: 'string', default: '2000' },
  'payload-bytes': { type: 'string', default: '0' },
  keep: { type: 'string' },
  'node-flag': { type: 'string', multiple: true, default: [] as string[] },
  /** A flag of `nyala serve` (e.g. `--server-flag=--max-frames-per-read=128`), repeatable. */
  'server-flag': { type: 'string', multiple: true, default: [] as string[] }
} as const

/** The run the options ask for: the tree measured (default `root`) and the lockstep load. */
export function countSettings (values: { tree?: string, batches: string, batch: string, 'warmup-batches': string, 'payload-bytes': string }, root: string):
{ tree: string, batches: number, batch: number, warmup: number, payload: number } {
  return {
    tree: resolve(values.tree ?? root),
    batches: Number(values.batches),
    batch: Number(values.batch),
    warmup: Number(values['warmup-batches']),
    payload: Number(values['payload-bytes'])
  }
}

/** The port `server` says it listens on (its "listening on HOST:PORT" line), within `seconds`. */
export function listeningPort (server: ChildProcess, seconds: number): Promise<number> {
  return new Promise((resolve, reject) => {
    let text = ''
    const timer = setTimeout(() => reject(new Error(`server not listening after ${seconds} s: ${text}`)), seconds * 1000)
    const onData = (d: Buffer): void => {
      text += d.toString()
      const m = /listening on [^\s:]+:(\d+)/.exec(text)
      if (m !== null) { clearTimeout(timer); resolve(Number(m[1])) }
    }
    server.stdout!.on('data', onData)
    server.stderr!.on('data', onData)
    server.once('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}): ${text}`)) })
  })
}

/**
 * The instructions of every callgrind dump in `dir`: the main thread's
 * (thread 1, the files ending `-01`) and every thread's. V8's compiler and
 * GC threads vary from run to run; the main thread's count agrees within
 * about 0.5 %.
 */
export function countedInstructions (dir: string): { main: number, all: number } {
  let main = 0
  let all = 0
  for (const name of readdirSync(dir)) {
    let total = 0
    for (const m of readFileSync(join(dir, name), 'utf8').matchAll(/^totals:\s+(\d+)/gm)) total += Number(m[1])
    all += total
    if (/-01$/.test(name)) main += total
  }
  return { main, all }
}
