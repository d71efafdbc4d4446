// Handshakes: the clean one and its mutants.
import { encodeRequestFrame } from '../../codec/krpc/encode-frame.js'
import { NEGOTIATE_CALL_ID } from '../../codec/krpc/frames.js'
import { ClientNegotiation } from '../../codec/krpc/client-negotiation.js'
import type { NegotiationStep } from '../../codec/krpc/negotiation-step.js'
import { PREAMBLE_BYTES, ServerNegotiation } from '../../codec/krpc/server-negotiation.js'
import { Pb, frameOf, join, layoutOf } from './frames.js'
import { type FoundBug, NegotiateType } from './options.js'
import { INTERESTING_BYTES, INTERESTING_INT32, RequestGen } from './request-mutator.js'
import { Weighted } from './rng.js'

/** What a client writes to set up a connection, frame by frame: preamble, NEGOTIATE, SASL_INITIATE, ConnectionContext. */
function handshakeFrames (user: string, password = ''): Buffer[] {
  const client = new ClientNegotiation({ user, password })
  const server = new ServerNegotiation()
  const [preamble, negotiate] = client.start()
  const out: Buffer[] = [join(preamble!), join(negotiate!)]
  let pending: Buffer[] = [join(negotiate!)]
  for (let guard = 0; guard < 4 && pending.length > 0; guard++) {
    const next: Buffer[] = []
    for (const frame of pending) {
      for (const reply of (server.onFrame(frame) as NegotiationStep).send ?? []) {
        for (const s of (client.onFrame(join(reply)) as NegotiationStep).send ?? []) {
          out.push(join(s))
          next.push(join(s))
        }
      }
    }
    pending = next
  }
  return out
}

const FUZZ_USER = 'fuzz'
const HTTP_STARTS = ['GET / HTTP/1.1\r\n\r\n', 'POST /rpc HTTP/1.0\r\n\r\n', 'OPTIONS * HTTP/1.1\r\n', 'PRI * HTTP/2.0\r\n\r\n']
const CLEAN_HANDSHAKE = handshakeFrames(FUZZ_USER)
/** The clean handshake of the fuzz user, as one buffer. */
export const CLEAN_HANDSHAKE_BYTES = Buffer.concat(CLEAN_HANDSHAKE)
/** The fuzzed server refuses these users (with an asynchronous authenticator). */
export const REFUSED_USERS = ['', 'intruder']
const REFUSED_HANDSHAKES = REFUSED_USERS.map(u => handshakeFrames(u, 'pw'))

type HandshakeOp = 'noiseBefore' | 'preambleBits' | 'preambleByte' | 'http' | 'tls' | 'frame' | 'noiseBetween' | 'omitContext' |
'omitSasl' | 'duplicateNegotiate' | 'swap' | 'refused' | 'structured' | 'truncate' | 'contextId' | 'noPreamble'

const HANDSHAKE_OPS = new Weighted<HandshakeOp>([
  [6, 'noiseBefore'], [8, 'preambleBits'], [5, 'preambleByte'], [2, 'http'], [2, 'tls'], [22, 'frame'], [8, 'noiseBetween'],
  [5, 'omitContext'], [4, 'omitSasl'], [3, 'duplicateNegotiate'], [3, 'swap'], [7, 'refused'], [12, 'structured'], [5, 'truncate'],
  [4, 'contextId'], [2, 'noPreamble']
])

/** A mutated handshake (preamble and negotiation frames). */
export function handshakeMutant (gen: RequestGen, foundBugs: ReadonlySet<FoundBug>): { bytes: Buffer, pipelinedRefusal: boolean } {
  let pipelinedRefusal = false
  const rng = gen.rng
  let parts: Buffer[] = CLEAN_HANDSHAKE.map(b => Buffer.from(b))
  const op = HANDSHAKE_OPS.pick(rng)
  switch (op) {
    case 'noiseBefore': parts.unshift(rng.bytes(rng.range(1, 12))); break
    case 'preambleBits': {
      const p = parts[0]!
      for (let k = rng.range(1, 3); k > 0; k--) p[rng.int(p.length)]! ^= 1 << rng.int(8)
      break
    }
    case 'preambleByte': parts[0]![rng.int(PREAMBLE_BYTES)] = rng.pick(INTERESTING_BYTES); break
    case 'http': parts = [Buffer.from(rng.pick(HTTP_STARTS)), ...parts.slice(1)]; break
    case 'tls': parts = [Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]), ...parts.slice(1)]; break
    case 'frame': {
      const i = rng.range(1, parts.length - 1)
      parts[i] = gen.mutateFrameBytes(parts[i]!)
      break
    }
    case 'noiseBetween': {
      const i = rng.range(1, parts.length)
      parts.splice(i, 0, rng.chance(0.5) ? rng.bytes(rng.range(1, 24)) : frameOf(rng.bytes(rng.int(12)), rng.bytes(rng.int(24))))
      break
    }
    case 'omitContext': parts.pop(); break
    case 'omitSasl': parts.splice(2, 1); break
    case 'duplicateNegotiate': parts.splice(2, 0, parts[1]!); break
    case 'swap': [parts[1], parts[2]] = [parts[2]!, parts[1]!]; break
    case 'refused': {
      parts = REFUSED_HANDSHAKES[rng.int(REFUSED_HANDSHAKES.length)]!.map(b => Buffer.from(b))
      // Known bug: calls pipelined after credentials the (asynchronous) authenticator refuses, with no ConnectionContext, run.
      if (foundBugs.has('refused-auth-pipelining') && rng.chance(0.5)) {
        parts.pop()
        pipelinedRefusal = true
      }
      break
    }
    case 'structured': {
      const i = rng.chance(0.5) ? 1 : 2
      parts[i] = join(encodeRequestFrame({ callId: rng.chance(0.9) ? NEGOTIATE_CALL_ID : rng.pick(INTERESTING_INT32) }, structuredNegotiate(gen, i === 1)))
      break
    }
    case 'truncate': {
      const all = Buffer.concat(parts)
      parts = [all.subarray(0, rng.int(all.length))]
      break
    }
    case 'contextId': {
      const ctx = parts[3]!
      const layout = layoutOf(ctx)!
      const header = new Pb().tag(3, 0).int32(rng.pick([0, 5, NEGOTIATE_CALL_ID, -4, 0x7fffffff])).buffer()
      parts[3] = frameOf(header, ctx.subarray(layout.bodyStart))
      break
    }
    case 'noPreamble': parts.shift(); break
  }
  return { bytes: Buffer.concat(parts), pipelinedRefusal }
}

/** A NegotiatePB body: the step the server waits for, or not, with odd fields. */
function structuredNegotiate (gen: RequestGen, first: boolean): Buffer {
  const rng = gen.rng
  const steps = [0, 1, 2, 3, 4, 5, 6, 7, 999]
  const message: Parameters<typeof NegotiateType.encode>[0] = { step: rng.chance(0.6) ? (first ? 1 : 2) : rng.pick(steps) }
  if (rng.chance(0.5)) message.supported_features = Array.from({ length: rng.int(4) }, () => rng.chance(0.5) ? rng.int(4) : rng.u32())
  if (rng.chance(0.5)) message.authn_types = rng.pick([[], [{ token: {} }], [{ certificate: {} }], [{ sasl: {} }, { jwt: {} }], [{ sasl: {} }]])
  if (rng.chance(0.6)) message.sasl_mechanisms = rng.pick([[], [{ mechanism: 'GSSAPI' }], [{ mechanism: 'PLAIN' }], [{ mechanism: '' }], [{ mechanism: 'plain' }]])
  if (rng.chance(0.6)) {
    message.token = rng.pick([
      Buffer.from('\u0000fuzz\u0000pw'), Buffer.from('no nul at all'), Buffer.from('a\u0000b'), Buffer.alloc(0),
      Buffer.concat([Buffer.from([0]), Buffer.from('u'.repeat(3000)), Buffer.from([0])]), Buffer.from('authz\u0000fuzz\u0000')
    ])
  }
  if (rng.chance(0.1)) {
    // No step at all (required): written by hand, as no encoder would.
    return new Pb().tag(1, 0).varint(1).buffer()
  }
  const body = Buffer.from(NegotiateType.encode(message))
  return rng.chance(0.1) ? Buffer.concat([body, gen.poolBytes(rng.int(8))]) : body
}
