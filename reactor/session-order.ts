// Sequential execution (`execution: 'sequential'`): one connection's calls
// run one at a time, in arrival order, each after the previous one was
// answered, as PostgreSQL, Redis and an MQTT session run theirs. A FIFO per
// connection stands in front of the group's ServicePool: only a session's
// head call enters the pool, like any call (EDF, the queue bound, busy and
// expiry apply to it there), so the pool's concurrency counts sessions, and
// a session waiting for its own slow call holds no slot another session
// could use. The rest wait here, bounded per connection: past the bound the
// connection is not read until its queue falls to half.
import Denque from 'denque'
import type { RefusalReason } from '../codec/protocol.js'

/** What the session order needs of a call (an `InboundCall`). */
export interface SequencedCall {
  /** Its connection's sequential calls while it is one of them; null otherwise. */
  session: SessionQueue | null
  /** It asked to close its connection after its answer. */
  readonly closeAfter: boolean
}

/** The default bound of one connection's waiting calls (`ServerOptions.sessionQueueLength`). */
export const DEFAULT_SESSION_QUEUE_LENGTH = 256

/** What the session order needs of a connection: to stop and restart reading it. */
export interface SessionReads {
  /** Stops reading (`true`) for the session order's reason, or reads again (`false`) unless another reason holds it. */
  holdForOrder: (stop: boolean) => void
}

/** One connection's sequential calls: the one running (entered the pool or its handler) and those waiting behind it. */
export class SessionQueue {
  /** The call that entered its group's pool (queued there or running); null when none. */
  running: SequencedCall | null = null
  readonly waiting = new Denque<SequencedCall>()
  /** Reading is stopped because `waiting` reached its bound. */
  holding = false
  /** `SessionOrder.left` is starting the next call (a synchronous answer re-enters it). */
  starting = false
  readonly reads: SessionReads

  constructor (reads: SessionReads) {
    this.reads = reads
  }
}

/**
 * The server's sequential execution: enters each session's head call (at
 * once when the session has none in the pool), and the next one once the
 * head is released (answered, refused, or abandoned).
 */
export class SessionOrder<C extends SequencedCall> {
  readonly #maxWaiting: number
  /** Hands a call to its group: the pool's `submit`, or its handler at once without a pool. */
  readonly #start: (call: C) => void
  /** Answers a call that will not run (its connection closed, or a call before it closed the connection). */
  readonly #refuse: (call: C, reason: RefusalReason, message: string) => void

  constructor (maxWaiting: number, start: (call: C) => void, refuse: (call: C, reason: RefusalReason, message: string) => void) {
    this.#maxWaiting = maxWaiting
    this.#start = start
    this.#refuse = refuse
  }

  /** A sequential call arrived on `session`'s connection: it starts now, or waits for the ones before it. */
  enter (session: SessionQueue, call: C): void {
    call.session = session
    if (session.running === null) {
      session.running = call
      this.#start(call)
      return
    }
    const waiting = session.waiting
    waiting.push(call)
    if (!session.holding && waiting.length >= this.#maxWaiting) {
      session.holding = true
      session.reads.holdForOrder(true)
    }
  }

  /** `call` left its connection (answered, refused, abandoned): the next waiting one starts. */
  left (call: C): void {
    const session = call.session!
    call.session = null
    if (session.running !== call) return
    session.running = null
    if (call.closeAfter) {
      // Nothing after a call that closed the connection runs.
      this.closed(session, 'the connection closes after an earlier request')
      return
    }
    // A loop, not recursion: a next call answered at once (a synchronous
    // handler) comes back here while this one is still starting it.
    if (session.starting) return
    session.starting = true
    const waiting = session.waiting
    while (session.running === null && waiting.length > 0) {
      const next = waiting.shift()!
      // Running first: reading again may deliver frames at once, and they must queue behind it.
      session.running = next
      if (session.holding && waiting.length <= this.#maxWaiting >> 1) {
        session.holding = false
        session.reads.holdForOrder(false)
      }
      this.#start(next as C)
    }
    session.starting = false
  }

  /** The connection closed (or will read and run nothing more): its waiting calls are refused, in order. */
  closed (session: SessionQueue, why = 'connection closed'): void {
    const waiting = session.waiting
    while (waiting.length > 0) {
      const call = waiting.shift()!
      call.session = null
      this.#refuse(call as C, 'shutdown', why)
    }
  }
}
