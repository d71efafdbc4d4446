/**
 * Raw PostgreSQL protocol v3 bytes for tests: packets to send, and what a
 * server sent back read into messages (fields of errors by their codes,
 * the ones naming PostgreSQL's source files left out).
 */
import { connect, type Socket } from 'node:net'

export function packet (code: number, body: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(8)
  head.writeInt32BE(8 + body.length, 0)
  head.writeInt32BE(code, 4)
  return Buffer.concat([head, body])
}

export function startup (user = 'test', database = 'test', version = 196608): Buffer {
  const pairs = user === '' ? `database\0${database}\0\0` : `user\0${user}\0database\0${database}\0\0`
  return packet(version, Buffer.from(pairs))
}

export const SSL_REQUEST = packet(80877103)

export function message (type: string, body: Buffer | string = Buffer.alloc(0)): Buffer {
  const payload = typeof body === 'string' ? Buffer.from(body) : body
  const head = Buffer.alloc(5)
  head[0] = type.charCodeAt(0)
  head.writeInt32BE(4 + payload.length, 1)
  return Buffer.concat([head, payload])
}

export const query = (sql: string): Buffer => message('Q', `${sql}\0`)
export const sync = (): Buffer => message('S')

/** A connection that gathers every byte the server sends. */
export class RawConnection {
  readonly socket: Socket
  received = Buffer.alloc(0)
  closed: Promise<void>

  constructor (port: number) {
    this.socket = connect(port, '127.0.0.1')
    this.socket.on('data', (chunk) => { this.received = Buffer.concat([this.received, chunk]) })
    this.socket.on('error', () => {})
    this.closed = new Promise(resolve => this.socket.once('close', () => resolve()))
  }

  async ready (): Promise<void> {
    if (!this.socket.connecting) return
    await new Promise(resolve => this.socket.once('connect', resolve))
  }

  write (...chunks: Buffer[]): void {
    this.socket.write(Buffer.concat(chunks))
  }

  /** Waits until the bytes received satisfy `done`, or the connection closes, or `ms` pass. */
  async until (done: (messages: string[]) => boolean, ms = 3000): Promise<string[]> {
    const deadline = Date.now() + ms
    while (Date.now() < deadline) {
      const messages = readMessages(this.received)
      if (done(messages) || this.socket.destroyed || this.socket.readableEnded) return messages
      await new Promise(resolve => setTimeout(resolve, 10))
    }
    return readMessages(this.received)
  }

  end (): void {
    this.socket.destroy()
  }
}

/** The messages in `bytes`, each as a line: its type and its fields (ParameterStatus and BackendKeyData reduced to their type: they differ by server). */
export function readMessages (bytes: Buffer): string[] {
  const out: string[] = []
  let at = 0
  // A lone answer to SSLRequest.
  if (bytes.length >= 1 && (bytes[0] === 0x4e || bytes[0] === 0x53) && (bytes.length === 1 || bytes[1] === 0x45)) {
    out.push(`ssl ${String.fromCharCode(bytes[0]!)}`)
    at = 1
  }
  while (at < bytes.length) {
    const type = String.fromCharCode(bytes[at]!)
    if (at + 5 > bytes.length) { out.push(`partial ${bytes.subarray(at).toString('hex')}`); break }
    const length = bytes.readInt32BE(at + 1)
    if (type === 'E' && (length < 4 || length > 100_000)) {
      // Protocol 2's error: text up to a NUL.
      const end = bytes.indexOf(0, at + 1)
      out.push(`E(v2) ${bytes.toString('utf8', at + 1, end < 0 ? bytes.length : end)}`)
      at = end < 0 ? bytes.length : end + 1
      continue
    }
    const body = bytes.subarray(at + 5, at + 1 + length)
    at += 1 + length
    if (type === 'E' || type === 'N') {
      const fields: string[] = []
      let i = 0
      while (i < body.length && body[i] !== 0) {
        const code = String.fromCharCode(body[i]!)
        const end = body.indexOf(0, i + 1)
        if (!'FLR'.includes(code)) fields.push(`${code}=${body.toString('utf8', i + 1, end)}`)
        i = end + 1
      }
      out.push(`${type} ${fields.join(' ')}`)
    } else if (type === 'S' || type === 'K') {
      if (out[out.length - 1] !== type) out.push(type)
    } else if (type === 'R') {
      out.push(`R ${body.readInt32BE(0)}`)
    } else if (type === 'T') {
      const names: string[] = []
      let i = 2
      for (let n = body.readInt16BE(0); n > 0; n--) {
        const end = body.indexOf(0, i)
        names.push(`${body.toString('utf8', i, end)}:${body.readInt32BE(end + 7)}:${body.readInt16BE(end + 17)}`)
        i = end + 19
      }
      out.push(`T ${names.join(',')}`)
    } else if (type === 'D') {
      const values: string[] = []
      let i = 2
      for (let n = body.readInt16BE(0); n > 0; n--) {
        const len = body.readInt32BE(i)
        values.push(len < 0 ? 'NULL' : body.subarray(i + 4, i + 4 + len).toString('hex'))
        i += 4 + Math.max(len, 0)
      }
      out.push(`D ${values.join(',')}`)
    } else if (type === 'C' || type === 'Z') {
      out.push(`${type} ${body.toString('utf8').replace(/\0$/, '')}`)
    } else if (type === 't') {
      const oids: number[] = []
      for (let n = body.readInt16BE(0), i = 2; n > 0; n--, i += 4) oids.push(body.readInt32BE(i))
      out.push(`t ${oids.join(',')}`)
    } else {
      out.push(`${type}${body.length > 0 ? ' ' + body.toString('hex') : ''}`)
    }
  }
  return out
}
