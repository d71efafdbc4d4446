// docs/custom-protocols.md's examples are whole servers: this test runs
// those very blocks (their `nyala` import pointed at the sources) in a
// process of their own and talks to them over loopback. (The README's
// examples: test/docs/readme.test.ts.)
import t from 'tap'
import { connect } from 'node:net'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startListening } from '../helpers/listening-child.js'

const doc = readFileSync(new URL('../../docs/custom-protocols.md', import.meta.url), 'utf8')
const block = /```ts\n([\s\S]*?)```/.exec(doc)![1]!
const entry = fileURLToPath(new URL('../../reactor/index.ts', import.meta.url))

t.test('the example is short, imports only the package entry point, and works as the doc says', async (t) => {
  t.ok(block.split('\n').length <= 45, `the example is ${block.split('\n').length} lines`)
  t.same([...block.matchAll(/from '([^']+)'/g)].map(m => m[1]), ['nyala'], 'it imports only nyala')
  const dir = mkdtempSync(join(tmpdir(), 'nyala-doc-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'kv.mts')
  writeFileSync(file, block.replace("from 'nyala'", `from ${JSON.stringify(entry)}`))
  const { child, port } = await startListening(t, file, [], { ...process.env, PORT: '0' })
  const socket = connect(port, '127.0.0.1')
  await once(socket, 'connect')
  let answers = ''
  socket.on('data', (d: Buffer) => { answers += d.toString() })
  socket.write('SET greeting hello world\nGET greeting\nDEL greeting\n')
  for (let i = 0; i < 400 && answers.split('\n').length < 4; i++) await new Promise(resolve => setTimeout(resolve, 5))
  socket.destroy()
  t.equal(answers, 'OK\nhello world\n-ERR no-method: call on service kv received with an invalid method name: DEL\n', 'the answers the doc shows')
  const shown = /\$ printf[^\n]*\n([\s\S]*?)```/.exec(doc)![1]!
  t.equal(shown, answers, 'the doc shows exactly these answers')
  child.kill('SIGTERM')
  await once(child, 'exit')
})

t.test('the hand-written line protocol of "The API in brief" runs too', async (t) => {
  const at = doc.indexOf('## The API in brief: a line protocol by hand')
  t.ok(at >= 0, 'the doc has the section')
  const code = /```ts\n([\s\S]*?)```/.exec(doc.slice(at))![1]!
  t.match(code, /await server\.listen\(7000\)/, 'it listens on a fixed port, which the test replaces')
  const dir = mkdtempSync(join(tmpdir(), 'nyala-doc-lines-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'echo-lines.mts')
  writeFileSync(file, code.replace("from 'nyala'", `from ${JSON.stringify(entry)}`)
    .replace('await server.listen(7000)', 'const { port } = await server.listen(0)\nconsole.log(`listening on 127.0.0.1:${port}`)'))
  const { child, port } = await startListening(t, file)
  const socket = connect(port, '127.0.0.1')
  await once(socket, 'connect')
  let answers = ''
  socket.on('data', (d: Buffer) => { answers += d.toString() })
  socket.write('hello\nworld\n')
  for (let i = 0; i < 400 && answers.split('\n').length < 3; i++) await new Promise(resolve => setTimeout(resolve, 5))
  socket.destroy()
  t.equal(answers, 'HELLO\nWORLD\n')
  child.kill('SIGTERM')
  await once(child, 'exit')
})

t.test('the simpleProtocol example runs and answers as the doc says', async (t) => {
  const section = doc.slice(doc.indexOf('## The short way: simpleProtocol'))
  const code = /```ts\n([\s\S]*?)```/.exec(section)![1]!
  t.ok(code.split('\n').length <= 30, `the example is ${code.split('\n').length} lines`)
  t.same([...code.matchAll(/from '([^']+)'/g)].map(m => m[1]), ['nyala'], 'it imports only nyala')
  const dir = mkdtempSync(join(tmpdir(), 'nyala-doc-simple-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'kv-bin.mts')
  writeFileSync(file, code.replace("from 'nyala'", `from ${JSON.stringify(entry)}`))
  const { child, port } = await startListening(t, file, [], { ...process.env, PORT: '0' })
  const socket = connect(port, '127.0.0.1')
  await once(socket, 'connect')
  let received = Buffer.alloc(0)
  socket.on('data', (d: Buffer) => { received = Buffer.concat([received, d]) })
  const frame = (body: Buffer): Buffer => Buffer.concat([Buffer.from([0, 0, 0, body.length]), body])
  socket.write(Buffer.concat([frame(Buffer.from('\x01greeting\0hello')), frame(Buffer.from('\x00greeting')), frame(Buffer.from([7]))]))
  const answers = (): string[] => {
    const out: string[] = []
    for (let at = 0; at + 4 <= received.length && at + 4 + received.readUInt32BE(at) <= received.length; at += 4 + received.readUInt32BE(at)) {
      out.push(`${received[at + 4]} ${received.toString('utf8', at + 5, at + 4 + received.readUInt32BE(at))}`)
    }
    return out
  }
  for (let i = 0; i < 400 && answers().length < 3; i++) await new Promise(resolve => setTimeout(resolve, 5))
  socket.destroy()
  t.same(answers(), ['0 OK', '0 hello', '1 no-method: call on service kv received with an invalid method name: op-7'], 'the answers the doc describes')
  child.kill('SIGTERM')
  await once(child, 'exit')
})
