// ProtocolClient.compose: interceptors around call (undici's
// dispatcher.compose shape), the first outermost, against a raw lines
// server. The order of every step is asserted; no duration is.
import t from 'tap'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { ClientInterceptor, ProtocolCallOptions } from '../../reactor/protocol-client.js'
import type { ToyRequest } from '../helpers/toy-client-protocols.js'
import { lineServer, outcomes, pushLinesProtocol, toyClient } from '../helpers/push-stream-protocols.js'

type Interceptor = ClientInterceptor<ToyRequest, string>

const echo = (line: string): string => `${line.slice(line.indexOf(' ') + 1)}\n`

// Records what it saw on the way in and the way out.
function logging (log: string[], name: string): Interceptor {
  return (next) => async (request, options) => {
    log.push(`${name}> ${request.route} ${request.payload ?? ''}`)
    try {
      const answer = await next(request, options)
      log.push(`${name}< ${answer}`)
      return answer
    } catch (err) {
      log.push(`${name}! ${(err as RpcError).code}`)
      throw err
    }
  }
}

// Upper-cases the payload.
function shouting (log: string[]): Interceptor {
  return (next) => (request, options) => {
    log.push('shout')
    return next({ ...request, payload: (request.payload ?? '').toUpperCase() }, options)
  }
}

t.test('the first interceptor is outermost: it sees the request before the rewrite, and the answer last', async (t) => {
  const { port } = await lineServer(t, echo)
  const c = toyClient(t, pushLinesProtocol(), port)
  const log: string[] = []
  const composed = c.compose(logging(log, 'log'), shouting(log))
  t.equal(await composed.call({ route: 'echo', payload: 'hi' }), 'HI')
  t.same(log, ['log> echo hi', 'shout', 'log< HI'])

  log.length = 0
  const reversed = c.compose(shouting(log), logging(log, 'log'))
  t.equal(await reversed.call({ route: 'echo', payload: 'hi' }), 'HI')
  t.same(log, ['shout', 'log> echo HI', 'log< HI'], 'the other way round, the log sees the rewritten request')
})

t.test('composed once: N calls through the chain give N settlements, in order per call', async (t) => {
  const { port } = await lineServer(t, echo)
  const c = toyClient(t, pushLinesProtocol(), port)
  let built = 0
  const counting: Interceptor = (next) => {
    built++
    return (request, options) => next(request, options)
  }
  const log: string[] = []
  const composed = c.compose(counting, logging(log, 'a'), logging(log, 'b'))
  const calls = Array.from({ length: 50 }, (_, i) => composed.call({ route: 'echo', payload: `m${i}` }))
  t.same(await outcomes(calls), { ok: 50 })
  t.equal(built, 1, 'each interceptor was applied once, at compose()')
  t.equal(log.length, 200)
  for (let i = 0; i < 50; i++) {
    // For each call, a before b on the way in, b before a on the way out.
    t.ok(log.indexOf(`a> echo m${i}`) < log.indexOf(`b> echo m${i}`) && log.indexOf(`b< m${i}`) < log.indexOf(`a< m${i}`), `call ${i}`)
  }
})

t.test('options pass through, an interceptor may answer itself, and its throw rejects the call', async (t) => {
  const { port } = await lineServer(t, echo)
  const c = toyClient(t, pushLinesProtocol(), port)
  const seenOptions: ProtocolCallOptions[] = []
  const cached = new Map([['cached', 'from the cache']])
  const cache: Interceptor = (next) => (request, options) => {
    seenOptions.push(options)
    const hit = cached.get(request.payload ?? '')
    return hit === undefined ? next(request, options) : Promise.resolve(hit)
  }
  const broken: Interceptor = (next) => (request, options) => {
    if (request.payload === 'boom') throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'no booms')
    return next(request, options)
  }
  const composed = c.compose(cache, broken)
  t.equal(await composed.call({ route: 'echo', payload: 'cached' }), 'from the cache')
  t.equal(c.stats().connections.length, 0, 'answered without the client')
  t.equal(await composed.call({ route: 'echo', payload: 'real' }, { timeoutMs: 5000 }), 'real')
  const thrown = composed.call({ route: 'echo', payload: 'boom' })
  t.ok(thrown instanceof Promise, 'a synchronous throw becomes a rejection')
  t.equal((await thrown.catch((e: unknown) => e as RpcError) as RpcError).code, ErrorCode.INVALID_ARGUMENT)
  t.same(seenOptions, [{}, { timeoutMs: 5000 }, {}], 'options default to {}')
})

t.test('stats() and close() are the client\'s; compose checks its interceptors', async (t) => {
  const { port } = await lineServer(t, echo)
  const c = toyClient(t, pushLinesProtocol(), port)
  const composed = c.compose()
  t.equal(await composed.call({ route: 'echo', payload: 'plain' }), 'plain', 'no interceptor: the call itself')
  t.equal(composed.stats().connections.length, 1)
  const pushes = composed.pushes()
  await composed.close()
  t.same(await pushes.next(), { value: undefined, done: true })
  t.equal((await c.call({ route: 'echo' }).catch((e: unknown) => e as RpcError) as RpcError).code, ErrorCode.CLIENT_CLOSED)
  t.throws(() => c.compose('nope' as unknown as Interceptor), { code: ErrorCode.INVALID_ARGUMENT })
  t.throws(() => c.compose((() => 42) as unknown as Interceptor), { code: ErrorCode.INVALID_ARGUMENT })
})
