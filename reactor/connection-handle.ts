import { EventEmitter } from 'node:events'
import { ErrorCode, RpcError } from '../codec/errors.js'
import { encodeShared, sharedRange } from '../transport/shared-frame.js'
import type { ConnectionHandle, ServerProtocol } from '../codec/protocol.js'
import { NOT_TAKEN, type PushOutputLimit } from './push-output-limit.js'
import type { ServerContext } from './server-context.js'
import type { ConnectionRecord } from './connection-record.js'
import { IdleTimer } from './idle-timer.js'

export type { WriteWatermarks } from './server-options.js'

export const DEFAULT_HIGH_WATERMARK_BYTES = 64 * 1024
export const DEFAULT_LOW_WATERMARK_BYTES = 32 * 1024

/** The bytes unsent at which a handle turns unwritable (`highBytes`) and writable again (`lowBytes`), resolved. */
export interface Watermarks {
  readonly highBytes: number
  readonly lowBytes: number
}

/**
 * The server's `ConnectionHandle` of one connection (see its interface in
 * codec/protocol.ts): made at accept, handed to handlers as
 * `ctx.connection`, to `connectionState` and to `handshake`. Once the
 * connection closes it lets go of it, so a handle kept by the application
 * holds no socket or buffer.
 */
export class ServerConnectionHandle extends EventEmitter implements ConnectionHandle {
  readonly remoteAddress: string
  readonly closed: Promise<void>
  readonly #ctx: ServerContext
  readonly #pushes: PushOutputLimit
  readonly #watermarks: Watermarks
  #sc: ConnectionRecord | null
  #user = ''
  #state: unknown = undefined
  #resolveClosed: () => void = noop
  #writable = true
  #checkArmed = false
  /** Reading held by `pauseReading`, and by the session order (the two share the connection's application hold). */
  #paused = false
  #orderHeld = false
  /** Its own idle timeout (`setIdleTimeout`); null while the server's applies. */
  #idle: IdleTimer | null = null
  /** Marked a session by `markSession`. */
  #session = false
  /** The groups it belongs to: it leaves them when it closes. Internal. */
  readonly groups = new Set<{ delete (member: ConnectionHandle<any>): boolean }>() // eslint-disable-line @typescript-eslint/no-explicit-any
  readonly #check = (): void => this.#checkWritable()

  constructor (sc: ConnectionRecord, ctx: ServerContext, pushes: PushOutputLimit, watermarks: Watermarks) {
    super()
    this.#ctx = ctx
    this.#pushes = pushes
    this.#watermarks = watermarks
    this.#sc = sc
    this.remoteAddress = sc.remoteAddress
    this.closed = new Promise((resolve) => { this.#resolveClosed = resolve })
  }

  get user (): string {
    return this.#sc?.peer.user ?? this.#user
  }

  get state (): unknown {
    return this.#sc?.state ?? this.#state
  }

  get isClosed (): boolean {
    return this.#sc === null
  }

  get isSession (): boolean {
    return this.#session || this.groups.size > 0
  }

  markSession (session = true): void {
    this.#session = session
  }

  setIdleTimeout (ms: number, options: { inboundOnly?: boolean } = {}): void {
    const sc = this.#sc
    if (sc === null) return
    if (!(Number.isFinite(ms) && ms >= 0)) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `setIdleTimeout needs a number of ms of at least 0, got ${ms}`)
    // The server's idle close no longer applies to this connection.
    sc.scan.ownIdle = true
    ;(this.#idle ??= new IdleTimer(this.#ctx, sc)).set(ms, options.inboundOnly === true)
  }

  /** The protocol that encodes its pushes (groups encode once per protocol). Internal. */
  get protocol (): ServerProtocol {
    return this.#ctx.protocol
  }

  send (message: unknown): boolean {
    const encode = this.#ctx.protocol.encodePush
    if (encode === undefined) throw new RpcError(ErrorCode.INVALID_ARGUMENT, `the ${this.#ctx.protocol.name} protocol has no encodePush: it cannot push`)
    if (this.#sc === null) return false
    const slices = encodeShared(encode, this.#ctx.protocol, message)
    if (slices !== null) return this.sendEncoded(slices, byteLengthOf(slices))
    const { buffer, start, end } = sharedRange
    return this.sendRange(buffer, start, end - start) ?? this.sendEncoded([Buffer.from(buffer.subarray(start, end))], end - start)
  }

  /** Sends bytes already encoded by this handle's protocol (shared by a group's members). Internal. */
  sendEncoded (slices: Uint8Array[], bytes: number): boolean {
    const sc = this.#sc
    if (sc === null) return false
    return this.#pushed(this.#pushes.push(sc, slices, bytes))
  }

  /**
   * Sends the frame at `buffer[start, start + bytes)`, encoded by this
   * handle's protocol once for many connections (transport/shared-frame.ts);
   * null when the connection cannot queue a range of a shared buffer now:
   * `sendEncoded` a copy. Internal.
   */
  sendRange (buffer: Buffer, start: number, bytes: number): boolean | null {
    const sc = this.#sc
    if (sc === null) return false
    const unsent = this.#pushes.pushRange(sc, buffer, start, bytes)
    return unsent === NOT_TAKEN ? null : this.#pushed(unsent)
  }

  // After a push: false when the connection is closed (-1), else it may turn unwritable with its `unsent` bytes.
  #pushed (unsent: number): boolean {
    if (unsent < 0) return false
    if (this.#writable && unsent > this.#watermarks.highBytes) this.#becameUnwritable()
    return true
  }

  // What is queued goes out, then the connection ends; with `reset`, an RST at once.
  close (how?: string | { reason?: string, reset?: boolean }): void {
    const sc = this.#sc
    if (sc === null) return
    const connection = sc.connection
    if (connection.isClosed) return
    const reason = typeof how === 'string' ? how : how?.reason
    const reset = typeof how === 'object' && how.reset === true
    if (reason !== undefined) this.#ctx.log.info(`closing ${sc.remoteAddress}${reset ? ' with a reset' : ''}: ${reason}`, { protocol: this.#ctx.protocol.name, remote: sc.remoteAddress })
    const error = new RpcError(ErrorCode.CONNECTION_CLOSED, reason === undefined ? 'closed by the server' : `closed by the server: ${reason}`)
    if (reset) {
      connection.reset(error)
      return
    }
    sc.answers.requestClose(-1)
    connection.endAfterFlush(error)
  }

  get writable (): boolean {
    if (this.#writable && this.#sc !== null && this.bufferedBytes > this.#watermarks.highBytes) this.#becameUnwritable()
    return this.#writable
  }

  get bufferedBytes (): number {
    const sc = this.#sc
    return sc === null ? 0 : sc.connection.outboundBytes + sc.answers.heldBytes
  }

  pauseReading (): void {
    this.#paused = true
    this.#sc?.connection.holdReading()
  }

  resumeReading (): void {
    this.#paused = false
    if (!this.#orderHeld) this.#sc?.connection.releaseReading()
  }

  /** Stops reading while the connection's sequential calls are at their bound (session-order.ts), or reads again unless `pauseReading` holds it. Internal. */
  holdForOrder (stop: boolean): void {
    this.#orderHeld = stop
    if (stop) this.#sc?.connection.holdReading()
    else if (!this.#paused) this.#sc?.connection.releaseReading()
  }

  // Past the high watermark: watch the bytes fall, on each 'drain' of the
  // socket, and once a turn while the queue still has to hand bytes to it
  // (a socket that takes everything at once emits no 'drain').
  #becameUnwritable (): void {
    this.#writable = false
    const sc = this.#sc!
    sc.connection.onDrain = this.#check
    this.#armCheck()
  }

  #armCheck (): void {
    if (this.#checkArmed) return
    this.#checkArmed = true
    setImmediate(this.#check)
  }

  #checkWritable (): void {
    this.#checkArmed = false
    const sc = this.#sc
    if (sc === null || this.#writable) return
    if (this.bufferedBytes <= this.#watermarks.lowBytes) {
      this.#writable = true
      sc.connection.onDrain = null
      this.emit('drain')
      return
    }
    // Waiting for 'drain' means the socket's own buffer is full: its 'drain' calls back.
    if (!sc.connection.isBackedUp) this.#armCheck()
  }

  /** The connection closed: leave every group, resolve `closed`, emit 'close', and let go of the connection. Internal. */
  connectionClosed (error: RpcError | undefined): void {
    const sc = this.#sc
    if (sc === null) return
    this.#user = sc.peer.user
    this.#state = sc.state
    this.#sc = null
    this.#idle?.stop()
    sc.connection.onDrain = null
    for (const group of this.groups) group.delete(this)
    this.groups.clear()
    this.#resolveClosed()
    this.emit('close', error)
  }
}

function byteLengthOf (slices: Uint8Array[]): number {
  let bytes = 0
  for (const slice of slices) bytes += slice.length
  return bytes
}

function noop (): void {}
