import { InboundBudget, DEFAULT_MAX_INBOUND_BUFFERED_BYTES } from '../transport/inbound-budget.js'
import { OutboundBudget, DEFAULT_MAX_OUTBOUND_BUFFERED_BYTES } from './outbound-budget.js'
import type { ServerContext } from './server-context.js'
import { sayLastWords, type Speaker } from './last-words.js'

/** The two byte budgets a server's connections share. */
export interface ServerBudgets {
  /** Incomplete inbound frames over all connections (`maxInboundBufferedBytes`). */
  readonly inbound: InboundBudget
  /** Unsent answers over all connections (`maxOutboundBufferedBytes`). */
  readonly outbound: OutboundBudget
}

/**
 * The server's budgets, from its options (defaults resolved): past the
 * inbound one, the connection holding the most of an incomplete frame is
 * closed; past the outbound one, the heaviest backed-up connections are not
 * read. Each is logged as a warning, rate-limited (peers choose how often).
 */
export function serverBudgets (ctx: ServerContext<Speaker>): ServerBudgets {
  const options = ctx.options
  const protocol = ctx.protocol
  const inboundLog = ctx.rateLimitedLog()
  const inbound: InboundBudget = new InboundBudget(options.maxInboundBufferedBytes ?? DEFAULT_MAX_INBOUND_BUFFERED_BYTES, (member, held, error) => {
    inboundLog.log(ctx.warn, () => `closing a connection holding ${held} bytes of an incomplete frame: the inbound buffers of all connections passed their budget of ${inbound.maxBytes} bytes`,
      () => ({ protocol: protocol.name, heldBytes: held, budgetBytes: inbound.maxBytes }))
    if (protocol.lastWords === undefined) return false
    // The protocol may speak first (a rare event: the record is looked up).
    for (const sc of ctx.connections) {
      if (sc.connection !== member) continue
      return sayLastWords(ctx, sc, 'inbound-budget', error)
    }
    return false
  })
  const outboundLog = ctx.rateLimitedLog()
  const outbound: OutboundBudget = new OutboundBudget(options.maxOutboundBufferedBytes ?? DEFAULT_MAX_OUTBOUND_BUFFERED_BYTES, ctx.clock, (member, total) => {
    outboundLog.log(ctx.warn, () => `not reading from a connection holding ${member.outboundBytes} unsent bytes: unsent responses total ${total} bytes, over the budget of ${outbound.maxBytes}`,
      () => ({ protocol: protocol.name, unsentBytes: member.outboundBytes, totalUnsentBytes: total, budgetBytes: outbound.maxBytes }))
  })
  return { inbound, outbound }
}
