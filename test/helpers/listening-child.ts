/**
 * Runs a TypeScript program (from the sources, through the test runner's
 * loader) in a child process and waits for its `listening on HOST:PORT`
 * line. The child is killed at the test's teardown if it still runs.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import type { Test } from 'tap'

export interface ListeningChild {
  child: ChildProcess
  port: number
  /** What the child wrote to stderr so far. */
  stderr: () => string
}

export async function startListening (t: Test, file: string, args: string[] = [], env: NodeJS.ProcessEnv = process.env): Promise<ListeningChild> {
  const loader = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))
  const child = spawn(process.execPath, [...loader, file, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] })
  t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let out = ''
  let err = ''
  child.stderr!.on('data', (d: Buffer) => { err += d.toString() })
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString()
      const m = /listening on 127\.0\.0\.1:(\d+)/.exec(out)
      if (m !== null) resolve(Number(m[1]))
    })
    child.once('exit', (code) => reject(new Error(`${file} exited (${code}) before listening: ${err}`)))
  })
  return { child, port, stderr: () => err }
}
