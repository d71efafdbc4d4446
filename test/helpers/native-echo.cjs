// Loads a built native addon (argv[2]) in this node and runs a small echo
// server on each of its backends (epoll, io_uring) on loopback port 0, with
// a node:net client sending 1,000 lines through it. Prints one JSON line:
// { node, napi, backends: { epoll: 'ok' | reason, io_uring: ... }, trimHeap }.
// Plain CommonJS with no imports of ours: the package-install test runs it
// against the tarball's prebuilt, and it runs unchanged on Node 20, 24, 26.
'use strict'
const net = require('node:net')
const addon = require(process.argv[2])
const EV_READ = 1
const EV_ACCEPT = 2
const EV_EOF = 3

async function echo (backend) {
  let reactor = null
  const handle = addon.open(backend, (n, slabs) => {
    const ev = reactor.events
    for (let i = 0; i < 4 * n; i += 4) {
      const id = ev[i]
      const kind = ev[i + 1]
      if ((kind & 0xff) === EV_READ) reactor.send(id, slabs[kind >> 8].subarray(ev[i + 2], ev[i + 3]))
      else if (kind === EV_ACCEPT) reactor.setReading(id, true)
      else if (kind === EV_EOF) reactor.close(id, false)
    }
  })
  if (typeof handle === 'number') return `cannot open: errno ${-handle}`
  reactor = handle
  const bound = reactor.listen('127.0.0.1', 0, 128, false)
  if (typeof bound === 'number') return `cannot listen: errno ${-bound}`
  const [listener, port] = bound
  try {
    const lines = Array.from({ length: 1000 }, (_, i) => `line ${i}\n`).join('')
    const got = await new Promise((resolve, reject) => {
      const socket = net.connect(port, '127.0.0.1')
      let text = ''
      const timer = setTimeout(() => { socket.destroy(); reject(new Error(`timed out with ${text.length} of ${lines.length} bytes`)) }, 10000)
      socket.on('data', (d) => {
        text += d.toString('latin1')
        if (text.length >= lines.length) { clearTimeout(timer); socket.end(); resolve(text) }
      })
      socket.on('error', (err) => { clearTimeout(timer); reject(err) })
      socket.write(lines)
    })
    return got === lines ? 'ok' : 'wrong bytes'
  } catch (err) {
    return err.message
  } finally {
    reactor.closeListener(listener)
  }
}

async function main () {
  const backends = {}
  for (const backend of ['epoll', 'io_uring']) backends[backend] = await echo(backend)
  const trimHeap = typeof addon.trimHeap === 'function' ? typeof addon.trimHeap() : 'absent'
  console.log(JSON.stringify({ node: process.version, napi: process.versions.napi, backends, trimHeap }))
  process.exit(0)
}
main().catch((err) => { console.error(err); process.exit(1) })
