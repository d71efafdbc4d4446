import { parseArgs } from 'node:util'
import { RpcError } from '../codec/errors.js'
import { ProtoSchema, type Message, type ServiceDef } from '../codec/protobuf/schema.js'
import { Client, type ClientTlsOptions } from '../reactor/krpc/client.js'
import { CALCULATOR_PROTO, CalculatorService } from '../examples/calculator/index.js'
import { CLIENT_TLS_FLAG_OPTIONS, clientTlsFromFlags } from './tls-flags.js'
import { intOption } from './options.js'

export const CALL_USAGE = `  nyala call HOST:PORT SERVICE.METHOD 'JSON' [--timeout-ms N] [--proto FILE]
              [--user NAME] [--password PW] [--tls] [--tls-ca FILE]
              [--tls-cert FILE --tls-key FILE] [--tls-servername NAME]
              [--tls-insecure] [--require-tls] [--encrypt-loopback]
      Calls one method, like grpcurl: the JSON request is encoded with the
      .proto (default: the demo service's), the response printed as JSON.
      JSON (default {}) follows protobuf's JSON mapping with the .proto's
      field names: bytes fields take base64 strings, int64 fields decimal
      strings or numbers (up to 2^53), enums names or numbers. A request
      with a missing required field, an unknown field or a value of the
      wrong type or range is refused, naming the field, and nothing is sent
      (exit 2). On a failed call prints the error code and message and
      exits 1. --user and --password are SASL PLAIN credentials. --tls
      offers TLS inside negotiation, as Kudu's clients do, the server's
      certificate checked against Node's CAs and the endpoint's host name;
      any other TLS flag implies it: --tls-ca FILE checks it against that
      CA instead, --tls-servername NAME against that name, --tls-insecure
      not at all; --tls-cert and --tls-key authenticate this client by
      certificate. --require-tls (which implies --tls) fails with a server
      that does not offer TLS. On loopback TLS only authenticates and the
      call then travels in plain text, unless --encrypt-loopback.
      Example: nyala call 127.0.0.1:7050 nyala.demo.CalculatorService.Add '{"x":1,"y":2}'
`

export async function call (args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: {
      'timeout-ms': { type: 'string', default: '10000' },
      proto: { type: 'string' },
      user: { type: 'string' },
      password: { type: 'string' },
      ...CLIENT_TLS_FLAG_OPTIONS,
      'require-tls': { type: 'boolean', default: false },
      'encrypt-loopback': { type: 'boolean', default: false }
    },
    allowPositionals: true,
    strict: true
  })
  const [endpoint, target, json] = positionals
  if (endpoint === undefined || target === undefined) {
    process.stderr.write(`nyala call: expected HOST:PORT SERVICE.METHOD 'JSON'\n`)
    return 2
  }
  const dot = target.lastIndexOf('.')
  const serviceName = target.slice(0, dot)
  const methodName = target.slice(dot + 1)
  let tls: ClientTlsOptions | undefined
  try {
    tls = clientTlsFromFlags({ ...values, tls: values.tls === true || values['require-tls'] })
  } catch (err) {
    if (!(err instanceof RangeError)) throw err
    process.stderr.write(`nyala call: ${err.message}\n`)
    return 2
  }
  const client = new Client({
    ...(values.user === undefined ? {} : { user: values.user }),
    ...(values.password === undefined ? {} : { password: values.password }),
    ...(tls === undefined ? {} : { tls }),
    ...(values['require-tls'] ? { requireTls: true } : {}),
    ...(values['encrypt-loopback'] ? { encryptLoopback: true } : {})
  })
  try {
    if (dot <= 0) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `expected SERVICE.METHOD, got '${target}'`)
    const schema = values.proto === undefined ? null : ProtoSchema.load(values.proto)
    const def: ServiceDef = schema === null
      ? (serviceName === CalculatorService.fullName ? CalculatorService as unknown as ServiceDef : ProtoSchema.load(CALCULATOR_PROTO).service(serviceName))
      : schema.service(serviceName)
    const method = def.methods[methodName]
    // An unknown method is still sent (the server answers ERROR_NO_SUCH_METHOD) when the
    // .proto does not know it; that needs a request type, so refuse here instead.
    if (method === undefined) throw new RpcError('RPC_ERR_INVALID_ARGUMENT', `${serviceName} has no method ${methodName} in the .proto`)
    let parsed: unknown
    try {
      parsed = JSON.parse(json ?? '{}')
    } catch (err) {
      return invalidRequest(`not valid JSON: ${(err as Error).message}`)
    }
    // The client's own check (it runs again when the call encodes the
    // request): a bad request is a usage error, and nothing is sent. The
    // JSON's base64 strings, int64 strings and enum names are converted when
    // the request is encoded.
    const problem = method.requestType.validateRequest(parsed)
    if (problem !== null) return invalidRequest(problem)
    const result = await client.call(endpoint, def, methodName, parsed as Message, { timeoutMs: intOption(values['timeout-ms'], 'timeout-ms', 10000)! })
    process.stdout.write(`${formatJson(method.responseType.toJSON(result.response))}\n`)
    return 0
  } catch (err) {
    if (err instanceof RpcError) process.stderr.write(`error: ${err.codeName}: ${err.message}\n`)
    else process.stderr.write(`error: ${(err as Error).message}\n`)
    return 1
  } finally {
    client.close()
  }
}

function invalidRequest (problem: string): number {
  process.stderr.write(`nyala call: invalid request: ${problem.replace(/\s+/g, ' ')}\n`)
  return 2
}

/** JSON on one line with a space after each colon and comma: `{"result": 3}`. */
export function formatJson (value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(formatJson).join(', ')}]`
  if (value !== null && typeof value === 'object') {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${formatJson(v)}`).join(', ')}}`
  }
  return JSON.stringify(value) ?? 'null'
}
