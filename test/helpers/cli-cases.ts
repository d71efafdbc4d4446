/**
 * The `nyala` command line run from its TypeScript sources in a child
 * process (through the same loader tap uses), for the bin tests.
 */
import type { Test } from 'tap'
import { spawn } from 'node:child_process'
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
