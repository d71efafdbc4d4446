/**
 * A native listener out of descriptors (EMFILE) accepts again once a
 * connection closes: in a child process under `ulimit -n 64`, clients
 * connect past the limit, the server closes one of its connections, and one
 * more is accepted from the backlog. On io_uring the descriptor is closed
 * only after the turn's submit, so accepting must resume after that (an
 * accept submitted before it fails with EMFILE again, and the listener
 * stays stopped). Skipped, with the reason, where a backend cannot start.
 */
import t from 'tap'
import { spawn } from 'node:child_process'
import { connect, type Socket } from 'node:net'
import { createInterface } from 'node:readline'
import { nativeBackends } from '../helpers/native.js'

for (const { backend, skip } of nativeBackends()) {
  t.test(`${backend}: out of descriptors, a listener accepts again once one connection closes`, { skip: process.platform !== 'linux' ? 'linux only' : skip }, async (t) => {
    const root = new URL('../..', import.meta.url).pathname
    const loader = process.execArgv.map(a => `'${a}'`).join(' ')
    const child = spawn('bash', ['-c', `ulimit -n 64 && exec "${process.execPath}" ${loader} test/helpers/native-fd-limit.ts ${backend}`], { cwd: root, stdio: ['pipe', 'pipe', 'inherit'] })
    const sockets: Socket[] = []
    t.teardown(() => {
      for (const s of sockets) s.destroy()
      child.kill('SIGKILL')
    })
    const lines = createInterface({ input: child.stdout })
    const queued: string[] = []
    let waiter: ((line: string) => void) | null = null
    lines.on('line', (line) => {
      if (waiter !== null) {
        const w = waiter
        waiter = null
        w(line)
      } else queued.push(line)
    })
    const next = async (): Promise<string> => queued.length > 0 ? queued.shift()! : await new Promise<string>((resolve) => { waiter = resolve })
    const ask = async (command: string): Promise<string> => {
      child.stdin.write(`${command}\n`)
      return await next()
    }
    const port = Number(await next())
    // More clients than descriptors: the kernel completes their connects into the listener's backlog.
    for (let i = 0; i < 100; i++) {
      const s = connect({ host: '127.0.0.1', port })
      s.on('error', () => {})
      sockets.push(s)
    }
    t.equal(await next(), 'exhausted', 'accept() ran out of descriptors')
    let before = -1
    for (let i = 0; i < 100; i++) {
      const count = Number(await ask('count'))
      if (count === before) break
      before = count
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
    t.ok(before > 0 && before < 64, `accepted ${before} before the limit`)
    t.equal(await ask('close'), 'closed')
    let after = before
    for (let i = 0; i < 200 && after === before; i++) {
      after = Number(await ask('count'))
      if (after === before) await new Promise((resolve) => setTimeout(resolve, 10))
    }
    t.equal(after, before + 1, 'one more accepted from the backlog in the freed descriptor')
    child.stdin.end()
    await new Promise((resolve) => child.once('exit', resolve))
  })
}
