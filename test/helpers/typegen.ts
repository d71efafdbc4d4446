/**
 * For the tests of `nyala gen` and its walkthrough: type-checking files in
 * a temp dir with the repo's compiler options (`nyala` mapped to the
 * sources), and running TypeScript programs from the sources in a child
 * process (through the test runner's loader).
 */
import { execFile } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { Test } from 'tap'

export const REPO = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '')

export interface Ran { code: number, stdout: string, stderr: string }

function run (command: string, args: string[], cwd?: string): Promise<Ran> {
  return new Promise((resolve) => {
    execFile(command, args, { cwd, timeout: 120_000, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === 'number' ? error.code : 1
      resolve({ code, stdout, stderr })
    })
  })
}

/**
 * tsc over `files` of `dir` (no output written), with the repo's
 * tsconfig.json options and `extra`; `nyala`, `nyala/krpc`, `nyala/demo`
 * and `nyala/testing` resolve to the sources. Answers the exit code and the
 * diagnostics.
 */
export async function runTsc (dir: string, files: string[], extra: Record<string, unknown> = {}): Promise<{ code: number, output: string }> {
  const repoConfig = JSON.parse(readFileSync(join(REPO, 'tsconfig.json'), 'utf8')) as { compilerOptions: Record<string, unknown> }
  const compilerOptions = {
    ...repoConfig.compilerOptions,
    ...extra,
    noEmit: true,
    rootDir: undefined,
    outDir: undefined,
    typeRoots: [join(REPO, 'node_modules/@types')],
    paths: {
      nyala: [join(REPO, 'reactor/index.ts')],
      'nyala/krpc': [join(REPO, 'reactor/krpc/index.ts')],
      'nyala/demo': [join(REPO, 'examples/calculator/index.ts')],
      'nyala/testing': [join(REPO, 'reactor/testing.ts')]
    }
  }
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ type: 'module' }))
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions, files }, null, 2))
  const ran = await run(process.execPath, [join(REPO, 'node_modules/typescript/bin/tsc'), '-p', join(dir, 'tsconfig.json')], dir)
  return { code: ran.code, output: `${ran.stdout}${ran.stderr}` }
}

/** `text` with its `nyala` imports pointed at the sources, to run from them. */
export function toSources (text: string): string {
  return text
    .replace(/from 'nyala'/g, `from ${JSON.stringify(join(REPO, 'reactor/index.ts'))}`)
    .replace(/from 'nyala\/krpc'/g, `from ${JSON.stringify(join(REPO, 'reactor/krpc/index.ts'))}`)
    .replace(/from 'nyala\/demo'/g, `from ${JSON.stringify(join(REPO, 'examples/calculator/index.ts'))}`)
    .replace(/from 'nyala\/testing'/g, `from ${JSON.stringify(join(REPO, 'reactor/testing.ts'))}`)
}

/** Runs a TypeScript program from the sources to its end. */
export function runSourceProgram (file: string, args: string[] = []): Promise<Ran> {
  const loader = process.execArgv.filter((arg) => arg.includes('@tapjs/typescript'))
  return run(process.execPath, [...loader, file, ...args])
}

/** Runs `nyala ARGS...` from the sources (bin/cli.ts's main). */
export async function runCli (t: Test, args: string[]): Promise<Ran> {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-cli-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const runner = join(dir, 'cli.mts')
  writeFileSync(runner, `import { main } from ${JSON.stringify(join(REPO, 'bin/cli.ts'))}\nprocess.exitCode = await main(process.argv.slice(2))\n`)
  return runSourceProgram(runner, args)
}
