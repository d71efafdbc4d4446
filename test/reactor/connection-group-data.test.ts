// ConnectionGroup's member data (add(handle, data), get, entries, a send
// filter that sees the data) and ConnectionGroup.sendOnce: a connection
// in several matching groups receives a message once.
import t from 'tap'
import type { ServerProtocol } from '../../codec/protocol.js'
import { ConnectionGroup } from '../../reactor/connection-group.js'
import type { CallContext } from '../../reactor/inbound-call.js'
import { linesProtocol } from '../helpers/toy-protocols.js'
import { servePeers } from '../helpers/socket-peer.js'

function pushLines (): ServerProtocol<string, string | undefined> {
  return { ...linesProtocol(), encodePush: (message, out) => { out.append(Buffer.from(`>${String(message)}\n`)) } }
}

t.test('members keep their data; send filters on it; sendOnce reaches each connection once', async t => {
  const topics = new Map<string, ConnectionGroup<unknown, { qos: number }>>()
  let encodes = 0
  const protocol = pushLines()
  const encodePush = protocol.encodePush!
  protocol.encodePush = (message, out) => { encodes++; encodePush(message, out) }
  const { open } = await servePeers(t, protocol, 'lines', {
    // `sub topic qos`
    sub: (arg: string, ctx: CallContext) => {
      const [topic = '', qos = '0'] = arg.split(' ')
      let group = topics.get(topic)
      if (group === undefined) topics.set(topic, group = new ConnectionGroup())
      group.add(ctx.connection, { qos: Number(qos) })
      return `sub ${topic} ${group.get(ctx.connection)!.qos}`
    }
  })
  const a = await open()
  const b = await open()
  a.socket.write('sub x 1\nsub y 0\n')
  b.socket.write('sub x 0\n')
  await a.until(() => a.text === 'sub x 1\nsub y 0\n', 'a subscribed')
  await b.until(() => b.text === 'sub x 0\n', 'b subscribed')
  const x = topics.get('x')!
  t.same([...x.entries()].map(([, data]) => data.qos), [1, 0])
  // Re-adding updates the data.
  const [first] = x
  x.add(first!, { qos: 2 })
  t.equal(x.get(first!)!.qos, 2)
  t.equal(x.size, 2)

  t.equal(x.send('only qos>0', (_member, data) => data.qos > 0), 1)
  // a is in x and y: one copy; b in x only: one copy.
  encodes = 0
  t.equal(ConnectionGroup.sendOnce([x, topics.get('y')!], 'both'), 2)
  t.equal(encodes, 1, 'encoded once')
  t.equal(x.send('twice?') + topics.get('y')!.send('twice?'), 3, 'two sends reach a twice')
  await a.until(() => a.text.endsWith('>twice?\n>twice?\n'), 'a pushes')
  await b.until(() => b.text.endsWith('>twice?\n'), 'b pushes')
  t.equal(a.text, 'sub x 1\nsub y 0\n>only qos>0\n>both\n>twice?\n>twice?\n')
  t.equal(b.text, 'sub x 0\n>both\n>twice?\n')
  b.socket.destroy()
  await b.until(() => x.size === 1, 'b left x when it closed')
  t.equal(x.get(first!)!.qos, 2)
})
