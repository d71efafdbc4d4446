import type { ConnectionHandle } from '../../reactor/index.js'

/**
 * Server side: what one connection is subscribed to. A connection's
 * `ConnectionState` (resp.ts) holds it, and `PubSub` (pubsub.ts) fills it;
 * the client's side is `Subscription` (subscription.ts).
 */

/** The channels and patterns one connection is subscribed to, and the handle their messages are pushed through. */
export class Subscriptions {
  readonly connection: ConnectionHandle
  readonly channels = new Set<string>()
  readonly patterns = new Set<string>()
  /** Removes the connection's subscriptions from the registry when it closes. */
  readonly onClose: () => void

  constructor (connection: ConnectionHandle, onClose: () => void) {
    this.connection = connection
    this.onClose = onClose
  }

  /** What confirmations report: channels and patterns together, as Redis counts them. */
  get count (): number {
    return this.channels.size + this.patterns.size
  }
}
