/**
 * BusyPoller on a fake clock: activity keeps the loop polling (a pending
 * setImmediate) for the window after the last touch, then it stops by
 * itself; stop() ends it at once. And a server and client with busy
 * polling on both ends answer every call and leave nothing spinning.
 */
import t from 'tap'
import { BusyPoller } from '../../transport/busy-poll.js'
import { CalculatorService, newClient, startServer } from '../helpers/reactor-harness.js'

const immediate = async (): Promise<void> => { await new Promise<void>(resolve => { setImmediate(resolve) }) }

t.test('polls for the window after the last touch, then stops', async t => {
  let now = 0
  const poller = new BusyPoller(100, () => now) // 0.1 ms
  t.equal(poller.spinning, false)
  poller.touch()
  t.equal(poller.spinning, true)
  await immediate()
  await immediate()
  t.ok(poller.spins >= 1, 'spins while inside the window')
  t.equal(poller.spinning, true)

  now = 0.09
  poller.touch() // activity at 0.09: the window now ends at 0.19
  await immediate()
  now = 0.15
  await immediate()
  await immediate()
  t.equal(poller.spinning, true, 'a touch extended the window')
  now = 0.2
  await immediate()
  await immediate()
  t.equal(poller.spinning, false, 'stopped once the window passed without activity')
  const spins = poller.spins
  await immediate()
  t.equal(poller.spins, spins, 'nothing pending')

  poller.touch()
  t.equal(poller.spinning, true, 'a later touch starts again')
  poller.stop()
  await immediate()
  await immediate()
  t.equal(poller.spinning, false, 'stop ends it')
  poller.touch()
  t.equal(poller.spinning, false, 'and it stays stopped')
})

t.test('the window must be a positive number of microseconds', async t => {
  t.throws(() => new BusyPoller(0), RangeError)
  t.throws(() => new BusyPoller(-5), RangeError)
  t.throws(() => new BusyPoller(Number.NaN), RangeError)
})

t.test('server and client with busy polling answer every call', async t => {
  const { endpoint } = await startServer(t, { busyPollUs: 200 })
  const client = newClient(t, { endpoint, busyPollUs: 200 })
  const calc = client.service(CalculatorService)
  for (let i = 0; i < 20; i++) t.equal((await calc.Add({ x: i, y: 1 })).result, i + 1)
  const results = await Promise.all(Array.from({ length: 200 }, (_, i) => calc.Add({ x: i, y: i })))
  t.same(results.map(r => r.result), Array.from({ length: 200 }, (_, i) => 2 * i), '200 pipelined calls, 200 answers')
})
