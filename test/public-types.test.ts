/**
 * The public surface of the entry points (`nyala`, `nyala/krpc`,
 * `nyala/testing`, `nyala/demo`) is small and closed:
 * - `nyala` exports at most 70 names, the server's own call records
 *   (`InboundCall`, `CallPeer`, `CallRoute`) from no entry point;
 * - every type a public signature names (a member, parameter or return type
 *   of an exported class, function, interface or alias) is exported by an
 *   entry point, or is a folded type: listed in typedoc.json's
 *   `intentionallyNotExported` (TypeDoc's validation, fatal, refuses any
 *   other), and the list holds only types a public signature names;
 * - every folded type has a row in CHANGELOG.md saying how to reach it, and
 *   that expression, compiled against the entry points, is that very type
 *   (or, for "extended by" rows, a type that extends it).
 * Deeper types (the members of folded types) are reached the same way and
 *   need no listing: TypeDoc reports one level.
 */
import t from 'tap'
import ts from 'typescript'
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { compileErrors } from './helpers/compile-errors.js'

const root = fileURLToPath(new URL('..', import.meta.url)).replace(/\/$/, '')
const ENTRIES = ['reactor/index.ts', 'reactor/krpc/index.ts', 'reactor/testing.ts', 'examples/calculator/index.ts']
const typedoc = JSON.parse(readFileSync(`${root}/typedoc.json`, 'utf8')) as { intentionallyNotExported?: string[], validation?: { notExported?: boolean } }
const changelog = readFileSync(`${root}/CHANGELOG.md`, 'utf8')

const program = ts.createProgram(ENTRIES.map((e) => `${root}/${e}`), {
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
  strict: true,
  types: ['node'],
  skipLibCheck: true,
  noEmit: true
})
const checker = program.getTypeChecker()
const resolve = (s: ts.Symbol): ts.Symbol => (s.flags & ts.SymbolFlags.Alias) !== 0 ? checker.getAliasedSymbol(s) : s

/** Each entry point's export names, and every declaration any entry point exports. */
const exportNames = new Map<string, string[]>()
const exported = new Set<ts.Symbol>()
for (const entry of ENTRIES) {
  const moduleSymbol = checker.getSymbolAtLocation(program.getSourceFile(`${root}/${entry}`)!)!
  const symbols = checker.getExportsOfModule(moduleSymbol)
  exportNames.set(entry, symbols.map((s) => s.name))
  for (const s of symbols) exported.add(resolve(s))
}

const ours = (d: ts.Declaration): boolean => {
  const file = d.getSourceFile().fileName
  return file.startsWith(`${root}/`) && !file.includes('/node_modules/')
}
const relative = (d: ts.Node): string => d.getSourceFile().fileName.slice(root.length + 1)

function isPublic (m: ts.ClassElement): boolean {
  if (m.name !== undefined && ts.isPrivateIdentifier(m.name)) return false
  const modifiers = ts.canHaveModifiers(m) ? ts.getModifiers(m) ?? [] : []
  return !modifiers.some((x) => x.kind === ts.SyntaxKind.PrivateKeyword || x.kind === ts.SyntaxKind.ProtectedKeyword)
}

/** Named declarations of ours a declaration's public signature refers to: type references, and inferred types of unannotated members. */
function referencedBy (s: ts.Symbol): Set<ts.Symbol> {
  const found = new Set<ts.Symbol>()
  const add = (x: ts.Symbol | undefined): void => {
    if (x === undefined) return
    x = resolve(x)
    const d = (x.declarations ?? []).filter(ours)[0]
    if (d === undefined || x === s) return
    if (ts.isInterfaceDeclaration(d) || ts.isTypeAliasDeclaration(d) || ts.isClassDeclaration(d) || ts.isEnumDeclaration(d)) found.add(x)
  }
  const inlined = new Set<ts.Symbol>()
  const node = (n: ts.Node): void => {
    if (ts.isTypeReferenceNode(n)) add(checker.getSymbolAtLocation(n.typeName))
    else if (ts.isExpressionWithTypeArguments(n)) {
      // An unexported interface of ours that an interface extends: TypeDoc shows its members as the
      // extending one's own, so what they name is named by this declaration (and the base is not).
      const base = checker.getSymbolAtLocation(n.expression)
      const target = base === undefined ? undefined : resolve(base)
      const declarations = (target?.declarations ?? []).filter(ours)
      if (target !== undefined && !exported.has(target) && declarations.length > 0 && declarations.every(ts.isInterfaceDeclaration)) {
        if (!inlined.has(target)) {
          inlined.add(target)
          for (const d of declarations) node(d)
        }
      } else add(base)
    }
    else if (ts.isTypeQueryNode(n)) add(checker.getSymbolAtLocation(n.exprName))
    // Function bodies and initializers are no signature.
    if (ts.isBlock(n)) return
    ts.forEachChild(n, node)
  }
  const inferred = (type: ts.Type): void => {
    add(type.aliasSymbol ?? type.getSymbol())
    for (const a of type.aliasTypeArguments ?? []) inferred(a)
    if (type.isUnionOrIntersection()) for (const u of type.types) inferred(u)
  }
  for (const d of (s.declarations ?? []).filter(ours)) {
    if (ts.isInterfaceDeclaration(d) || ts.isTypeAliasDeclaration(d)) node(d)
    else if (ts.isClassDeclaration(d)) {
      for (const h of d.heritageClauses ?? []) node(h)
      for (const m of d.members) {
        if (!isPublic(m)) continue
        if (ts.isMethodDeclaration(m) || ts.isConstructorDeclaration(m) || ts.isGetAccessor(m) || ts.isSetAccessor(m)) {
          for (const p of m.parameters) if (p.type !== undefined) node(p.type)
          if (ts.isConstructorDeclaration(m) || ts.isSetAccessor(m)) continue
          if (m.type !== undefined) node(m.type)
          else {
            const signature = checker.getSignatureFromDeclaration(m)
            if (signature !== undefined) inferred(signature.getReturnType())
          }
        } else if (ts.isPropertyDeclaration(m)) {
          if (m.type !== undefined) node(m.type)
          else inferred(checker.getTypeAtLocation(m))
        }
      }
    } else if (ts.isFunctionDeclaration(d)) {
      for (const p of d.parameters) if (p.type !== undefined) node(p.type)
      if (d.type !== undefined) node(d.type)
    } else if (ts.isVariableDeclaration(d)) {
      if (d.type !== undefined) node(d.type)
      else inferred(checker.getTypeAtLocation(d))
    }
  }
  return found
}

/** Folded types, by name: declarations of ours a public signature names that no entry point exports, with the first that names it. */
const folded = new Map<string, string>()
/** Everything reached from the exports through folded types, for the report of deeper ones. */
const reached = new Map<string, string>()
{
  const queue = [...exported]
  const seen = new Set<ts.Symbol>(queue)
  while (queue.length > 0) {
    const s = queue.shift()!
    for (const r of referencedBy(s)) {
      if (exported.has(r)) continue
      const where = `${s.name} (${relative(s.declarations![0]!)})`
      if (exported.has(s) && !folded.has(r.name)) folded.set(r.name, where)
      if (!reached.has(r.name)) reached.set(r.name, where)
      if (!seen.has(r)) {
        seen.add(r)
        queue.push(r)
      }
    }
  }
}

t.test('nyala exports at most 70 names, and the server\'s call records from no entry point', async (t) => {
  const names = exportNames.get('reactor/index.ts')!
  t.ok(names.length <= 70, `nyala exports ${names.length} names`)
  for (const name of ['ServerOptions', 'ServerProtocol', 'ProtocolClientOptions', 'ClientProtocol', 'CallContext', 'ConnectionHandle', 'ProtocolServer', 'ProtocolClient', 'simpleProtocol', 'RpcError', 'ErrorCode', 'Clock', 'realClock']) {
    t.ok(names.includes(name), `nyala exports ${name}`)
  }
  for (const [entry, list] of exportNames) {
    for (const name of ['InboundCall', 'CallPeer', 'CallRoute', 'Server', 'Client']) t.notOk(list.includes(name), `${entry} does not export ${name}`)
  }
  const krpc = exportNames.get('reactor/krpc/index.ts')!
  for (const name of ['KrpcServer', 'KrpcClient', 'ProtoSchema', 'KrpcCode', 'Handler']) t.ok(krpc.includes(name), `nyala/krpc exports ${name}`)
  for (const name of krpc) t.notOk(names.includes(name) && !['Handler'].includes(name), `${name} is exported by nyala/krpc only`)
})

t.test('every type a public signature names is exported, or folded: listed for TypeDoc, and only those', async (t) => {
  t.equal(typedoc.validation?.notExported, true, 'TypeDoc still refuses an unexported type a public signature names')
  const listed = [...(typedoc.intentionallyNotExported ?? [])].sort()
  t.ok(folded.has('ServerStats') && folded.has('RouteGroupOptions'), `the walk finds the folded types (${folded.size})`)
  for (const [name, from] of [...folded].sort()) t.ok(listed.includes(name), `${name}, named by ${from}, is listed in typedoc.json's intentionallyNotExported`)
  for (const name of listed) t.ok(folded.has(name), `${name} (listed) is named by a public signature`)
})

/** CHANGELOG.md's folded-type rows: name → expression, and whether the row says "extended by". */
function changelogRows (): Map<string, { expression: string, extendedBy: boolean, typeArgs?: string }> {
  const rows = new Map<string, { expression: string, extendedBy: boolean, typeArgs?: string }>()
  for (const line of changelog.split('\n')) {
    // | `Name` | `expression` ... |, or | `Name<Args>` | ... for the instance the expression gives.
    const m = /^\s*\| `(\w+)(<[^`]+>)?` \| (extended by )?`([^`]+)`/.exec(line)
    if (m !== null) rows.set(m[1]!, { expression: m[4]!.replace(/\\\|/g, '|'), extendedBy: m[3] !== undefined, ...(m[2] === undefined ? {} : { typeArgs: m[2] }) })
  }
  return rows
}

t.test('CHANGELOG.md says how to reach every folded type, and each expression is that type', async (t) => {
  const rows = changelogRows()
  for (const name of folded.keys()) t.ok(rows.has(name), `CHANGELOG.md has a row for ${name}`)
  // Each row's expression against the original declaration, all in one program: the entry points' names, Req/Res as two unrelated types.
  const imports = ENTRIES.slice(0, 2).map((entry) => {
    const names = exportNames.get(entry)!.filter((n) => entry === 'reactor/index.ts' || !exportNames.get('reactor/index.ts')!.includes(n))
    return `import type { ${names.join(', ')} } from ${JSON.stringify(`${root}/${entry}`)}`
  })
  const lines = [...imports, 'type Req = { readonly req: true }', 'type Res = { readonly res: true }',
    'type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false',
    'type Extends<A, B> = [A] extends [B] ? true : false']
  // Names an expression uses that are folded themselves ("with X as above"), defined from their own rows.
  for (const [name, { expression, extendedBy }] of rows) if (!extendedBy && /^[A-Z]\w*$/.test(name) && changelog.includes(`with \`${name}\` as`)) lines.push(`type ${name} = ${expression}`)
  const checked: string[] = []
  for (const [name, { expression, extendedBy, typeArgs: given }] of rows) {
    const declaration = findDeclaration(name)
    if (declaration === undefined) {
      t.fail(`CHANGELOG.md names ${name}, which is declared nowhere`)
      continue
    }
    // A generic type as the expression instantiates it: with Req, Res where it names them, else its defaults (unknown without one).
    const parameters = declaration.typeParameters ?? []
    const args = parameters.map((p, i) => expression.includes('Req, Res') && i < 2 ? ['Req', 'Res'][i] : p.default === undefined ? 'unknown' : null)
    const typeArgs = given ?? (args.length === 0 || args.every((a) => a === null) ? '' : `<${args.map((a, i) => a ?? parameters[i]!.default!.getText()).join(', ')}>`)
    const original = `import(${JSON.stringify(`${root}/${relative(declaration).replace(/\.ts$/, '.js')}`)}).${name}${typeArgs}`
    lines.push(`export const check_${name}: ${extendedBy ? `Extends<${expression}, ${original}>` : `Same<${original}, ${expression}>`} extends true ? true : '${name}: the row ${extendedBy ? 'does not extend' : 'is not'} it' = true`)
    checked.push(name)
  }
  const errors = compileErrors(lines.join('\n'))
  t.same(errors, [], `every row's expression compiles and is its type (${checked.length} rows)`)
})

function findDeclaration (name: string): (ts.InterfaceDeclaration | ts.TypeAliasDeclaration | ts.ClassDeclaration) | undefined {
  for (const file of program.getSourceFiles()) {
    if (!file.fileName.startsWith(`${root}/`) || file.fileName.includes('/node_modules/')) continue
    for (const statement of file.statements) {
      if ((ts.isInterfaceDeclaration(statement) || ts.isTypeAliasDeclaration(statement) || ts.isClassDeclaration(statement)) &&
        statement.name?.text === name && (ts.getModifiers(statement) ?? []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword)) return statement
    }
  }
  return undefined
}
