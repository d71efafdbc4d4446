/**
 * simpleProtocol end to end: a length-prefixed binary key-value protocol,
 * a line protocol and DNS over TCP (RFC 7766), each served by
 * ProtocolServer on loopback port 0, driven by raw sockets (frames built
 * by hand) and by ProtocolClient with simpleClientProtocol. No encoder
 * below writes a length prefix or a newline: the stock framings do.
 */
import t, { type Test } from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { lengthField, lines } from '../../codec/framings.js'
import { simpleClientProtocol, simpleProtocol } from '../../codec/simple-protocol.js'
import type { RefusalReason, ServerProtocol } from '../../codec/protocol.js'
import { ProtocolServer, type ServerOptions } from '../../reactor/server.js'
import { ProtocolClient } from '../../reactor/protocol-client.js'
import { Peer, servePeers } from '../helpers/socket-peer.js'

// The servers of these tests, and raw peers to them (test/helpers/socket-peer.ts), with the bound port.
async function serve (t: Test, protocol: ServerProtocol<any, any>, group: string, handlers: Record<string, (req: never) => unknown>, options: ServerOptions = {}): Promise<{ server: ProtocolServer, port: number, open: () => Promise<Peer> }> {
  const { server, open } = await servePeers(t, protocol, group, handlers, options)
  return { server, port: server.address()!.port, open }
}

/** Splits `buf` into the payloads of 4-byte big-endian length-prefixed frames (complete ones only). */
function prefixed (buf: Buffer, prefixBytes: 2 | 4 = 4): Buffer[] {
  const out: Buffer[] = []
  let at = 0
  while (at + prefixBytes <= buf.length) {
    const length = prefixBytes === 4 ? buf.readUInt32BE(at) : buf.readUInt16BE(at)
    if (at + prefixBytes + length > buf.length) break
    out.push(buf.subarray(at + prefixBytes, at + prefixBytes + length))
    at += prefixBytes + length
  }
  return out
}

// ---------------------------------------------------------------------------
// A binary key-value protocol: request [u32 length][u8 op][u32 id][u8 key length][key][value],
// answer [u32 length][u8 status][u32 id][body]: status 0 ok, 1 not found,
// 0x80 + a refusal's index in REASONS (body: its message).
const OPS: Record<number, string> = { 1: 'get', 2: 'set', 3: 'echo', 4: 'block' }
const REASONS: RefusalReason[] = ['busy', 'expired', 'shutdown', 'unavailable', 'no-service', 'no-method', 'invalid', 'failed', 'abandoned']
const NOT_FOUND = Symbol('not found')
interface KvRequest { key: string, value: Buffer }
type KvAnswer = Buffer | typeof NOT_FOUND

const answerHead = (status: number, id: number): Buffer => { const head = Buffer.alloc(5); head[0] = status; head.writeUInt32BE(id >>> 0, 1); return head }

const kv = simpleProtocol<KvRequest, KvAnswer>({
  name: 'kv-bin',
  framing: lengthField({ bytes: 4, max: 4096 }),
  ordering: 'id',
  service: 'kv',
  decode (payload) {
    if (payload.length < 6 || payload.length < 6 + payload[5]!) return new RpcError(ErrorCode.MALFORMED_FRAME, 'short head')
    if (payload[0] === 0xff) throw new Error('op 0xff is not a request')
    const keyEnd = 6 + payload[5]!
    return { route: OPS[payload[0]!] ?? `op-${payload[0]}`, id: payload.readUInt32BE(1), request: { key: payload.toString('latin1', 6, keyEnd), value: payload.subarray(keyEnd) } }
  },
  encode: (call, answer) => answer === NOT_FOUND ? answerHead(1, call.id!) : [answerHead(0, call.id!), answer],
  refusal: (call, reason, message) => [answerHead(0x80 + REASONS.indexOf(reason), call.id!), Buffer.from(message)]
})

const kvClient = simpleClientProtocol<{ op: number, key: string, value?: string }, string | null>({
  name: 'kv-bin',
  framing: lengthField({ bytes: 4, max: 4096 }),
  matching: 'id',
  encode: (request, id) => [Buffer.from([request.op]), answerHead(0, id).subarray(1), Buffer.from([request.key.length]), Buffer.from(request.key + (request.value ?? ''), 'latin1')],
  answerId: (payload) => payload.readUInt32BE(1),
  decode (_request, payload) {
    const status = payload[0]!
    if (status === 0) return payload.toString('latin1', 5)
    if (status === 1) return null
    const name = REASONS[status - 0x80] ?? `status-${status}`
    return new RpcError(ErrorCode.REMOTE, payload.toString('latin1', 5), { remote: { protocol: 'kv-bin', code: status, name, fatal: false } })
  },
  retryable: () => false
})

/** A kv request frame, prefix and all, built by hand. */
function kvFrame (op: number, id: number, key = '', value = ''): Buffer {
  const body = Buffer.concat([Buffer.from([op]), answerHead(0, id).subarray(1), Buffer.from([key.length]), Buffer.from(key + value, 'latin1')])
  const prefix = Buffer.alloc(4)
  prefix.writeUInt32BE(body.length)
  return Buffer.concat([prefix, body])
}

function kvHandlers (store = new Map<string, Buffer>(), blocked: Array<() => void> = []): Record<string, (req: never) => unknown> {
  return {
    get: (req: KvRequest) => store.get(req.key) ?? NOT_FOUND,
    set: (req: KvRequest) => { store.set(req.key, Buffer.from(req.value)); return Buffer.from('stored') },
    echo: (req: KvRequest) => req.value,
    block: (req: KvRequest) => new Promise<Buffer>(resolve => blocked.push(() => resolve(Buffer.from(req.key))))
  }
}

t.test('binary kv: answers by id, prefixed by the framing, however the requests are cut', async (t) => {
  const { open } = await serve(t, kv, 'kv', kvHandlers())
  const peer = await open()
  const stream = Buffer.concat([kvFrame(2, 1, 'k', 'v1'), kvFrame(1, 2, 'k'), kvFrame(1, 3, 'missing'), kvFrame(3, 4, '', 'echoed'), kvFrame(9, 5)])
  for (const byte of stream) peer.socket.write(Buffer.from([byte])) // one byte per write
  await peer.until(() => prefixed(peer.received).length === 5, 'five answers')
  const answers = new Map(prefixed(peer.received).map((a) => [a.readUInt32BE(1), a]))
  t.equal(answers.size, 5, 'one answer per id')
  t.same([...answers.keys()].sort(), [1, 2, 3, 4, 5])
  t.equal(answers.get(1)!.toString('latin1', 5), 'stored')
  t.equal(answers.get(2)!.toString('latin1', 5), 'v1', 'the value set before')
  t.equal(answers.get(3)![0], 1, 'not found')
  t.equal(answers.get(4)!.toString('latin1', 5), 'echoed')
  t.equal(answers.get(5)![0], 0x80 + REASONS.indexOf('no-method'), 'an unknown op: no-method, in the protocol\'s status')
  t.match(answers.get(5)!.toString('latin1', 5), /invalid method name: op-9/)
  // The prefix is the payload's length, exactly.
  t.equal(peer.received.length, [...answers.values()].reduce((n, a) => n + 4 + a.length, 0), 'nothing but prefixed frames')
  t.notOk(peer.closed)
})

t.test('binary kv: a full queue is refused busy in the protocol\'s words, with the prefix added', async (t) => {
  const blocked: Array<() => void> = []
  const { server, open } = await serve(t, kv, 'kv', kvHandlers(new Map(), blocked), { workers: 1, queueLength: 1 })
  const peer = await open()
  peer.socket.write(Buffer.concat([1, 2, 3, 4].map((id) => kvFrame(4, id, `b${id}`))))
  await peer.until(() => prefixed(peer.received).length === 2 && blocked.length === 1, 'two refusals, one running')
  while (blocked.length > 0) blocked.shift()!()
  await peer.until(() => prefixed(peer.received).length === 4 || blocked.length > 0, 'the queued one')
  while (blocked.length > 0) blocked.shift()!()
  await peer.until(() => prefixed(peer.received).length === 4, 'four answers')
  const answers = prefixed(peer.received)
  const ok = answers.filter((a) => a[0] === 0)
  const busy = answers.filter((a) => a[0] === 0x80 + REASONS.indexOf('busy'))
  t.equal(ok.length, 2, 'two ran: one at once, one from the queue')
  t.equal(busy.length, 2, 'two were refused busy')
  t.same(new Set(answers.map((a) => a.readUInt32BE(1))), new Set([1, 2, 3, 4]), 'every id answered once')
  t.ok(ok.every((a) => a.toString('latin1', 5) === `b${a.readUInt32BE(1)}`), 'each answer is its own request\'s')
  t.equal(server.stats().callsFailed, 2)
})

t.test('binary kv: an oversized frame, a returned error and a thrown decode close the connection after the answers before them', async (t) => {
  const { server, open } = await serve(t, kv, 'kv', kvHandlers())
  const cases: Array<[string, Buffer]> = [
    ['a frame over the framing\'s max', Buffer.from([0, 0, 0x10, 0x01])], // announces 4097 bytes
    ['decode returned an RpcError', Buffer.from([0, 0, 0, 5, 3, 0, 0, 0, 9])], // a 5-byte payload: no key length
    ['decode threw', kvFrame(0xff, 7)]
  ]
  for (const [what, bad] of cases) {
    const peer = await open()
    peer.socket.write(kvFrame(3, 1, '', 'before'))
    await peer.until(() => prefixed(peer.received).length === 1, `${what}: the first answer`)
    peer.socket.write(Buffer.concat([bad, kvFrame(3, 2, '', 'after')]))
    await peer.until(() => peer.closed, `${what}: the close`)
    const answers = prefixed(peer.received)
    t.same(answers.map((a) => a.toString('latin1', 5)), ['before'], `${what}: the answer before it went out, nothing after it was read`)
  }
  t.ok(server.stats().badFrames >= 2, 'the bad frames decode refused are counted')
})

t.test('binary kv through ProtocolClient and simpleClientProtocol: every call settles once', async (t) => {
  const { port } = await serve(t, kv, 'kv', kvHandlers())
  const client = new ProtocolClient(kvClient, { endpoint: `127.0.0.1:${port}`, connectionsPerEndpoint: 2 })
  t.teardown(() => client.close())
  const calls: Array<Promise<string | null>> = []
  for (let i = 0; i < 100; i++) {
    calls.push(i % 3 === 0 ? client.call({ op: 2, key: `k${i}`, value: `v${i}` }) : i % 3 === 1 ? client.call({ op: 3, key: '', value: `e${i}` }) : client.call({ op: 1, key: 'never-set' }))
  }
  calls.push(client.call({ op: 9, key: '' }))
  const outcomes = await Promise.allSettled(calls)
  const counts = { stored: 0, echoed: 0, missing: 0, remote: 0, other: 0 }
  outcomes.forEach((o, i) => {
    if (o.status === 'rejected') {
      const err = o.reason as RpcError
      if (err.code === ErrorCode.REMOTE && err.remote?.name === 'no-method') counts.remote++
      else counts.other++
    } else if (o.value === 'stored') counts.stored++
    else if (o.value === `e${i}`) counts.echoed++
    else if (o.value === null) counts.missing++
    else counts.other++
  })
  t.same(counts, { stored: 34, echoed: 33, missing: 33, remote: 1, other: 0 }, '101 calls, 101 outcomes as expected')
  t.equal(await client.call({ op: 1, key: 'k3' }), 'v3', 'a value set through the client')
})

// ---------------------------------------------------------------------------
// A line protocol: `COMMAND argument`, answered in order, `-ERR reason: message` for refusals.
const lineProtocol = simpleProtocol<string, string>({
  name: 'lines',
  framing: lines({ max: 64 }),
  service: 'text',
  decode (line) {
    if (line.length === 0) return null // a blank line is not a request
    if (line[0] === 0) throw new Error('a line may not start with NUL')
    const text = line.toString('utf8')
    const space = text.indexOf(' ')
    return { route: (space < 0 ? text : text.slice(0, space)).toUpperCase(), request: space < 0 ? '' : text.slice(space + 1) }
  },
  encode: (_call, answer) => Buffer.from(answer),
  refusal: (_call, reason, message) => Buffer.from(`-ERR ${reason}: ${message}`)
})

const lineHandlers = {
  ECHO: (arg: string) => arg,
  UPPER: (arg: string) => arg.toUpperCase(),
  SLOW: async (arg: string) => { await new Promise(resolve => setTimeout(resolve, 10)); return arg }
}

t.test('lines: answers in request order with the newline added, blank lines skipped, refusals in its words', async (t) => {
  const { open } = await serve(t, lineProtocol, 'text', lineHandlers)
  const peer = await open()
  peer.socket.write('SLOW first\r\nECHO second\n\nupper third\nNOPE\n')
  await peer.until(() => peer.received.toString().split('\n').length === 5, 'four answers')
  t.equal(peer.received.toString(), 'first\nsecond\nTHIRD\n-ERR no-method: call on service text received with an invalid method name: NOPE\n')
})

t.test('lines: a line over max and a thrown decode close the connection after the answers before them', async (t) => {
  const { server, open } = await serve(t, lineProtocol, 'text', lineHandlers)
  for (const [what, bad] of [['a line over max', 'ECHO ' + 'x'.repeat(80) + '\n'], ['a thrown decode', '\0oops\n']] as const) {
    const peer = await open()
    peer.socket.write('ECHO before\n')
    await peer.until(() => peer.received.length > 0, `${what}: the first answer`)
    peer.socket.write(`${bad}ECHO after\n`)
    await peer.until(() => peer.closed, `${what}: the close`)
    t.equal(peer.received.toString(), 'before\n', `${what}: the answer before it, then the close`)
  }
  t.ok(server.stats().badFrames >= 1, 'the thrown decode is counted as a bad frame')
})

t.test('lines through ProtocolClient: in-order matching, remote errors keep the connection', async (t) => {
  const { port } = await serve(t, lineProtocol, 'text', lineHandlers)
  const client = new ProtocolClient(simpleClientProtocol<string, string>({
    name: 'lines',
    framing: lines({ max: 256 }), // the refusals are longer than the server's 64-byte requests
    matching: 'in-order',
    encode: (request) => Buffer.from(request),
    decode: (_request, payload) => {
      const text = payload.toString()
      return text.startsWith('-ERR ') ? new RpcError(ErrorCode.REMOTE, text, { remote: { protocol: 'lines', code: 0, name: text.slice(5, text.indexOf(':')), fatal: false } }) : text
    },
    retryable: () => false
  }), { endpoint: `127.0.0.1:${port}` })
  t.teardown(() => client.close())
  const outcomes = await Promise.allSettled(Array.from({ length: 60 }, (_, i) => client.call(i % 20 === 19 ? 'NOPE' : i % 2 === 0 ? `SLOW s${i}` : `UPPER u${i}`)))
  let ok = 0
  let refused = 0
  outcomes.forEach((o, i) => {
    if (o.status === 'fulfilled') { if (o.value === (i % 2 === 0 ? `s${i}` : `U${i}`)) ok++ } else if ((o.reason as RpcError).remote?.name === 'no-method') refused++
  })
  t.equal(ok, 57, 'every answer matched to its own request')
  t.equal(refused, 3, 'the three NOPEs refused no-method')
})

// ---------------------------------------------------------------------------
// DNS over TCP (RFC 7766 section 8): each message behind a 2-byte length.
// Queries for any name get one A record, 127.0.0.1; other opcodes NOTIMP.
const QR = 0x80
const RCODE_SERVFAIL = 2
const RCODE_NOTIMP = 4

/** The header and question of `query`, made into a response's with `rcode` and `answers` answer records. */
function responseHead (query: Buffer, rcode: number, answers: number): Buffer {
  const questionEnd = endOfQuestion(query)
  const head = Buffer.from(query.subarray(0, questionEnd))
  head[2] = (head[2]! | QR) & ~0x06 // QR set, TC and AA clear, opcode and RD kept
  head[3] = 0x80 | rcode // RA, and the rcode
  head.writeUInt16BE(answers, 6)
  head.writeUInt32BE(0, 8) // NSCOUNT, ARCOUNT
  return head
}

function endOfQuestion (message: Buffer): number {
  let at = 12
  if (message.readUInt16BE(4) === 0) return at
  while (at < message.length && message[at] !== 0) at += 1 + message[at]!
  return Math.min(message.length, at + 1 + 4)
}

const dns = simpleProtocol<Buffer, Buffer>({
  name: 'dns',
  framing: lengthField({ bytes: 2 }),
  ordering: 'id',
  service: 'dns',
  decode (message) {
    if (message.length < 12) return new RpcError(ErrorCode.MALFORMED_FRAME, 'a DNS message has a 12-byte header')
    const opcode = (message[2]! >> 3) & 0x0f
    return { route: opcode === 0 ? 'QUERY' : `OPCODE${opcode}`, id: message.readUInt16BE(0), request: message }
  },
  encode: (_call, answer) => answer,
  refusal: (call, reason) => call.request === undefined ? null : responseHead(call.request, reason === 'no-method' ? RCODE_NOTIMP : RCODE_SERVFAIL, 0)
})

const dnsHandlers = {
  QUERY: (query: Buffer) => {
    const record = Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1]) // name at 12, A, IN, TTL 60, 127.0.0.1
    return Buffer.concat([responseHead(query, 0, 1), record])
  }
}

/** A DNS query message for `name` (type A, class IN, recursion desired), built by hand. */
function dnsQuery (id: number, name: string, opcode = 0): Buffer {
  const labels = name.split('.').map((label) => Buffer.concat([Buffer.from([label.length]), Buffer.from(label, 'ascii')]))
  const header = Buffer.alloc(12)
  header.writeUInt16BE(id, 0)
  header[2] = (opcode << 3) | 0x01 // RD
  header.writeUInt16BE(1, 4) // QDCOUNT
  return Buffer.concat([header, ...labels, Buffer.from([0, 0, 1, 0, 1])])
}

function tcpFrame (message: Buffer): Buffer {
  const prefix = Buffer.alloc(2)
  prefix.writeUInt16BE(message.length)
  return Buffer.concat([prefix, message])
}

t.test('DNS over TCP: pipelined queries answered by message id, each behind its 2-byte length', async (t) => {
  const { open } = await serve(t, dns, 'dns', dnsHandlers)
  const peer = await open()
  const queries = [dnsQuery(0x1234, 'example.com'), dnsQuery(0xabcd, 'nyala.test'), dnsQuery(0x0042, 'example.com', 2)]
  const stream = Buffer.concat(queries.map(tcpFrame))
  peer.socket.write(stream.subarray(0, 7)) // a cut inside the first message
  peer.socket.write(stream.subarray(7))
  await peer.until(() => prefixed(peer.received, 2).length === 3, 'three responses')
  const responses = new Map(prefixed(peer.received, 2).map((m) => [m.readUInt16BE(0), m]))
  t.same([...responses.keys()].sort((a, b) => a - b), [0x0042, 0x1234, 0xabcd], 'one response per message id')
  for (const id of [0x1234, 0xabcd]) {
    const response = responses.get(id)!
    t.ok((response[2]! & QR) !== 0, `${id}: a response`)
    t.equal(response[3]! & 0x0f, 0, `${id}: NOERROR`)
    t.equal(response.readUInt16BE(6), 1, `${id}: one answer`)
    t.same([...response.subarray(response.length - 4)], [127, 0, 0, 1], `${id}: 127.0.0.1`)
  }
  const status = responses.get(0x0042)!
  t.equal(status[3]! & 0x0f, RCODE_NOTIMP, 'opcode STATUS: the server\'s no-method refusal says NOTIMP')
  t.equal(status.readUInt16BE(4), 1, 'the refusal carries the question back')
  t.equal(peer.received.readUInt16BE(0), prefixed(peer.received, 2)[0]!.length, 'the prefix is the message\'s length')
})

t.test('DNS over TCP through ProtocolClient: 16-bit message ids as the matching ids', async (t) => {
  const { port } = await serve(t, dns, 'dns', dnsHandlers)
  const client = new ProtocolClient(simpleClientProtocol<string, string>({
    name: 'dns',
    framing: lengthField({ bytes: 2 }),
    matching: 'id',
    maxId: 0xffff,
    encode: (name, id) => dnsQuery(id, name),
    answerId: (message) => message.readUInt16BE(0),
    decode: (_name, message) => (message[3]! & 0x0f) !== 0 ? new RpcError(ErrorCode.REMOTE, 'rcode', { remote: { protocol: 'dns', code: message[3]! & 0x0f, name: 'RCODE', fatal: false } }) : [...message.subarray(message.length - 4)].join('.')
  }), { endpoint: `127.0.0.1:${port}` })
  t.teardown(() => client.close())
  const outcomes = await Promise.allSettled(Array.from({ length: 40 }, (_, i) => client.call(`host${i}.example`)))
  t.equal(outcomes.filter((o) => o.status === 'fulfilled' && o.value === '127.0.0.1').length, 40, '40 answers, all 127.0.0.1')
})
