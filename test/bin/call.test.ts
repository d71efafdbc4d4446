/**
 * `nyala call` against real servers in this process (the demo service, a
 * service of a .proto written to a temporary directory, a node:http
 * server): a request that is not valid for its type is a usage error (exit
 * 2, one line naming the field, nothing printed, nothing sent), with the
 * words the client itself uses; a valid call prints the response; a port
 * that is not speaking KRPC is named as such. The calls run in one child
 * process, one after another (a child per call costs seconds).
 */
import t from 'tap'
import { createServer, type Server as HttpServer } from 'node:http'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ProtoSchema, type Message } from '../../codec/protobuf/schema.js'
import { Server } from '../../reactor/krpc/server.js'
import { CalculatorService, calculatorDef, calculatorHandlers, closeServer, newClient, rejection } from '../helpers/reactor-harness.js'
import { cliCases, type Outcome } from '../helpers/cli-cases.js'

t.setTimeout(120_000)

const ADD = 'nyala.demo.CalculatorService.Add'
const ADD_REQUEST = 'nyala.demo.AddRequestPB'

// A service with bytes, int64, nested and repeated fields.
const BLOBS_PROTO = `syntax = "proto2";
package p;
message Inner { required uint32 count = 1; }
message BlobPB { optional bytes blob = 1; optional int64 n = 2; optional Inner inner = 3; repeated Inner items = 4; }
message BlobReplyPB { optional bytes blob = 1; optional Inner inner = 2; }
service Blobs { rpc Echo(BlobPB) returns (BlobReplyPB); }
`

t.test('nyala call: invalid requests are usage errors naming the field, with the client\'s own words; valid calls and a non-KRPC port', async (t) => {
  // The demo service, counting the calls that reach it.
  let handled = 0
  const demo = new Server().addService(CalculatorService, { ...calculatorHandlers, Add: (req, ctx) => { handled++; return calculatorHandlers.Add(req, ctx) } })
  const { port } = await demo.listen(0, '127.0.0.1')
  t.teardown(() => closeServer(demo))
  const endpoint = `127.0.0.1:${port}`

  // A service of a .proto in a temporary directory.
  const dir = mkdtempSync(join(tmpdir(), 'nyala-call-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const protoFile = join(dir, 'blobs.proto')
  writeFileSync(protoFile, BLOBS_PROTO)
  const blobsDef = ProtoSchema.load(protoFile).service('p.Blobs')
  let blobsHandled = 0
  const blobs = new Server().addService(blobsDef, {
    Echo: (req: unknown) => { blobsHandled++; return { blob: (req as Message).blob, inner: (req as Message).inner } }
  })
  const blobsPort = (await blobs.listen(0, '127.0.0.1')).port
  t.teardown(() => closeServer(blobs))
  const blobsEndpoint = `127.0.0.1:${blobsPort}`

  // An HTTP server: it answers the KRPC connection header with "HTTP/1.1 400 Bad Request".
  const http: HttpServer = createServer((_req, res) => res.end('hello'))
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>((resolve) => { http.closeAllConnections(); http.close(() => resolve()) }))
  const httpPort = (http.address() as { port: number }).port

  // [JSON argument (undefined: none), the problem named]
  const invalid: Array<[string | undefined, string]> = [
    ['{"x":1}', 'y: required field missing'],
    ['{"x":"one","y":2}', 'x: expected an integer (uint32), got the string "one"'],
    ['[1,2]', `expected an object (${ADD_REQUEST}), got an array`],
    ['null', `expected an object (${ADD_REQUEST}), got null`],
    ['3', `expected an object (${ADD_REQUEST}), got 3`],
    ['{"x":1,"y":2,"z":3}', `z: no such field in ${ADD_REQUEST}`],
    [undefined, 'x: required field missing'],
    ['{}', 'x: required field missing'],
    ['{"x":-1,"y":2}', 'x: -1 is out of range for uint32 (0 to 4294967295)'],
    ['{"x":4294967296,"y":2}', 'x: 4294967296 is out of range for uint32 (0 to 4294967295)'],
    ['{"x":1.5,"y":2}', 'x: 1.5 is not an integer (uint32)'],
    ['{"x":true,"y":2}', 'x: expected an integer (uint32), got true']
  ]
  const invalidBlobs: Array<[string, string]> = [
    ['{"blob":"!!"}', 'blob: not valid base64: the string "!!"'],
    ['{"blob":"A"}', 'blob: not valid base64: the string "A"'],
    ['{"blob":5}', 'blob: expected bytes (a Uint8Array or a base64 string), got 5'],
    ['{"n":"12x"}', 'n: expected an integer (int64), got the string "12x"'],
    ['{"n":1e300}', 'n: 1e+300 is not a safe integer: give int64 values beyond 2^53 as a decimal string or a bigint'],
    ['{"inner":{"count":"x"}}', 'inner.count: expected an integer (uint32), got the string "x"'],
    ['{"inner":{}}', 'inner.count: required field missing'],
    ['{"items":[{"count":1},{"cnt":2}]}', 'items[1].cnt: no such field in p.Inner']
  ]
  const cases: string[][] = [
    ...invalid.map(([json]) => json === undefined ? ['call', endpoint, ADD] : ['call', endpoint, ADD, json]),
    ...invalidBlobs.map(([json]) => ['call', blobsEndpoint, 'p.Blobs.Echo', json, '--proto', protoFile]),
    ['call', endpoint, ADD, '{x:1}'],
    ['call', endpoint, ADD, '{"x":1,"y":2}'],
    ['call', blobsEndpoint, 'p.Blobs.Echo', '{"blob":"AAE=","inner":{"count":2}}', '--proto', protoFile],
    ['call', `127.0.0.1:${httpPort}`, ADD, '{"x":1,"y":2}']
  ]
  const outcomes = await cliCases(t, cases)
  const [badJson, valid, validBlob, notKrpc] = outcomes.slice(invalid.length + invalidBlobs.length)

  // The client refuses the same requests with the same words.
  const client = newClient(t, { endpoint })
  const library = async (def: typeof calculatorDef, target: string, method: string, json: string | undefined): Promise<string> =>
    (await rejection(client.call(target, def, method, JSON.parse(json ?? '{}') as Message))).message

  let usageErrors = 0
  const check = async (outcome: Outcome, problem: string, typeName: string, libraryMessage: string): Promise<void> => {
    t.same(outcome, { code: 2, stdout: '', stderr: `nyala call: invalid request: ${problem}\n` }, problem)
    t.equal(libraryMessage, `invalid ${typeName}: ${problem}`, `the client says the same: ${problem}`)
    if (outcome.code === 2) usageErrors++
  }
  for (const [i, [json, problem]] of invalid.entries()) {
    await check(outcomes[i]!, problem, ADD_REQUEST, await library(calculatorDef, endpoint, 'Add', json))
  }
  for (const [i, [json, problem]] of invalidBlobs.entries()) {
    await check(outcomes[invalid.length + i]!, problem, 'p.BlobPB', await library(blobsDef, blobsEndpoint, 'Echo', json))
  }
  t.equal(usageErrors, invalid.length + invalidBlobs.length)
  t.equal(badJson!.code, 2)
  t.match(badJson!.stderr, /^nyala call: invalid request: not valid JSON: [^\n]*\n$/)
  t.equal(badJson!.stdout, '')

  t.same(valid, { code: 0, stdout: '{"result": 3}\n', stderr: '' })
  t.same(validBlob, { code: 0, stdout: '{"blob": "AAE=", "inner": {"count": 2}}\n', stderr: '' })
  t.equal(handled, 1, 'only the valid Add reached the server')
  t.equal(blobsHandled, 1, 'only the valid Echo reached the server')
  t.equal(demo.stats().callsReceived, 1)

  t.equal(notKrpc!.code, 1)
  t.equal(notKrpc!.stdout, '')
  const lines = notKrpc!.stderr.trimEnd().split('\n')
  t.match(lines[lines.length - 1], new RegExp(`^error: RPC_ERR_NEGOTIATION_FAILED: 127\\.0\\.0\\.1:${httpPort} is not speaking KRPC \\(its first bytes were "HTTP/1\\.1 400 Bad Request\\.\\.\\."\\)$`))
  t.notMatch(notKrpc!.stderr, /^\s+at /m, 'no stack')
})

t.test('the library reports a port that is not speaking KRPC the same way', async (t) => {
  const http: HttpServer = createServer((_req, res) => res.end('hello'))
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>((resolve) => { http.closeAllConnections(); http.close(() => resolve()) }))
  const endpoint = `127.0.0.1:${(http.address() as { port: number }).port}`
  const client = newClient(t, { endpoint })
  const error = await rejection(client.service(CalculatorService).Add({ x: 1, y: 2 }, { timeoutMs: 5000 }))
  t.equal(error.code, 'RPC_ERR_NEGOTIATION_FAILED')
  t.equal(error.message, `${endpoint} is not speaking KRPC (its first bytes were "HTTP/1.1 400 Bad Request...")`)
  t.equal((error.cause as { code?: string } | undefined)?.code, 'RPC_ERR_FRAME_TOO_LARGE', 'the frame decoder\'s own error is the cause')
})

t.test('nyala call: enums by name in nested messages of scalars and enums (a field, a repeated field, a map value)', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-call-enum-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const protoFile = join(dir, 'kinds.proto')
  writeFileSync(protoFile, `syntax = "proto2";
package k;
enum Kind { RED = 0; GREEN = 1; }
message Leaf { optional Kind kind = 1; optional uint32 n = 2; }
message Outer { optional Leaf inner = 1; repeated Leaf items = 2; map<string, Leaf> byName = 3; }
service Kinds { rpc Echo(Outer) returns (Outer); }
`)
  const def = ProtoSchema.load(protoFile).service('k.Kinds')
  const server = new Server().addService(def, { Echo: (req: unknown) => req })
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => closeServer(server))
  const endpoint = `127.0.0.1:${port}`
  const [field, repeated, map] = await cliCases(t, [
    ['call', endpoint, 'k.Kinds.Echo', '{"inner":{"kind":"GREEN"}}', '--proto', protoFile],
    ['call', endpoint, 'k.Kinds.Echo', '{"items":[{"kind":"GREEN","n":2},{"kind":"RED"}]}', '--proto', protoFile],
    ['call', endpoint, 'k.Kinds.Echo', '{"byName":{"a":{"kind":"GREEN"}}}', '--proto', protoFile]
  ])
  // (The server echoes decoded messages, whose unset fields hold their defaults.)
  t.same(field, { code: 0, stdout: '{"inner": {"kind": "GREEN", "n": 0}}\n', stderr: '' })
  t.same(repeated, { code: 0, stdout: '{"items": [{"kind": "GREEN", "n": 2}, {"kind": "RED", "n": 0}]}\n', stderr: '' })
  t.same(map, { code: 0, stdout: '{"byName": {"a": {"kind": "GREEN", "n": 0}}}\n', stderr: '' })
})
