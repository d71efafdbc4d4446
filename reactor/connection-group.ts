import { ErrorCode, RpcError } from '../codec/errors.js'
import { encodeOneToSlices } from '../codec/frame-sink.js'
import type { ConnectionHandle, ServerProtocol } from '../codec/protocol.js'
import { ServerConnectionHandle } from './connection-handle.js'

/**
 * A set of connections that receive the same pushes: a channel's
 * subscribers, a room, every connection of a tenant. `send` encodes a
 * message once per protocol and queues the same bytes on every member, so
 * fan-out to N connections costs one encoding, not N. A member leaves by
 * itself when its connection closes. Each member's push limits still apply
 * to it alone: a member that does not read is closed without holding up
 * the others.
 */
export class ConnectionGroup implements Iterable<ConnectionHandle> {
  readonly #members = new Set<ServerConnectionHandle>()

  /** Adds `connection` (a handle the server gave: `ctx.connection`); a closed one is not added. Returns the group. */
  add (connection: ConnectionHandle): this {
    const member = asServerHandle(connection)
    if (member.isClosed || this.#members.has(member)) return this
    this.#members.add(member)
    member.groups.add(this)
    return this
  }

  /** Removes `connection`; false when it was not a member. */
  delete (connection: ConnectionHandle): boolean {
    if (!(connection instanceof ServerConnectionHandle) || !this.#members.delete(connection)) return false
    connection.groups.delete(this)
    return true
  }

  /** True when `connection` is a member (it leaves by itself once it closes). */
  has (connection: ConnectionHandle): boolean {
    return connection instanceof ServerConnectionHandle && this.#members.has(connection)
  }

  /** How many connections are members. */
  get size (): number {
    return this.#members.size
  }

  /** Removes every member. */
  clear (): void {
    for (const member of this.#members) member.groups.delete(this)
    this.#members.clear()
  }

  /** The members, in the order they joined. */
  [Symbol.iterator] (): Iterator<ConnectionHandle> {
    return this.#members.values()
  }

  /**
   * Pushes `message` to every member (or those `filter` accepts), encoded
   * once per protocol with its `encodePush`. Returns how many members it
   * was queued to: members closed meanwhile, or closed by this send for
   * going over their push limits, do not count.
   */
  send (message: unknown, filter?: (member: ConnectionHandle) => boolean): number {
    let protocol: ServerProtocol | null = null
    let slices: Uint8Array[] = []
    let bytes = 0
    let sent = 0
    // A member closed by this send leaves the set while it is walked: walk a copy when that can happen.
    for (const member of this.#members.size > 1 ? [...this.#members] : this.#members) {
      if (filter !== undefined && !filter(member)) continue
      if (member.protocol !== protocol) {
        protocol = member.protocol
        const encode = protocol.encodePush
        if (encode === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `the ${protocol.name} protocol has no encodePush: it cannot push`)
        slices = encodeOneToSlices(encode, protocol, message)
        bytes = 0
        for (const slice of slices) bytes += slice.length
      }
      if (member.sendEncoded(slices, bytes)) sent++
    }
    return sent
  }
}

function asServerHandle (connection: ConnectionHandle): ServerConnectionHandle {
  if (connection instanceof ServerConnectionHandle) return connection
  throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'a ConnectionGroup takes the connections a server hands out (ctx.connection)')
}
