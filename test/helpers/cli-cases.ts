/**
 * The `nyala` command line run from its TypeScript sources in a child
 * process (through the same loader tap uses), for the bin tests.
 */
import type { Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { fileURLToPath } from 'node:url'

export const CLI = fileURLToPath(new URL('../../bin/cli.ts', import.meta.url))
// Only the TypeScript loader: coverage and mocking hooks stay in this process.
export const LOADER = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))

export interface Outcome { code: number, stdout: string, stderr: string }

/**
 * Runs `main(args)` for each of `cases` in one child process (a child per
 * case costs seconds), one after another, each with its own stdout and
 * stderr captured, and resolves with their outcomes in order; a case that
 * throws has code -2 and its stack on stderr.
 */
export async function cliCases (t: Test, cases: string[][]): Promise<Outcome[]> {
  const script = `
    const cli = await import(${JSON.stringify(CLI)})
    const out = process.stdout.write, err = process.stderr.write, outcomes = []
    for (const args of ${JSON.stringify(cases)}) {
      const o = { code: -1, stdout: '', stderr: '' }
      process.stdout.write = (d) => { o.stdout += d; return true }
      process.stderr.write = (d) => { o.stderr += d; return true }
      try { o.code = await cli.main(args) } catch (e) { o.code = -2; o.stderr += String(e && e.stack) } finally { process.stdout.write = out; process.stderr.write = err }
      outcomes.push(o)
    }
    process.stdout.write(JSON.stringify(outcomes))`
  const child = spawn(process.execPath, [...LOADER, '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] })
  t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (d: Buffer) => { stdout += d.toString() })
  child.stderr.on('data', (d: Buffer) => { stderr += d.toString() })
  // 'close', not 'exit': the output may still be in the pipes when the process exits.
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve))
  if (code !== 0) throw new Error(`the CLI case runner exited with ${code}: ${stderr}`)
  return JSON.parse(stdout) as Outcome[]
}

/** A child process of the bin tests, its output collected as it comes. */
export interface CliRun { child: ChildProcess, stdout: () => string, stderr: () => string, exit: Promise<number | null> }

/**
 * Runs module `script` with the TypeScript loader in a child process, with
 * `input` (if any) on its stdin; with `t`, it is killed at the test's end
 * if still running.
 */
export function runModule (script: string, t?: Test, input?: string): CliRun {
  const child = spawn(process.execPath, [...LOADER, '--input-type=module', '-e', script], { stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] })
  if (input !== undefined) {
    child.stdin!.on('error', () => {}) // it may exit before reading all of it
    child.stdin!.end(input)
  }
  t?.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let out = ''
  let err = ''
  child.stdout!.on('data', (d: Buffer) => { out += d.toString() })
  child.stderr!.on('data', (d: Buffer) => { err += d.toString() })
  // 'close', not 'exit': the output may still be in the pipes when the process exits.
  const exit = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)))
  return { child, stdout: () => out, stderr: () => err, exit }
}

/** `nyala ARGS` from the sources in a child process (see `runModule`). */
export function runCli (args: string[], t?: Test, input?: string): CliRun {
  return runModule(`import(${JSON.stringify(CLI)}).then((cli) => cli.main(${JSON.stringify(args)})).then((code) => { process.exitCode = code }, (err) => { console.error(err); process.exitCode = 1 })`, t, input)
}

/** Resolves with the first match of `pattern` in the run's stdout; rejects if it exits first. */
export async function waitForOutput (run: CliRun, pattern: RegExp): Promise<RegExpMatchArray> {
  for (;;) {
    const match = run.stdout().match(pattern)
    if (match !== null) return match
    if (run.child.exitCode !== null) throw new Error(`exited early: ${run.stderr()}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}
