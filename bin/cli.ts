import { readFileSync } from 'node:fs'
import { bench, BENCH_USAGE } from './bench.js'
import { call, CALL_USAGE } from './call.js'
import { fairness, FAIRNESS_USAGE } from './fairness-command.js'
import { gen, GEN_USAGE } from './gen.js'
import { isUsageError } from './options.js'
import { passwd, PASSWD_USAGE } from './passwd.js'
import { serve, SERVE_USAGE } from './serve.js'
import { trace, TRACE_USAGE } from './trace.js'

interface Command {
  run: (args: string[]) => Promise<number>
  usage: string
}

const COMMANDS: Record<string, Command> = {
  serve: { run: serve, usage: SERVE_USAGE },
  call: { run: call, usage: CALL_USAGE },
  passwd: { run: passwd, usage: PASSWD_USAGE },
  fairness: { run: fairness, usage: FAIRNESS_USAGE },
  trace: { run: trace, usage: TRACE_USAGE },
  gen: { run: gen, usage: GEN_USAGE },
  bench: { run: bench, usage: BENCH_USAGE }
}

const HELP_USAGE = `  nyala help [COMMAND]
      This text, or one command's usage (as COMMAND --help does).

  nyala --version
      The installed version.
`

/** The whole help: every command's usage. */
export const HELP = `nyala: raw-TCP binary RPC servers for Node.js that speak Apache Kudu's KRPC

Usage:
${Object.values(COMMANDS).map((c) => c.usage).join('\n')}
${HELP_USAGE}`

function version (): string {
  const pkg = JSON.parse(readFileSync(new URL(import.meta.url.endsWith('.ts') ? '../package.json' : '../../package.json', import.meta.url), 'utf8')) as { version: string }
  return pkg.version
}

/** Runs the CLI; resolves with the exit code (serve resolves when the server has closed). */
export async function main (argv: string[]): Promise<number> {
  const [name, ...rest] = argv
  const command = name !== undefined && Object.hasOwn(COMMANDS, name) ? COMMANDS[name] : undefined
  if (command !== undefined) {
    if (rest.includes('--help') || rest.includes('-h')) {
      process.stdout.write(`Usage:\n${command.usage}`)
      return 0
    }
    try {
      return await command.run(rest)
    } catch (err) {
      // A mistyped flag or value is the user's error: one line and the exit code of a usage error, no stack.
      if (!isUsageError(err)) throw err
      process.stderr.write(`nyala ${name}: ${(err as Error).message}\n(nyala ${name} --help lists its options)\n`)
      return 2
    }
  }
  switch (name) {
    case undefined:
    case '--help':
    case '-h':
      process.stdout.write(HELP)
      return 0
    case 'help': {
      const topic = rest[0]
      if (topic === undefined) {
        process.stdout.write(HELP)
        return 0
      }
      const about = Object.hasOwn(COMMANDS, topic) ? COMMANDS[topic] : undefined
      if (about === undefined) {
        process.stderr.write(`nyala help: unknown command '${topic}' (commands: ${Object.keys(COMMANDS).join(', ')})\n`)
        return 2
      }
      process.stdout.write(`Usage:\n${about.usage}`)
      return 0
    }
    case '--version':
    case '-v':
    case 'version':
      process.stdout.write(`${version()}\n`)
      return 0
    default:
      process.stderr.write(`nyala: unknown command '${name}' (commands: ${Object.keys(COMMANDS).join(', ')}; nyala help lists their options)\n`)
      return 2
  }
}
