/**
 * TypeScript from a .proto (`nyala gen`): an interface per message, a
 * const object and a type per enum, a method map and a typed `ServiceDef`
 * per service, and the schema itself embedded as a JSON descriptor, so that
 * the file needs no .proto at run time. Types follow what the runtime
 * gives (codec/protobuf/plain-messages.ts), field names as the .proto spells them:
 *
 *   double float int32 uint32 sint32 fixed32 sfixed32   number
 *   int64 uint64 sint64 fixed64 sfixed64               bigint | string | number (the int64 mode)
 *   bool                                                boolean
 *   string                                              string
 *   bytes                                               Buffer
 *   enum E                                              E (a union of its numbers)
 *   message M                                           M (`| null` unless required)
 *   repeated T                                          T[]
 *   map<K, V>                                           Record<string, V>
 *
 * A required field is a required property; every other one is optional
 * (`?`), as it may be left out when writing: decoded messages hold it anyway.
 * Method maps are type aliases (an interface has no index signature, and
 * `MethodMap` is a record).
 */
import protobuf from 'protobufjs'
import { DEFAULT_INT64_MODE, type Int64Mode } from './plain-messages.js'

export interface TypegenOptions {
  /** The int64 mode the file types 64-bit fields with and loads the schema with. */
  int64?: Int64Mode
  /** The module the file imports nyala's KRPC API from (default `nyala/krpc`, where `ProtoSchema` and the service types live). */
  runtime?: string
  /** Shown in the file's header: the command that made it. */
  command?: string
}

const SCALARS: Record<string, string> = {
  double: 'number', float: 'number', int32: 'number', uint32: 'number', sint32: 'number', fixed32: 'number', sfixed32: 'number',
  bool: 'boolean', string: 'string', bytes: 'Buffer'
}
const LONGS = new Set(['int64', 'uint64', 'sint64', 'fixed64', 'sfixed64'])
const RESERVED = new Set(['break', 'case', 'catch', 'class', 'const', 'continue', 'debugger', 'default', 'delete', 'do', 'else', 'enum', 'export', 'extends',
  'false', 'finally', 'for', 'function', 'if', 'import', 'in', 'instanceof', 'new', 'null', 'return', 'super', 'switch', 'this', 'throw', 'true', 'try',
  'typeof', 'var', 'void', 'while', 'with', 'as', 'implements', 'interface', 'let', 'package', 'private', 'protected', 'public', 'static', 'yield',
  'any', 'boolean', 'number', 'string', 'symbol', 'type', 'object', 'never', 'unknown', 'bigint', 'Buffer', 'Record', 'Array', 'Object', 'ProtoSchema',
  'ServiceDef', 'ServiceHandlers', 'Stub', 'DESCRIPTOR', 'schema'])

const bare = (fullName: string): string => fullName.replace(/^\./, '')

// A property key: the name itself when it is an identifier, else quoted.
const key = (name: string): string => /^[A-Za-z_$][\w$]*$/.test(name) ? name : JSON.stringify(name)

function * walk (ns: protobuf.NamespaceBase): Generator<protobuf.ReflectionObject> {
  for (const nested of ns.nestedArray) {
    yield nested
    if (nested instanceof protobuf.Namespace || nested instanceof protobuf.Type) yield * walk(nested as protobuf.NamespaceBase)
  }
}

/** Generates the TypeScript of `root` (types of package `pkg` named without it). */
export function generateTypes (root: protobuf.Root, pkg: string, options: TypegenOptions = {}): string {
  root.resolveAll()
  const int64 = options.int64 ?? DEFAULT_INT64_MODE
  const runtime = options.runtime ?? 'nyala/krpc'
  const types: protobuf.Type[] = []
  const enums: protobuf.Enum[] = []
  const services: protobuf.Service[] = []
  for (const object of walk(root)) {
    if (object instanceof protobuf.Type) types.push(object)
    else if (object instanceof protobuf.Enum) enums.push(object)
    else if (object instanceof protobuf.Service) services.push(object)
  }
  // TypeScript names: the full name without the file's package, nesting joined by `_`.
  const names = new Map<string, string>()
  const taken = new Set<string>()
  const nameOf = (object: protobuf.ReflectionObject): string => {
    const full = bare(object.fullName)
    let found = names.get(full)
    if (found === undefined) {
      const relative = pkg !== '' && full.startsWith(`${pkg}.`) ? full.slice(pkg.length + 1) : full
      let name = relative.replace(/\./g, '_')
      if (RESERVED.has(name)) name = `${name}_`
      while (taken.has(name)) name = `${name}_`
      taken.add(name)
      names.set(full, name)
      found = name
    }
    return found
  }
  for (const object of [...types, ...enums]) nameOf(object)

  const long = int64
  const fieldType = (field: protobuf.Field): string => {
    field.resolve()
    const resolved = field.resolvedType
    const scalar = resolved === null ? (LONGS.has(field.type) ? long : SCALARS[field.type]) : nameOf(resolved)
    if (scalar === undefined) throw new Error(`field ${bare(field.fullName)}: unknown type ${field.type}`)
    if (field.map) return `Record<string, ${scalar}>`
    if (field.repeated) return `${scalar}[]`
    return scalar
  }

  const out: string[] = []
  out.push(`// Generated by ${options.command ?? 'nyala gen'}: do not edit (run it again when the .proto changes).`)
  out.push(`// 64-bit integers are ${int64 === 'bigint' ? 'bigints' : int64 === 'string' ? 'decimal strings' : 'numbers (exact up to 2^53)'}; decoded messages are plain objects holding every field.`)
  out.push(`import { ProtoSchema, type ServiceDef, type ServiceHandlers, type Stub } from '${runtime}'`)
  out.push('')

  for (const e of enums) {
    const name = nameOf(e)
    out.push(`/** enum ${bare(e.fullName)} */`)
    out.push(`export const ${name} = {`)
    const entries = Object.entries(e.values)
    entries.forEach(([k, v], i) => out.push(`  ${key(k)}: ${v}${i + 1 < entries.length ? ',' : ''}`))
    out.push('} as const')
    out.push(`export type ${name} = typeof ${name}[keyof typeof ${name}]`)
    out.push('')
  }

  for (const type of types) {
    const name = nameOf(type)
    out.push(`/** message ${bare(type.fullName)} */`)
    if (type.fieldsArray.length === 0) {
      out.push(`export type ${name} = Record<string, never>`)
      out.push('')
      continue
    }
    out.push(`export interface ${name} {`)
    for (const field of type.fieldsArray) {
      let ts = fieldType(field)
      const isMessage = field.resolvedType instanceof protobuf.Type && !field.repeated && !field.map
      if (isMessage && !field.required) ts = `${ts} | null`
      const comment = field.partOf !== null && !field.partOf.name.startsWith('_') ? ` // oneof ${field.partOf.name}` : ''
      out.push(`  ${key(field.name)}${field.required ? '' : '?'}: ${ts}${comment}`)
    }
    out.push('}')
    out.push('')
  }

  out.push('/** The schema (every definition the .proto and its imports hold), embedded. */')
  out.push(`const DESCRIPTOR = ${JSON.stringify(JSON.parse(JSON.stringify(root.toJSON())))}`)
  out.push('')
  out.push(`/** The schema, its 64-bit integers as ${int64}s. */`)
  out.push(`export const schema = ProtoSchema.fromDescriptor(DESCRIPTOR, { int64: ${JSON.stringify(int64)} })`)

  for (const service of services) {
    const full = bare(service.fullName)
    // Named apart from the messages: `X` or `XService` gives XService, XMethods, XHandlers and XStub.
    const relative = pkg !== '' && full.startsWith(`${pkg}.`) ? full.slice(pkg.length + 1) : full
    let base = relative.replace(/\./g, '_').replace(/Service$/, '')
    while (['Service', 'Methods', 'Handlers', 'Stub'].some((suffix) => taken.has(`${base}${suffix}`))) base = `${base}_`
    for (const suffix of ['Service', 'Methods', 'Handlers', 'Stub']) taken.add(`${base}${suffix}`)
    const methods = service.methodsArray.filter((m) => m.requestStream !== true && m.responseStream !== true)
    out.push('')
    out.push(`/** Request and response of each method of ${full}: a type alias, so that it fits MethodMap. */`)
    out.push(`export type ${base}Methods = {`)
    for (const method of service.methodsArray) {
      method.resolve()
      if (!methods.includes(method)) {
        out.push(`  // ${method.name}: streaming, which KRPC has not`)
        continue
      }
      out.push(`  ${key(method.name)}: { request: ${nameOf(method.resolvedRequestType!)}, response: ${nameOf(method.resolvedResponseType!)} }`)
    }
    out.push('}')
    out.push(`/** ${full}: for \`server.addService(${base}Service, handlers)\` and \`client.service(${base}Service)\`. */`)
    out.push(`export const ${base}Service: ServiceDef<${base}Methods> = schema.service<${base}Methods>(${JSON.stringify(full)})`)
    out.push(`/** The handlers \`addService(${base}Service, ...)\` takes. */`)
    out.push(`export type ${base}Handlers = ServiceHandlers<${base}Methods>`)
    out.push(`/** What \`client.service(${base}Service)\` returns. */`)
    out.push(`export type ${base}Stub = Stub<${base}Methods>`)
  }
  return `${out.join('\n')}\n`
}

/** Loads `file` (imports resolved beside it) and generates its TypeScript. */
export function generateFromFile (file: string, source: string, options: TypegenOptions = {}): string {
  const root = new protobuf.Root().loadSync(file, { keepCase: true })
  const pkg = protobuf.parse(source, { keepCase: true }).package ?? ''
  return generateTypes(root, pkg, options)
}
