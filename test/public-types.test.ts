/**
 * Every type a user of `nyala` has to name is exported by `nyala`: the
 * TypeScript compiler reads reactor/index.ts and walks, from the public
 * classes `Server`, `Client`, `ProtocolServer` and from `serveReactors`,
 * (1) the types of their options and other parameters and (2) the types
 * their methods and properties return (stats, metrics snapshots), through
 * every interface and type alias declared in this repository that these
 * refer to. Each such declaration must be exported from the entry point, so
 * that no one has to write `import ... from 'nyala/dist/...'`.
 */
import t from 'tap'
import ts from 'typescript'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url)).replace(/\/$/, '')
const entry = `${root}/reactor/index.ts`

const program = ts.createProgram([entry], {
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
  strict: true,
  types: ['node'],
  skipLibCheck: true,
  noEmit: true
})
const checker = program.getTypeChecker()
const moduleSymbol = checker.getSymbolAtLocation(program.getSourceFile(entry)!)!

const resolve = (s: ts.Symbol): ts.Symbol => (s.flags & ts.SymbolFlags.Alias) !== 0 ? checker.getAliasedSymbol(s) : s
/** What `nyala` exports, by the declaration each export resolves to. */
const exported = new Map<ts.Symbol, string>()
for (const s of checker.getExportsOfModule(moduleSymbol)) exported.set(resolve(s), s.name)
const byName = new Map([...exported].map(([s, name]) => [name, s]))

const ours = (d: ts.Declaration): boolean => {
  const file = d.getSourceFile().fileName
  return file.startsWith(`${root}/`) && !file.includes('/node_modules/')
}
const relative = (d: ts.Declaration): string => d.getSourceFile().fileName.slice(root.length + 1)
const memberName = (m: ts.ClassElement): string => m.name?.getText() ?? 'constructor'

function isPublic (m: ts.ClassElement): boolean {
  if (m.name !== undefined && ts.isPrivateIdentifier(m.name)) return false
  const modifiers = ts.canHaveModifiers(m) ? ts.getModifiers(m) ?? [] : []
  return !modifiers.some((x) => x.kind === ts.SyntaxKind.PrivateKeyword || x.kind === ts.SyntaxKind.ProtectedKeyword)
}

/** A walk that records, for every declaration of ours it reaches, where it came from. */
class Walk {
  readonly reached = new Map<string, string>()
  readonly #seen = new Set<ts.Symbol>()
  /** Classes reached are walked (their public members' return types) while depth > 0. */
  readonly classDepth: number
  constructor (classDepth: number) { this.classDepth = classDepth }

  symbol (s: ts.Symbol, from: string, depth: number): void {
    s = resolve(s)
    const decls = (s.declarations ?? []).filter(ours)
    const first = decls[0]
    if (first === undefined) return
    const named = ts.isInterfaceDeclaration(first) || ts.isTypeAliasDeclaration(first) || ts.isClassDeclaration(first) ||
      ts.isEnumDeclaration(first) || ts.isFunctionDeclaration(first) || ts.isVariableDeclaration(first)
    if (!named) return
    if (!this.reached.has(s.name)) this.reached.set(s.name, `${from} (${relative(first)})`)
    if (this.#seen.has(s)) return
    this.#seen.add(s)
    for (const d of decls) {
      if (ts.isInterfaceDeclaration(d) || ts.isTypeAliasDeclaration(d)) this.node(d, s.name, depth)
      else if (ts.isClassDeclaration(d) && depth > 0) this.classReturns(d, s.name, depth - 1)
    }
  }

  node (n: ts.Node, from: string, depth: number): void {
    let name: ts.Node | undefined
    if (ts.isTypeReferenceNode(n)) name = n.typeName
    else if (ts.isExpressionWithTypeArguments(n)) name = n.expression
    else if (ts.isTypeQueryNode(n)) name = n.exprName
    if (name !== undefined) {
      const s = checker.getSymbolAtLocation(name)
      if (s !== undefined) this.symbol(s, from, depth)
    }
    ts.forEachChild(n, (c) => { this.node(c, from, depth) })
  }

  type (type: ts.Type, from: string, depth: number): void {
    const s = type.aliasSymbol ?? type.getSymbol()
    if (s !== undefined) this.symbol(s, from, depth)
    for (const a of type.aliasTypeArguments ?? []) this.type(a, from, depth)
    if (type.isUnionOrIntersection()) for (const u of type.types) this.type(u, from, depth)
    if ((type as ts.TypeReference).target !== undefined) for (const a of checker.getTypeArguments(type as ts.TypeReference)) this.type(a, from, depth)
  }

  /** The types of every parameter of every public method and constructor. */
  classParameters (c: ts.ClassDeclaration, name: string): void {
    for (const m of c.members) {
      if (!isPublic(m) || !(ts.isMethodDeclaration(m) || ts.isConstructorDeclaration(m) || ts.isSetAccessor(m))) continue
      for (const p of m.parameters) if (p.type !== undefined) this.node(p.type, `${name}.${memberName(m)}`, this.classDepth)
    }
  }

  /** The types public methods, getters and properties give back. */
  classReturns (c: ts.ClassDeclaration, name: string, depth: number): void {
    for (const m of c.members) {
      if (!isPublic(m) || ts.isConstructorDeclaration(m) || ts.isSetAccessor(m)) continue
      const from = `${name}.${memberName(m)}`
      if (ts.isMethodDeclaration(m) || ts.isGetAccessor(m)) {
        if (m.type !== undefined) this.node(m.type, from, depth)
        else {
          const signature = checker.getSignatureFromDeclaration(m)
          if (signature !== undefined) this.type(signature.getReturnType(), from, depth)
        }
      } else if (ts.isPropertyDeclaration(m)) {
        if (m.type !== undefined) this.node(m.type, from, depth)
        else this.type(checker.getTypeAtLocation(m), from, depth)
      }
    }
  }
}

function declaration<T extends ts.Declaration> (name: string, is: (d: ts.Declaration) => d is T): T {
  const s = byName.get(name)
  const d = s?.declarations?.find(is)
  if (d === undefined) throw new Error(`nyala does not export ${name}`)
  return d
}

const ROOT_CLASSES = ['Server', 'Client', 'ProtocolServer']

t.test('every type an option of Server, Client, ProtocolServer or serveReactors refers to is exported by nyala', async (t) => {
  // Classes reached from options (e.g. RetryBudget) must be exported, their own parameters are not options here.
  const walk = new Walk(0)
  for (const name of ROOT_CLASSES) walk.classParameters(declaration(name, ts.isClassDeclaration), name)
  const serveReactors = declaration('serveReactors', ts.isFunctionDeclaration)
  for (const p of serveReactors.parameters) if (p.type !== undefined) walk.node(p.type, 'serveReactors', 0)
  t.ok(walk.reached.has('ReactorsOptions') && walk.reached.has('ClientOptions') && walk.reached.has('KrpcServerOptions'), 'the walk reaches the option types')
  for (const [name, from] of walk.reached) t.ok(byName.has(name), `${name}, used by ${from}, is exported`)
})

t.test('every type their methods and properties return is exported by nyala (stats, metrics snapshots)', async (t) => {
  // One level into classes reached: `server.metrics` is a ServerMetrics, whose snapshot() gives ServiceSnapshots.
  const walk = new Walk(1)
  for (const name of ROOT_CLASSES) walk.classReturns(declaration(name, ts.isClassDeclaration), name, 1)
  const serveReactors = declaration('serveReactors', ts.isFunctionDeclaration)
  if (serveReactors.type !== undefined) walk.node(serveReactors.type, 'serveReactors', 1)
  t.ok(walk.reached.has('ServiceSnapshot'), 'the walk reaches the metrics snapshot')
  for (const [name, from] of walk.reached) t.ok(byName.has(name), `${name}, returned by ${from}, is exported`)
})

t.test('the names options and results need, by name', async (t) => {
  const names = ['Clock', 'realClock', 'TimerHandle', 'Authenticator', 'QueueDiscipline', 'BalancePolicy',
    'ServerMetrics', 'ServiceSnapshot', 'MethodSnapshot', 'HistogramSnapshot', 'LimitCounters', 'ServerStats',
    'ConnectionStats', 'TransferQueueStats', 'ThreadPoolStats', 'RetryBudgetOptions', 'RetryBudgetStats',
    'ExponentialBackoffOptions', 'LinearBackoffOptions', 'Jitter', 'RpcErrorOptions', 'ProcessUsage']
  for (const name of names) t.ok(byName.has(name), `nyala exports ${name}`)
  const api = await import('../reactor/index.js')
  t.type(api.realClock.now, 'function', 'realClock is a value')
})
