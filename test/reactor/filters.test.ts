// Filters around handlers (server.use, per group), composed once so that a
// synchronous chain stays synchronous, and onCallEnd seeing every call's
// end: answered, refused before a call existed, refused from the queue,
// failed, and dropped with the connection.
import t from 'tap'
import { composeFilters, type CallOutcome, type EndedCall, type Filter } from '../../reactor/filters.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import { ProtocolServer } from '../../reactor/server.js'
import { linesProtocol } from '../helpers/toy-protocols.js'
import { servePeers } from '../helpers/socket-peer.js'

t.test('composeFilters: first outermost, sync stays sync, a filter may answer itself or change the request', async t => {
  const order: string[] = []
  const tag = (name: string): Filter => (req, ctx, next) => { order.push(`${name}>`); const out = next(req, ctx); order.push(`<${name}`); return out }
  const upper: Filter = (req: string, ctx, next) => next(req.toUpperCase(), ctx)
  const deny: Filter = (req: string, ctx, next) => req === 'no' ? 'denied' : next(req, ctx)
  const handler = composeFilters([tag('a'), tag('b'), deny, upper], (req: string) => `handled ${req}`)
  const result = handler('x', {} as CallContext)
  t.equal(result, 'handled X', 'synchronous: the value itself, no promise')
  t.same(order, ['a>', 'b>', '<b', '<a'])
  t.equal(handler('no', {} as CallContext), 'denied')
  t.equal(composeFilters([], handler), handler, 'no filters: the handler itself')
})

t.test('server.use and group filters wrap handlers, registered before or after the routes', async t => {
  const seen: string[] = []
  const server = new ProtocolServer(linesProtocol(), { logger: null })
  server.use((req: string, ctx, next) => { seen.push(`server ${ctx.method}`); return next(req, ctx) })
  server.addRoutes('lines', { echo: (a: string) => a, boom: () => { throw new Error('kaput') } }, {
    filters: [(req: string, ctx, next) => { seen.push(`group ${ctx.method}`); return next(`[${req}]`, ctx) }]
  })
  server.use((req: string, ctx, next) => req === 'secret' ? 'refused by filter' : next(req, ctx))
  const { port } = await server.listen(0, '127.0.0.1')
  t.teardown(() => server.close({ graceMs: 50 }))
  const { Peer } = await import('../helpers/socket-peer.js')
  const { connect } = await import('node:net')
  const peer = new Peer(connect(port, '127.0.0.1'))
  peer.socket.write('echo hi\necho secret\nboom\n')
  await peer.until(() => peer.text.split('\n').length === 4, 'three answers')
  const lines = peer.text.split('\n')
  t.equal(lines[0], '[hi]')
  t.equal(lines[1], 'refused by filter', 'a filter added after the routes applies too, between the first server filter and the group\'s')
  t.match(lines[2], /^-ERR failed kaput/)
  t.same(seen, ['server echo', 'group echo', 'server echo', 'server boom', 'group boom'])
  peer.socket.destroy()
  t.throws(() => server.use('nope' as unknown as Filter))
})

t.test('onCallEnd sees each call end once, with its outcome', async t => {
  const ends: Array<[string, CallOutcome['reason']]> = []
  let release: () => void = () => {}
  const { server, open } = await servePeers(t, linesProtocol(), 'lines', {
    echo: (a: string) => a,
    fail: () => { throw new Error('no') },
    wait: () => new Promise<string>(resolve => { release = () => resolve('waited') })
  }, { workers: 1, queueLength: 1, burstLimit: 0, logger: null })
  const off = server.onCallEnd((call: EndedCall, outcome: CallOutcome) => { ends.push([call.method, outcome.reason]) })
  server.onCallEnd(() => { throw new Error('an observer that throws changes nothing') })
  const peer = await open()
  // wait takes the one worker, echo 1 the one queue slot, echo 2 is busy.
  peer.socket.write('echo a\nnope\nfail\nwait\necho 1\necho 2\n')
  // In order, the busy refusal waits behind wait's answer: watch the observer instead.
  for (let i = 0; i < 400 && !ends.some(([, reason]) => reason === 'busy'); i++) await new Promise(resolve => setTimeout(resolve, 5))
  release()
  await peer.until(() => peer.text.split('\n').length === 7, 'six answers')
  t.same(ends, [['echo', 'ok'], ['nope', 'no-method'], ['fail', 'failed'], ['echo', 'busy'], ['wait', 'ok'], ['echo', 'ok']])
  t.equal(ends.length, 6, 'six requests, six ends')
  off()
  peer.socket.write('echo again\n')
  await peer.until(() => peer.text.includes('again'), 'the answer')
  t.equal(ends.length, 6, 'removed observer sees nothing')
})

t.test('onCallEnd reports closed for a call whose connection went first', async t => {
  const ends: CallOutcome['reason'][] = []
  let release: () => void = () => {}
  const { server, open } = await servePeers(t, linesProtocol(), 'lines', {
    wait: () => new Promise<string>(resolve => { release = () => resolve('late') })
  }, { logger: null })
  server.onCallEnd((_call, outcome) => { ends.push(outcome.reason) })
  const peer = await open()
  peer.socket.write('wait\n')
  for (let i = 0; i < 200 && server.stats().callsInFlight === 0; i++) await new Promise(resolve => setTimeout(resolve, 5))
  peer.socket.destroy()
  for (let i = 0; i < 200 && server.stats().connectionsOpen > 0; i++) await new Promise(resolve => setTimeout(resolve, 5))
  release()
  for (let i = 0; i < 200 && ends.length === 0; i++) await new Promise(resolve => setTimeout(resolve, 5))
  t.same(ends, ['closed'])
})
