import type { Deframer } from '../codec/frame-decoder.js'
import type { InboundBudget, InboundBudgetMember } from './inbound-budget.js'
import type { ReadGate } from './read-gate.js'

/**
 * What one connection holds of its inbound bytes, as its inbound budget
 * counts them: its decoder's partial frame, what its read gate keeps
 * aside, and its set-up's partial frame. It tells the budget only when the
 * sum changed (the budget may then close this connection, or another).
 * Without a budget it does nothing.
 */
export class HeldBytes {
  readonly #budget: InboundBudget | null
  readonly #member: InboundBudgetMember
  readonly #decoder: Deframer
  readonly #gate: ReadGate
  #reported = 0

  constructor (budget: InboundBudget | null, member: InboundBudgetMember, decoder: Deframer, gate: ReadGate) {
    this.#budget = budget
    this.#member = member
    this.#decoder = decoder
    this.#gate = gate
  }

  /** Tells the budget what is held now, `setUpBytes` (the running set-up's partial frame) included. */
  report (setUpBytes: number): void {
    if (this.#budget === null) return
    const held = this.#decoder.heldBytes + this.#gate.asideBytes + setUpBytes
    if (held === this.#reported) return
    this.#reported = held
    this.#budget.update(this.#member, held)
  }

  /** True when the decoder holds other than was last reported (checked after each read: only then is `report` worth its sum). */
  get moved (): boolean {
    return this.#budget !== null && this.#decoder.heldBytes !== this.#reported
  }
}
