import { ErrorCode, RpcError } from '../codec/errors.js'

/** What the budget needs of a connection. */
export interface InboundBudgetMember {
  /** Bytes received of the frame it is receiving. */
  readonly partialFrameBytes: number
  destroy: (error?: RpcError) => void
}

/** The default reactor-wide budget for bytes held in incomplete inbound frames: 256 MiB. */
export const DEFAULT_MAX_INBOUND_BUFFERED_BYTES = 256 * 1024 * 1024

/**
 * One reactor's budget for the bytes its connections hold in inbound frames
 * that have not completed. Each connection reports what its frame decoder
 * holds after every read that changed it; when the sum passes the budget,
 * the connection that has received the most of its incomplete frame is
 * closed with FRAME_TOO_LARGE (repeated until the sum fits), so that many slow or stalled peers together cannot
 * hold more than the budget. Complete frames are not counted: they are
 * handed on at once and their memory belongs to the calls they became.
 */
export class InboundBudget {
  readonly maxBytes: number
  readonly #held = new Map<InboundBudgetMember, number>()
  #total = 0
  #closed = 0
  readonly #onClose: ((member: InboundBudgetMember, heldBytes: number, error: RpcError) => unknown) | undefined

  /**
   * `onClose` is told of each connection the budget closes, before it is
   * destroyed; returning true, it closes the connection itself (after the
   * protocol's last words), having stopped its reading.
   */
  constructor (maxBytes = DEFAULT_MAX_INBOUND_BUFFERED_BYTES, onClose?: (member: InboundBudgetMember, heldBytes: number, error: RpcError) => unknown) {
    this.maxBytes = maxBytes
    this.#onClose = onClose
  }

  /** Bytes held in incomplete frames now, over all members. */
  get totalBytes (): number {
    return this.#total
  }

  /** Connections closed because the budget was exceeded. */
  get closedConnections (): number {
    return this.#closed
  }

  /** `member` holds `bytes` now (0: nothing). May close members, `member` included. */
  update (member: InboundBudgetMember, bytes: number): void {
    const before = this.#held.get(member) ?? 0
    if (bytes === before) return
    this.#total += bytes - before
    if (bytes === 0) this.#held.delete(member)
    else this.#held.set(member, bytes)
    while (this.#total > this.maxBytes && this.#held.size > 0) this.#closeLargest()
  }

  #closeLargest (): void {
    let victim: InboundBudgetMember | null = null
    let largest = -1
    for (const member of this.#held.keys()) {
      const received = member.partialFrameBytes
      if (received > largest) {
        largest = received
        victim = member
      }
    }
    const most = this.#held.get(victim!)!
    this.#total -= most
    this.#held.delete(victim!)
    this.#closed++
    const error = new RpcError(ErrorCode.FRAME_TOO_LARGE,
      `closed: it had sent ${largest} bytes of an incomplete frame when the server's inbound buffers passed their budget of ${this.maxBytes} bytes`)
    if (this.#onClose?.(victim!, largest, error) === true) return
    victim!.destroy(error)
  }
}
