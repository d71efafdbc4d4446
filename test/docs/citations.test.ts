/**
 * The docs stand alone: no README, doc or source file cites a document
 * that is not in the repository (the wire contract, the Kudu reference,
 * "seed N" or "issue N" notes, peers.md, ...: the Kudu background is
 * docs/design.md, the wire details docs/wire-format.md), every `NAME.md`
 * a file mentions exists, and every relative link of README.md and
 * docs/*.md points at an existing file (and, with `#anchor`, at a heading
 * of it). bench/RESULTS.md is a lab notebook and may say "issue N"; it is
 * not scanned, though links to it are checked.
 */
import t from 'tap'
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { dirname, join, normalize, relative } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '')
const self = relative(root, fileURLToPath(import.meta.url))
const SKIP_DIRS = new Set(['node_modules', 'dist', 'coverage'])
const NOT_SCANNED = new Set(['bench/RESULTS.md', self])

/** Repository files (relative paths) ending in one of `exts`, outside node_modules, dist and dot-directories. */
function files (exts: string[], dir = root): string[] {
  const found: string[] = []
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (entry.name.startsWith('.') || SKIP_DIRS.has(entry.name)) continue
    const path = join(dir, entry.name)
    if (entry.isDirectory()) found.push(...files(exts, path))
    else if (exts.some((ext) => entry.name.endsWith(ext))) found.push(relative(root, path))
  }
  return found
}

// Citations of documents that live outside the repository. Built from parts
// so that this file does not match itself when read by a grep.
const CITATIONS: Array<[string, RegExp]> = [
  ['the wire contract', new RegExp(['wire', 'contract'].join('-'), 'i')],
  ['the Kudu RPC reference', new RegExp(['kudu', 'rpc', 'reference'].join('-'), 'i')],
  ['peers.md', /\bpeers\.md\b/],
  ['a numbered seed', /\b[Ss]eed[ -]0\d*\b|\b[Ss]eed [0-9]+'s\b|\bseeds? [0-9]{3}\b/],
  ['a numbered issue', /\b[Ii]ssue [0-9]+\b/],
  ['a numbered section (§)', /\u00a7/],
  ['"the reference"', /\(reference (?:\u00a7|\d)|\bthe Kudu reference\b/],
  ['"the contract"', /\bthe (?:wire |project's )?contract (?:says|allows|decides|line)/]
]

const scanned = files(['.ts', '.md', '.mts', '.cts', '.js']).filter((f) => !NOT_SCANNED.has(f) && !f.startsWith('bin/nyala'))

t.test('no file cites a document outside the repository', async (t) => {
  t.ok(scanned.includes('README.md') && scanned.includes('docs/design.md') && scanned.includes('reactor/index.ts'), `${scanned.length} files scanned`)
  for (const file of scanned) {
    const lines = readFileSync(join(root, file), 'utf8').split('\n')
    const hits: string[] = []
    lines.forEach((line, i) => {
      for (const [what, pattern] of CITATIONS) if (pattern.test(line)) hits.push(`${file}:${i + 1}: ${what}: ${line.trim().slice(0, 120)}`)
    })
    if (hits.length > 0) t.fail(`${file} cites documents not in the repository`, { hits })
  }
  t.pass('scanned')
})

const markdown = files(['.md'])

/** Where a mention of `name` (e.g. `docs/design.md`, `design.md`, `../bench/RESULTS.md`) in `file` may point. */
function resolves (file: string, name: string): boolean {
  const candidates = [normalize(join(dirname(file), name)), normalize(name), normalize(join('docs', name))]
  if (candidates.some((c) => !c.startsWith('..') && existsSync(join(root, c)))) return true
  // A bare name mentioned in prose ("see RESULTS.md"): some Markdown file of the repository by that name.
  return !name.includes('/') && markdown.some((m) => m.endsWith(`/${name}`))
}

t.test('every NAME.md a file mentions exists', async (t) => {
  for (const file of scanned) {
    const text = readFileSync(join(root, file), 'utf8')
    const missing = new Set<string>()
    for (const m of text.matchAll(/(?<![\w./-])((?:\.{1,2}\/)*[\w-]+(?:\/[\w.-]+)*\.md)\b/g)) {
      const name = m[1]!
      if (name.includes('node_modules')) continue
      if (!resolves(file, name)) missing.add(name)
    }
    t.same([...missing], [], `${file}: every .md it names exists`)
  }
})

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes. */
function slug (heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').replace(/\s/g, '-')
}

function anchorsOf (file: string): Set<string> {
  const anchors = new Set<string>()
  const counts = new Map<string, number>()
  let fenced = false
  for (const line of readFileSync(join(root, file), 'utf8').split('\n')) {
    if (/^\s*```/.test(line)) fenced = !fenced
    if (fenced) continue
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)
    if (m === null) continue
    const base = slug(m[1]!)
    const n = counts.get(base) ?? 0
    counts.set(base, n + 1)
    anchors.add(n === 0 ? base : `${base}-${n}`)
  }
  return anchors
}

t.test('every relative link of README.md and docs/*.md points at an existing file and heading', async (t) => {
  const docs = ['README.md', ...readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)]
  t.ok(docs.includes('docs/design.md'), 'docs/design.md is one of them')
  for (const doc of docs) {
    // Links outside code: fenced blocks and `code` spans are not links.
    const text = readFileSync(join(root, doc), 'utf8').replace(/```[\s\S]*?```/g, '').replace(/`[^`\n]*`/g, '')
    for (const m of text.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
      const target = m[1]!
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue // http:, https:, mailto:
      const [path, anchor] = target.split('#') as [string, string | undefined]
      const file = path === '' ? doc : normalize(join(dirname(doc), decodeURIComponent(path)))
      const exists = !file.startsWith('..') && existsSync(join(root, file))
      t.ok(exists, `${doc} → ${target}: ${file} exists`)
      if (!exists || anchor === undefined || anchor === '') continue
      if (statSync(join(root, file)).isDirectory() || !file.endsWith('.md')) continue
      t.ok(anchorsOf(file).has(anchor.toLowerCase()), `${doc} → ${target}: ${file} has a heading #${anchor}`)
    }
  }
})
