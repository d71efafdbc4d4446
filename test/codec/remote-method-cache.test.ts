/**
 * The request header decoder shares one frozen remote_method object per
 * distinct RemoteMethodPB bytes: names of equal length never mix, more
 * distinct methods than cache entries still decode right, and long names
 * decode without being cached.
 */
import t from 'tap'
import { encodeRemoteMethod, encodeRequestFrame } from '../../codec/krpc/encode-frame.js'
import { RequestParts, parseRequestFrame, parseRequestInto } from '../../codec/krpc/parsed-frame.js'

function decode (service: string, method: string): { service_name: string, method_name: string } {
  const frame = Buffer.concat(encodeRequestFrame({ callId: 7, remoteMethod: encodeRemoteMethod(service, method), timeoutMs: 100 }, new Uint8Array(0)))
  const parsed = parseRequestFrame(frame)
  if (parsed instanceof Error) throw parsed
  return parsed.header.remote_method!
}

t.test('equal-length names stay apart, and repeats share one frozen object', async t => {
  const a1 = decode('svc.A', 'Get')
  const b1 = decode('svc.B', 'Get')
  const a2 = decode('svc.A', 'Get')
  const c1 = decode('svc.A', 'Put')
  t.same(a1, { service_name: 'svc.A', method_name: 'Get' })
  t.same(b1, { service_name: 'svc.B', method_name: 'Get' })
  t.same(c1, { service_name: 'svc.A', method_name: 'Put' })
  t.equal(a2, a1, 'the same object for the same bytes')
  t.ok(Object.isFrozen(a1))
})

t.test('more distinct methods than cache entries, interleaved, all decode right', async t => {
  const names = Array.from({ length: 20 }, (_, i) => [`pkg.S${i % 5}`, `M${i}`] as const)
  for (let round = 0; round < 3; round++) {
    for (const [service, method] of names) t.same(decode(service, method), { service_name: service, method_name: method })
  }
})

t.test('long and non-ASCII names decode', async t => {
  const long = 'x'.repeat(400)
  t.same(decode(long, 'M'), { service_name: long, method_name: 'M' })
  t.same(decode(long, 'M'), { service_name: long, method_name: 'M' })
  t.same(decode('pkg.Ünïcode', 'Méthode'), { service_name: 'pkg.Ünïcode', method_name: 'Méthode' })
})

t.test('remoteMethodCached says whether the object is the cache\'s (a route key by identity)', async t => {
  const parts = new RequestParts()
  const parse = (service: string, method: string): void => {
    const frame = Buffer.concat(encodeRequestFrame({ callId: 7, remoteMethod: encodeRemoteMethod(service, method), timeoutMs: 100 }, new Uint8Array(0)))
    t.equal(parseRequestInto(frame, 0, frame.length, parts), null)
  }
  parse('svc.Key', 'Get')
  const first = parts.remoteMethod
  t.equal(parts.remoteMethodCached, true, 'a short name is cached (general path)')
  parse('svc.Key', 'Get')
  t.equal(parts.remoteMethodCached, true, 'and again (fast path)')
  t.equal(parts.remoteMethod, first, 'the same object')
  const long = 'y'.repeat(300)
  parse(long, 'M')
  t.equal(parts.remoteMethodCached, false, 'a name too long to keep is not')
  const once = parts.remoteMethod
  parse(long, 'M')
  t.equal(parts.remoteMethodCached, false)
  t.not(parts.remoteMethod, once, 'a new object each time: no route key')
  parse('svc.Key', 'Get')
  t.equal(parts.remoteMethodCached, true, 'a cached name after a long one')
})
