import t from 'tap'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'

// The layering rule: arrows point one way. codec/ and scheduling/ import
// nothing of ours, transport/ only codec/, reactor/ any of the three; only
// codec/ imports protobufjs.
const ROOT = new URL('..', import.meta.url).pathname
const ALLOWED: Record<string, string[]> = {
  codec: ['codec'],
  scheduling: ['scheduling'],
  transport: ['transport', 'codec'],
  reactor: ['reactor', 'transport', 'codec', 'scheduling']
}

function sources (dir: string): string[] {
  const out: string[] = []
  for (const name of readdirSync(dir)) {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) out.push(...sources(path))
    else if (name.endsWith('.ts')) out.push(path)
  }
  return out
}

function importsOf (file: string): string[] {
  const text = readFileSync(file, 'utf8')
  const found: string[] = []
  for (const match of text.matchAll(/(?:^|\n)\s*(?:import|export)[^'"]*?from\s+['"]([^'"]+)['"]/g)) found.push(match[1]!)
  for (const match of text.matchAll(/import\(\s*['"]([^'"]+)['"]\s*\)/g)) found.push(match[1]!)
  return found
}

for (const [layer, allowed] of Object.entries(ALLOWED)) {
  t.test(`${layer}/ imports only ${allowed.join(', ')}`, async (t) => {
    const files = sources(join(ROOT, layer))
    t.ok(files.length > 0, `${layer}/ has sources`)
    for (const file of files) {
      for (const spec of importsOf(file)) {
        if (spec.startsWith('.')) {
          const target = join(file, '..', spec).slice(ROOT.length).split('/')[0]!
          t.ok(allowed.includes(target), `${file.slice(ROOT.length)} imports ${spec} (layer ${target})`)
        } else if (spec === 'protobufjs' || spec.startsWith('protobufjs/')) {
          t.equal(layer, 'codec', `${file.slice(ROOT.length)} imports protobufjs`)
        }
      }
    }
  })
}

// Protocol-specific code lives in its own place (codec/krpc/, reactor/krpc/,
// examples/<protocol>/); the generic layers never import it. Only the
// package's entry point (reactor/index.ts) names KRPC, to export it.
const PROTOCOL_PLACES = ['codec/krpc/', 'reactor/krpc/', 'examples/']
const ENTRY_POINTS = new Set(['reactor/index.ts'])

t.test('the generic server, client, transport, scheduling and codec import nothing protocol-specific', async (t) => {
  let generic = 0
  for (const layer of Object.keys(ALLOWED)) {
    for (const file of sources(join(ROOT, layer))) {
      const rel = file.slice(ROOT.length)
      if (PROTOCOL_PLACES.some(place => rel.startsWith(place)) || ENTRY_POINTS.has(rel)) continue
      generic++
      for (const spec of importsOf(file)) {
        if (!spec.startsWith('.')) continue
        const target = join(file, '..', spec).slice(ROOT.length)
        t.notOk(PROTOCOL_PLACES.some(place => target.startsWith(place)), `${rel} imports ${spec}`)
      }
    }
  }
  t.ok(generic > 20, `checked ${generic} generic files`)
  t.ok(sources(join(ROOT, 'reactor')).some(f => f.endsWith('reactor/server.ts')), 'the generic server is reactor/server.ts')
})

t.test('KRPC\'s wire code (codec/krpc/) imports only codec/', async (t) => {
  for (const file of sources(join(ROOT, 'codec', 'krpc'))) {
    for (const spec of importsOf(file)) {
      if (!spec.startsWith('.')) continue
      const target = join(file, '..', spec).slice(ROOT.length)
      t.ok(target.startsWith('codec/'), `${file.slice(ROOT.length)} imports ${spec}`)
    }
  }
})
