import { ErrorCode, RpcError } from '../codec/errors.js'
import type { ConnectionHandle, ServerProtocol } from '../codec/protocol.js'
import { encodeShared, sharedRange } from '../transport/shared-frame.js'
import { ServerConnectionHandle } from './connection-handle.js'

/**
 * A set of connections that receive the same pushes: a channel's
 * subscribers, a room, every connection of a tenant. `send` encodes a
 * message once per protocol and queues the same bytes on every member, so
 * fan-out to N connections costs one encoding, not N. A member leaves by
 * itself when its connection closes. Each member's push limits still apply
 * to it alone: a member that does not read is closed without holding up
 * the others.
 *
 * `State` is the members' connection state (`handle.state`'s type), and
 * `Member` what the group keeps per member (`add(handle, data)`: an MQTT
 * subscription's QoS), read back with `get`, `entries` and `send`'s filter.
 */
export class ConnectionGroup<State = unknown, Member = undefined> implements Iterable<ConnectionHandle<State>> {
  readonly #members = new Map<ServerConnectionHandle, Member>()
  // The members (and their data) as arrays, made again after a change: a
  // send walks them while members leave (closed by the send) or join.
  #list: ServerConnectionHandle[] | null = null
  #data: Member[] | null = null

  /**
   * Adds `connection` (a handle the server gave: `ctx.connection`) with its
   * `data` (optional when `Member` admits undefined); a member already in
   * the group gets the new data. A closed
   * connection is not added. Returns the group.
   */
  add (connection: ConnectionHandle<State>, ...data: undefined extends Member ? [data?: Member] : [data: Member]): this {
    const member = asServerHandle(connection)
    if (member.isClosed) return this
    this.#members.set(member, data[0] as Member)
    this.#changed()
    member.groups.add(this)
    return this
  }

  /** Removes `connection`; false when it was not a member. */
  delete (connection: ConnectionHandle<State>): boolean {
    if (!(connection instanceof ServerConnectionHandle) || !this.#members.delete(connection)) return false
    this.#changed()
    connection.groups.delete(this)
    return true
  }

  /** True when `connection` is a member (it leaves by itself once it closes). */
  has (connection: ConnectionHandle<State>): boolean {
    return connection instanceof ServerConnectionHandle && this.#members.has(connection)
  }

  /** What `add` kept for `connection`; undefined when it is not a member. */
  get (connection: ConnectionHandle<State>): Member | undefined {
    return connection instanceof ServerConnectionHandle ? this.#members.get(connection) : undefined
  }

  /** How many connections are members. */
  get size (): number {
    return this.#members.size
  }

  /** Removes every member. */
  clear (): void {
    for (const member of this.#members.keys()) member.groups.delete(this)
    this.#members.clear()
    this.#changed()
  }

  #changed (): void {
    this.#list = null
    this.#data = null
  }

  /** The members, in the order they joined. */
  [Symbol.iterator] (): Iterator<ConnectionHandle<State>> {
    return this.#members.keys() as Iterator<ConnectionHandle<State>>
  }

  /** The members with their data, in the order they joined. */
  entries (): IterableIterator<[ConnectionHandle<State>, Member]> {
    return this.#members.entries() as IterableIterator<[ConnectionHandle<State>, Member]>
  }

  /**
   * Pushes `message` to every member (or those `filter` accepts), encoded
   * once per protocol with its `encodePush`. Returns how many members it
   * was queued to: members closed meanwhile, or closed by this send for
   * going over their push limits, do not count.
   */
  send (message: unknown, filter?: (member: ConnectionHandle<State>, data: Member) => boolean): number {
    // A member closed by this send leaves the map while it is walked: the arrays walked are not changed, only made again.
    const list = this.#list ??= Array.from(this.#members.keys())
    if (filter === undefined) return pushTo(list, null, message, undefined)
    return pushTo(list, this.#data ??= Array.from(this.#members.values()), message, filter)
  }

  /**
   * Pushes `message` once to every connection that is a member of any of
   * `groups` (or those `filter` accepts, with the member's data in the
   * first group that holds it), however many of them it is in: a broker's
   * message matching several of one client's subscriptions goes out once.
   * Encoded once per protocol. Returns how many connections it was queued to.
   */
  static sendOnce<S, M> (groups: Iterable<ConnectionGroup<S, M>>, message: unknown, filter?: (member: ConnectionHandle<S>, data: M) => boolean): number {
    const union = new Map<ServerConnectionHandle, M>()
    for (const group of groups) {
      for (const [member, data] of group.#members) if (!union.has(member)) union.set(member, data)
    }
    return pushTo(Array.from(union.keys()), Array.from(union.values()), message, filter)
  }
}

// An encoded push of several slices up to this size is joined into one
// buffer once, for all the members: each member's write is then one
// buffer, not a list of slices to gather (or copy, while it is backed up).
const JOIN_BYTES = 16 * 1024

// Queues `message` on each member (`data[i]` is members[i]'s, for the filter), encoded once per protocol; returns how many it was queued to.
function pushTo<S, M> (members: ServerConnectionHandle[], data: M[] | null, message: unknown, filter: ((member: ConnectionHandle<S>, data: M) => boolean) | undefined): number {
  let protocol: ServerProtocol | null = null
  // The encoded push: a range of the push slab (`slices` null), or slices of its own.
  let slices: Uint8Array[] | null = null
  let buffer = sharedRange.buffer
  let start = 0
  let bytes = 0
  // Its copy, for the members that cannot queue a range of the slab now (backed up): one for all of them.
  let copy: Uint8Array[] | null = null
  let sent = 0
  for (let i = 0; i < members.length; i++) {
    const member = members[i]!
    if (filter !== undefined && !filter(member as ConnectionHandle<S>, data![i]!)) continue
    if (member.protocol !== protocol) {
      protocol = member.protocol
      const encode = protocol.encodePush
      if (encode === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `the ${protocol.name} protocol has no encodePush: it cannot push`)
      slices = encodeShared(encode, protocol, message)
      copy = null
      if (slices === null) {
        buffer = sharedRange.buffer
        start = sharedRange.start
        bytes = sharedRange.end - start
      } else {
        bytes = 0
        for (const slice of slices) bytes += slice.length
        if (slices.length > 1 && bytes <= JOIN_BYTES && members.length > 1) slices = [joined(slices, bytes)]
      }
    }
    if (slices !== null) {
      if (member.sendEncoded(slices, bytes)) sent++
      continue
    }
    const taken = member.sendRange(buffer, start, bytes)
    if (taken === null) {
      copy ??= [Buffer.from(buffer.subarray(start, start + bytes))]
      if (member.sendEncoded(copy, bytes)) sent++
    } else if (taken) {
      sent++
    }
  }
  return sent
}

function joined (slices: Uint8Array[], bytes: number): Buffer {
  const out = Buffer.allocUnsafe(bytes)
  let at = 0
  for (const slice of slices) {
    out.set(slice, at)
    at += slice.length
  }
  return out
}

function asServerHandle (connection: ConnectionHandle<unknown>): ServerConnectionHandle {
  if (connection instanceof ServerConnectionHandle) return connection
  throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'a ConnectionGroup takes the connections a server hands out (ctx.connection)')
}
