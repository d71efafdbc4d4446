import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { basename, dirname, join, resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { generateFromFile } from '../codec/protobuf/proto-typegen.js'
import { INT64_MODES, type Int64Mode } from '../codec/protobuf/plain-messages.js'
import { usageError } from './options.js'

export const GEN_USAGE = `  nyala gen FILE.proto... [--out DIR] [--int64 bigint|string|number]
      Writes FILE.ts (into DIR, default beside the .proto) with TypeScript
      for the .proto: an interface per message, enums, and per service its
      method map and a typed definition (SERVICEService) for
      server.addService and client.service. The schema is embedded: no
      .proto is needed at run time. --int64: how 64-bit integer fields
      decode and are typed (default bigint; docs/your-own-service.md).
`

export async function gen (args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: {
      out: { type: 'string' },
      int64: { type: 'string', default: 'bigint' }
    },
    allowPositionals: true,
    strict: true
  })
  if (positionals.length === 0) throw usageError('expected a .proto file')
  const int64 = values.int64 as Int64Mode
  if (!INT64_MODES.includes(int64)) throw usageError(`--int64 must be one of ${INT64_MODES.join(', ')}, got '${values.int64}'`)
  for (const file of positionals) {
    let source: string
    try {
      source = readFileSync(file, 'utf8')
    } catch (err) {
      process.stderr.write(`nyala gen: cannot read ${file}: ${(err as Error).message}\n`)
      return 1
    }
    const dir = values.out ?? dirname(file)
    const target = join(dir, `${basename(file).replace(/\.proto$/, '')}.ts`)
    let text: string
    try {
      text = generateFromFile(resolve(file), source, { int64, command: `nyala gen ${basename(file)}${int64 === 'bigint' ? '' : ` --int64 ${int64}`}` })
    } catch (err) {
      process.stderr.write(`nyala gen: ${file}: ${(err as Error).message}\n`)
      return 1
    }
    mkdirSync(dir, { recursive: true })
    writeFileSync(target, text)
    process.stdout.write(`wrote ${target}\n`)
  }
  return 0
}
