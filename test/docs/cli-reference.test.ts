/**
 * docs/cli.md's table says what the CLI does: for every command of
 * bin/cli.ts's COMMANDS,
 * - docs/cli.md has a row for it (and no row names a
 *   command the CLI lacks);
 * - every flag of the command's usage text (as `nyala help` prints it) is
 *   in that row and every flag of the row is in the usage; a flag shown with a
 *   value (`[--workers 10]`, `[--queue edf|fifo]`) shows the same value in
 *   both, so the doc cannot show a default the command does not have;
 * - every option the command's parseArgs accepts is in its usage, and every
 *   flag of the usage is an option it accepts (or one its module handles
 *   by name before parsing, as bench's '--compare'). The options are read from
 *   the command itself: the module bin/cli.ts imports its `run` from is
 *   loaded with node:util's parseArgs replaced by one that records its
 *   options and stops the run (a command must call parseArgs in that
 *   module, before anything else it does).
 * Nothing here lists the commands or their flags: a command or flag added
 * to the CLI is checked as soon as it exists.
 */
import t from 'tap'
import * as util from 'node:util'
import { readFileSync } from 'node:fs'

const cliSource = readFileSync(new URL('../../bin/cli.ts', import.meta.url), 'utf8')
const doc = readFileSync(new URL('../../docs/cli.md', import.meta.url), 'utf8')

/** The entries of `const COMMANDS ... = { name: { run: fn, usage: ... }, ... }` in bin/cli.ts, with the module each `run` is imported from. */
function commands (): Array<{ name: string, run: string, module: string }> {
  return commandNames().map((name) => {
    const entry = new RegExp(`^\\s*'?${name}'?\\s*:\\s*\\{[^}]*\\brun:\\s*([A-Za-z_$][\\w$]*)`, 'm').exec(cliSource)
    if (entry === null) throw new Error(`bin/cli.ts: COMMANDS.${name} has no run: IDENTIFIER`)
    const run = entry[1]!
    const from = new RegExp(`^import\\s*\\{[^}]*\\b${run}\\b[^}]*\\}\\s*from\\s*'([^']+)'`, 'm').exec(cliSource)
    if (from === null) throw new Error(`bin/cli.ts does not import ${run}`)
    // Relative to this file, as t.mockImport resolves it (and the TypeScript loader maps .js to .ts).
    return { name, run, module: `../../bin/${from[1]!.replace(/^\.\//, '')}` }
  })
}

/** The keys of `const COMMANDS ... = { ... }` in bin/cli.ts. */
function commandNames (): string[] {
  const start = cliSource.search(/const COMMANDS\b[^=]*=\s*\{/)
  if (start < 0) throw new Error('bin/cli.ts has no COMMANDS object')
  const open = cliSource.indexOf('{', cliSource.indexOf('=', start))
  let depth = 0
  let end = open
  for (; end < cliSource.length; end++) {
    if (cliSource[end] === '{') depth++
    else if (cliSource[end] === '}' && --depth === 0) break
  }
  const body = cliSource.slice(open + 1, end)
  // Top-level keys: `name: {` or `'name': {` at the start of a line.
  return [...body.matchAll(/^\s*(?:'([^']+)'|"([^"]+)"|([A-Za-z_$][\w$]*))\s*:/gm)].map((m) => m[1] ?? m[2] ?? m[3]!)
}

const FLAG = /--[a-z][a-z0-9-]*/g
const flagsOf = (text: string): Set<string> => new Set(text.match(FLAG) ?? [])

/** `--flag VALUE` for each bracketed `[--flag VALUE]` of a synopsis, VALUE '' for a bare `[--flag]`. */
function shownValues (synopsis: string): Map<string, string> {
  const shown = new Map<string, string>()
  for (const m of synopsis.matchAll(/\[(--[a-z][a-z0-9-]*)(?:\s+([^\]\s[]+))?/g)) shown.set(m[1]!, m[2] ?? '')
  return shown
}

/** docs/cli.md's table: the whole page (one table of commands). */
function cliSection (): string {
  if (!/^# CLI\s*$/m.test(doc)) throw new Error('docs/cli.md has no "# CLI" heading')
  return doc
}

/** docs/cli.md's table rows, by command: the whole row, and its first cell (the synopsis), table escapes undone. */
function docRows (): Map<string, { row: string, synopsis: string }> {
  const rows = new Map<string, { row: string, synopsis: string }>()
  for (const line of cliSection().split('\n')) {
    const m = /^\|\s*`nyala ([a-z][a-z0-9-]*)/.exec(line)
    if (m === null) continue
    const row = line.replace(/\\\|/g, '|')
    // The first cell ends at the first unescaped "|" after the opening one.
    const cell = /^\|((?:[^|\\]|\\\|)*)\|/.exec(line)![1]!.replace(/\\\|/g, '|')
    rows.set(m[1]!, { row, synopsis: cell })
  }
  return rows
}

/** The synopsis of a usage text: its lines up to the first description line (indented 6, not starting with "["). */
function usageSynopsis (usage: string): string {
  const lines = usage.split('\n')
  const out: string[] = []
  for (const line of lines) {
    if (out.length > 0 && !/^\s*(\[|nyala )/.test(line)) break
    out.push(line)
  }
  return out.join('\n')
}

interface Cli { main: (argv: string[]) => Promise<number>, HELP: string }

/**
 * Runs `fn` with stderr captured (a command may report the stopped parse
 * there). Not stdout: tap writes its own output there meanwhile.
 */
async function quiet (fn: () => Promise<unknown>): Promise<unknown> {
  const err = process.stderr.write.bind(process.stderr)
  process.stderr.write = (() => true) as typeof process.stderr.write
  try {
    return await fn()
  } catch (e) {
    return e
  } finally {
    process.stderr.write = err
  }
}

/** One usage per command, cut out of the whole help (each begins with a line "  nyala NAME"). */
function usages (help: string): Map<string, string> {
  const found = new Map<string, string>()
  let name: string | null = null
  let text = ''
  for (const line of help.split('\n')) {
    const m = /^ {2}nyala ([a-z][a-z0-9-]*)/.exec(line)
    if (m !== null) {
      if (name !== null) found.set(name, text)
      name = m[1]!
      text = ''
    }
    if (name !== null) text += `${line}\n`
  }
  if (name !== null) found.set(name, text)
  return found
}

class Stop extends Error {}

t.test('docs/cli.md\'s CLI table, the usage texts and the options parseArgs accepts agree', async (t) => {
  const names = commandNames()
  t.ok(names.length >= 5, `bin/cli.ts has ${names.length} commands: ${names.join(', ')}`)
  const cli = await import('../../bin/cli.js') as Cli
  let seen: string[][] = []
  // node:util as it is, but a parseArgs that records the options it is given and stops the command there.
  const recording = {
    'node:util': {
      ...util,
      parseArgs: (config: { options?: Record<string, unknown> }) => {
        seen.push(Object.keys(config.options ?? {}))
        throw new Stop('options recorded')
      }
    }
  }
  const rows = docRows()
  const help = usages(cli.HELP)
  for (const { name, run, module } of commands()) {
    t.test(`nyala ${name}`, async (t) => {
      const usage = help.get(name)
      if (usage === undefined) {
        t.fail(`the help has no usage for nyala ${name}`)
        return
      }
      const usageFlags = flagsOf(usage)

      seen = []
      // The command's own module, its node:util replaced (tap mocks the imports of the module it loads).
      const command = await t.mockImport<Record<string, (args: string[]) => Promise<number>>>(module, recording)
      t.type(command[run], 'function', `${module.replace(/^(\.\.\/)+/, '')} exports ${run}`)
      const outcome = await quiet(async () => await command[run]!([]))
      t.ok(seen.length > 0, `running it reaches parseArgs (outcome: ${String(outcome)})`)
      const accepted = new Set(seen.flat().map((o) => `--${o}`))
      for (const flag of accepted) t.ok(usageFlags.has(flag), `its usage shows ${flag}, which it accepts`)
      // A flag the command takes out of its arguments itself (bench's --compare) is named as a string in its module.
      const source = readFileSync(new URL(module, import.meta.url).pathname.replace(/\.js$/, '.ts'), 'utf8')
      for (const flag of usageFlags) t.ok(accepted.has(flag) || source.includes(`'${flag}'`), `it accepts ${flag}, which its usage shows`)

      const row = rows.get(name)
      if (row === undefined) {
        t.fail(`docs/cli.md's CLI table has no row for nyala ${name}`)
        return
      }
      const rowFlags = flagsOf(row.row)
      for (const flag of usageFlags) t.ok(rowFlags.has(flag), `docs/cli.md's row shows ${flag}`)
      for (const flag of rowFlags) t.ok(usageFlags.has(flag), `docs/cli.md's ${flag} is in the usage`)
      const usageShown = shownValues(usageSynopsis(usage))
      for (const [flag, value] of shownValues(row.synopsis)) {
        if (!usageShown.has(flag)) continue // in the usage's description only: checked above
        t.equal(`${flag} ${value}`.trim(), `${flag} ${usageShown.get(flag)!}`.trim(), `docs/cli.md shows ${flag} as the usage does`)
      }
    })
  }
  t.test('docs/cli.md lists no command the CLI lacks', async (t) => {
    for (const name of rows.keys()) t.ok(name === 'help' || names.includes(name), `nyala ${name} is a command`)
    t.ok(rows.has('help'), 'and has a row for nyala help')
  })
})
