import { lookup } from 'node:dns/promises'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Clock } from '../../scheduling/clock.js'
import type { Address, Balancer } from '../balancer.js'

/** `host:port`, or its parts. */
export type Endpoint = string | { host: string, port: number }

/** One endpoint, or several to balance calls over. */
export type Target = Endpoint | readonly Endpoint[]

/** `endpoint` as host and port; strings are parsed once (`cache`, up to 1024 of them). */
export function parseEndpoint (endpoint: Endpoint, cache: Map<string, { host: string, port: number }>): { host: string, port: number } {
  if (typeof endpoint !== 'string') {
    const { host, port } = endpoint
    if (typeof host !== 'string' || host === '' || !Number.isInteger(port) || port <= 0 || port > 65535) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad endpoint ${JSON.stringify(endpoint)}: expected { host, port } with a port in 1..65535`)
    }
    return endpoint
  }
  const cached = cache.get(endpoint)
  if (cached !== undefined) return cached
  const at = endpoint.lastIndexOf(':')
  const port = Number(endpoint.slice(at + 1))
  if (at <= 0 || !Number.isInteger(port) || port <= 0 || port > 65535) {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad endpoint ${endpoint}: expected HOST:PORT`)
  }
  const parsed = { host: endpoint.slice(0, at).replace(/^\[|\]$/g, ''), port }
  if (cache.size < 1024) cache.set(endpoint, parsed)
  return parsed
}

const RESOLVE_EVERY_MS = 30_000

/** A balanced target: its balancer, and the DNS names it re-resolves. */
export class BalancedTarget {
  readonly name: string
  readonly balancer: Balancer
  /** Set while the names are resolved for the first time; calls wait on it. */
  resolving: Promise<void> | null = null
  readonly #names: Address[] | null
  readonly #clock: Clock
  #resolvedAt = 0
  #refreshing = false

  constructor (name: string, balancer: Balancer, names: Address[] | null, clock: Clock) {
    this.name = name
    this.balancer = balancer
    this.#names = names
    this.#clock = clock
    if (names !== null) {
      this.resolving = this.#resolve().then(() => { this.resolving = null }, (error: unknown) => {
        this.resolving = null
        throw error
      })
    }
  }

  /** Re-resolves the names in the background once they are older than 30 s; calls go on with the old addresses meanwhile. */
  refresh (): void {
    if (this.#names === null || this.#refreshing || this.#clock.now() - this.#resolvedAt < RESOLVE_EVERY_MS) return
    this.#refreshing = true
    this.#resolve().catch(() => {}).finally(() => { this.#refreshing = false })
  }

  async #resolve (): Promise<void> {
    const addresses: Address[] = []
    for (const { host, port } of this.#names!) {
      try {
        for (const found of await lookup(host, { all: true })) addresses.push({ host: found.address, port })
      } catch (err) {
        throw new RpcError(ErrorCode.CONNECT_FAILED, `cannot resolve ${host}: ${(err as Error).message}`, { cause: err })
      }
    }
    this.#resolvedAt = this.#clock.now()
    this.balancer.setAddresses(addresses)
  }
}
