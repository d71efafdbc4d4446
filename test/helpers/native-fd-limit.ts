/**
 * A native listener for the descriptor-exhaustion test, run in a child
 * process under a low `ulimit -n` on the backend named in argv[2]. Prints its
 * port; then on `exhausted` once accept() failed for want of descriptors
 * (EMFILE); on stdin `close` it closes one accepted connection and answers
 * `closed`; `count` answers the number accepted so far.
 */
import { createInterface } from 'node:readline'
import { NativeReactor, type NativeBackend } from '../../transport/native/reactor.js'
import type { NativeStream } from '../../transport/native/native-stream.js'

const reactor = NativeReactor.open(process.argv[2] as NativeBackend)
if (typeof reactor === 'string') throw new Error(reactor)
const accepted: NativeStream[] = []
let exhausted = false
const listener = await reactor.listen(0, '127.0.0.1', {}, {
  onStream: (stream) => { accepted.push(stream) },
  onAcceptError: () => {
    if (exhausted) return
    exhausted = true
    process.stdout.write('exhausted\n')
  }
})
process.stdout.write(`${listener.address.port}\n`)
const lines = createInterface({ input: process.stdin })
let closed = 0
lines.on('line', (line) => {
  if (line === 'close') {
    accepted[closed++]?.close()
    process.stdout.write('closed\n')
  } else process.stdout.write(`${accepted.length}\n`)
})
lines.on('close', () => {
  for (const stream of accepted) stream.close()
  listener.close()
})
