// The set-up phase as a PostgreSQL-like protocol needs it: untyped
// start-up packets read with a framing of the set-up's own
// (`Handshake.framing`), switched to typed messages by a step
// (`HandshakeStep.framing`) for a password exchange, the protocol's own
// framing once done; `pipelined` tells a step what the peer sent behind
// its frame (data after an SSLRequest is refused); `close: true` ends a
// connection without a failure logged (a CancelRequest); `refusal` sees
// the connection's state.
import t, { type Test } from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Framing } from '../../codec/frame-decoder.js'
import type { HandshakeStep, ServerProtocol } from '../../codec/protocol.js'
import { ProtocolServer } from '../../reactor/server.js'
import { Peer } from '../helpers/socket-peer.js'

const SSL_REQUEST = 80877103
const CANCEL_REQUEST = 80877102
const PROTOCOL_3 = 196608

/** Untyped start-up packet: [u32 length, itself included][u32 code][payload]. */
const untyped: Framing = { prefixBytes: 4, frameBytes: (buf, offset) => buf.readUInt32BE(offset) }
/** Typed message: [u8 type][u32 length, itself included][payload]. */
const typed: Framing = { prefixBytes: 5, frameBytes: (buf, offset) => 1 + buf.readUInt32BE(offset + 1) }

function packet (code: number, payload = ''): Buffer {
  const body = Buffer.from(payload)
  const out = Buffer.alloc(8 + body.length)
  out.writeUInt32BE(8 + body.length, 0)
  out.writeUInt32BE(code, 4)
  body.copy(out, 8)
  return out
}

function message (type: string, payload = ''): Buffer {
  const body = Buffer.from(payload)
  const out = Buffer.alloc(5 + body.length)
  out.write(type, 0, 'latin1')
  out.writeUInt32BE(4 + body.length, 1)
  body.copy(out, 5)
  return out
}

interface PgState { tx: 'I' | 'T' }

/** What each step saw, for the assertions. */
interface Seen { pipelined: number[], steps: string[] }

/** `slow`: the start-up step answers through a promise (an authenticator that looks the user up), so the bytes behind it wait and are read with the framing it switched to. */
function pgLike (seen: Seen, slow = false): ServerProtocol<string, string, PgState> {
  return {
    name: 'pg-like',
    ordering: 'in-order',
    framing: typed,
    connectionState: () => ({ tx: 'I' }),
    handshake: () => ({
      framing: untyped,
      onFrame: (frame, pipelined): HandshakeStep<{ user?: string }> | Promise<HandshakeStep<{ user?: string }>> => {
        seen.pipelined.push(pipelined)
        if (frame.length >= 5 && frame[0] === 0x70) { // 'p': a typed password message
          seen.steps.push(`password ${frame.toString('latin1', 5)}`)
          return frame.toString('latin1', 5) === 'secret' ? { send: [[message('R', 'ok')]], done: { user: 'alice' } } : { error: new RpcError(ErrorCode.NEGOTIATION_FAILED, 'bad password') }
        }
        const code = frame.readUInt32BE(4)
        if (code === SSL_REQUEST) {
          seen.steps.push('ssl')
          // Bytes sent behind an SSLRequest before its answer are refused.
          if (pipelined > 0) return { send: [[message('E', 'data after SSLRequest')]], close: true }
          return { send: [[Buffer.from('N')]] }
        }
        if (code === CANCEL_REQUEST) {
          seen.steps.push('cancel')
          return { close: true }
        }
        if (code === PROTOCOL_3) {
          const wantsPassword = frame.toString('latin1', 8) === 'password'
          seen.steps.push(wantsPassword ? 'startup, password' : 'startup')
          const step: HandshakeStep<{ user?: string }> = wantsPassword ? { send: [[message('R', 'password?')]], framing: typed } : { send: [[message('R', 'ok')]], done: {} }
          return slow ? new Promise(resolve => setTimeout(() => resolve(step), 10)) : step
        }
        return { error: new RpcError(ErrorCode.MALFORMED_FRAME, 'unknown start-up code') }
      }
    }),
    decodeHead (buf, start, _end, head) {
      head.service = 'pg'
      head.method = String.fromCharCode(buf[start]!)
      head.data = buf.toString('latin1', start + 5, _end)
      return null
    },
    decodeRequest: (_route, _buf, head) => head.data as string,
    encode (_call, answer, out) { out.append(message('D', answer)) },
    refusal: (_call, reason, _message, _detail, state) => [message('E', `${reason} in ${state?.tx ?? '?'}`)]
  }
}

async function serve (t: Test, seen: Seen, slow = false): Promise<{ port: number, warnings: string[], open: () => Promise<Peer> }> {
  const warnings: string[] = []
  const logger = { warn: (m: string) => { warnings.push(m) }, info: () => {}, error: (m: string) => { warnings.push(m) }, debug: () => {} }
  const server = new ProtocolServer(pgLike(seen, slow), { logger })
  server.addRoutes('pg', {
    Q: (query: string, ctx) => { if (query === 'BEGIN') ctx.connectionState.tx = 'T'; return `${ctx.user || 'trust'}: ${query}` }
  })
  const { port } = await server.listen(0)
  const peers: Peer[] = []
  t.teardown(async () => {
    for (const peer of peers) peer.socket.destroy()
    await server.close({ graceMs: 0 })
  })
  return {
    port,
    warnings,
    open: async () => {
      const socket = connect(port, '127.0.0.1')
      const peer = new Peer(socket)
      peers.push(peer)
      await once(socket, 'connect')
      return peer
    }
  }
}

t.test('untyped start-up packets, then typed messages: trust in one write, and a password step that switches the framing', async (t) => {
  const seen: Seen = { pipelined: [], steps: [] }
  const { open } = await serve(t, seen)
  const trust = await open()
  // SSLRequest answered first (a real client waits for it), then the start-up packet and a query together.
  trust.socket.write(packet(SSL_REQUEST))
  await trust.until(() => trust.text === 'N', 'N')
  trust.socket.write(Buffer.concat([packet(PROTOCOL_3), message('Q', 'SELECT 1')]))
  await trust.until(() => trust.text.includes('trust: SELECT 1'), 'the query answered')
  t.same(seen.steps, ['ssl', 'startup'])
  t.same(seen.pipelined, [0, 13], 'the start-up packet saw the query behind it')

  seen.steps.length = 0
  seen.pipelined.length = 0
  const password = await open()
  // All in one write: the password message is typed, the start-up packet is not.
  password.socket.write(Buffer.concat([packet(PROTOCOL_3, 'password'), message('p', 'secret'), message('Q', 'BEGIN'), message('X')]))
  await password.until(() => password.text.includes('alice: BEGIN') && password.text.includes('no-method in T'), 'answered')
  t.same(seen.steps, ['startup, password', 'password secret'])
  t.match(password.text, /no-method in T/, 'the refusal saw the transaction state')
})

t.test('data pipelined behind an SSLRequest is refused; a CancelRequest closes without a failure logged', async (t) => {
  const seen: Seen = { pipelined: [], steps: [] }
  const { open, warnings } = await serve(t, seen)
  const injector = await open()
  injector.socket.write(Buffer.concat([packet(SSL_REQUEST), packet(PROTOCOL_3)]))
  await injector.until(() => injector.closed, 'closed')
  t.match(injector.text, /data after SSLRequest/)
  t.same(seen.pipelined, [8])

  const cancel = await open()
  cancel.socket.write(packet(CANCEL_REQUEST, 'pid+key!'))
  await cancel.until(() => cancel.closed, 'closed by the cancel')
  t.equal(cancel.text, '')
  const bad = await open()
  bad.socket.write(packet(PROTOCOL_3, 'password'))
  await bad.until(() => bad.text.length > 0, 'asked for a password')
  bad.socket.write(message('p', 'wrong'))
  await bad.until(() => bad.closed, 'refused')
  t.same(seen.steps, ['ssl', 'cancel', 'startup, password', 'password wrong'])
  t.equal(warnings.length, 1, `only the bad password is a failure: ${warnings.join(' | ')}`)
  t.match(warnings[0], /bad password/)
})

t.test('an asynchronous step that switches the framing: the bytes held behind it are read with the new one', async (t) => {
  const seen: Seen = { pipelined: [], steps: [] }
  const { open } = await serve(t, seen, true)
  const peer = await open()
  peer.socket.write(Buffer.concat([packet(PROTOCOL_3, 'password'), message('p', 'secret'), message('Q', 'SELECT 2')]))
  await peer.until(() => peer.text.includes('alice: SELECT 2'), 'answered')
  t.same(seen.steps, ['startup, password', 'password secret'])
  t.same(seen.pipelined, [24, 13], 'each frame saw the bytes behind it, held ones included')
})
