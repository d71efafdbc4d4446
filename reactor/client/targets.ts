import { lookup } from 'node:dns/promises'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import type { Clock } from '../../scheduling/clock.js'
import { OutlierEjection, type OutlierEjectionOptions, type OutlierEjectionStats } from '../../scheduling/outlier-ejection.js'
import { Balancer, type Address, type BalancePolicy, type Slot } from '../balancer.js'
import { subsetAddresses } from './address-subset.js'

/** `host:port`, or its parts. */
export type ClientEndpoint = string | {
  /** A host name or an IP address. */
  host: string
  /** The TCP port, 1 to 65535. */
  port: number
}

/** One endpoint, or several to balance calls over. */
export type ClientTarget = ClientEndpoint | readonly ClientEndpoint[]

/** `endpoint` as host and port; strings are parsed once (`cache`, up to 1024 of them). */
export function parseEndpoint (endpoint: ClientEndpoint, cache: Map<string, Address>): Address {
  if (typeof endpoint !== 'string') {
    const { host, port } = endpoint
    if (typeof host !== 'string' || host === '' || !Number.isInteger(port) || port <= 0 || port > 65535) {
      throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad endpoint ${JSON.stringify(endpoint)}: expected { host, port } with a port in 1..65535`)
    }
    return { host, port }
  }
  const cached = cache.get(endpoint)
  if (cached !== undefined) return cached
  const at = endpoint.lastIndexOf(':')
  const port = Number(endpoint.slice(at + 1))
  if (at <= 0 || !Number.isInteger(port) || port <= 0 || port > 65535) {
    throw new RpcError(ErrorCode.INVALID_ARGUMENT, `bad endpoint ${endpoint}: expected HOST:PORT`)
  }
  const parsed = { host: endpoint.slice(0, at).replace(/^\[|\]$/g, ''), port }
  if (cache.size < MAX_REMEMBERED) cache.set(endpoint, parsed)
  return parsed
}

/** Resolves a host name to its addresses, as node:dns/promises's `lookup(host, { all: true })`. */
export type HostLookup = (hostname: string) => Promise<ReadonlyArray<{ readonly address: string }>>

/** node:dns's lookup of every address of a name. */
export const dnsLookup: HostLookup = (hostname) => lookup(hostname, { all: true })

/** The default of `maxResolvedAddresses`. */
export const DEFAULT_MAX_RESOLVED_ADDRESSES = 32

const RESOLVE_EVERY_MS = 30_000
const MAX_REMEMBERED = 1024

/** How targets make their balancers. */
export interface TargetSettings {
  readonly connectionsPerEndpoint: number
  readonly policy: BalancePolicy
  /** Resolve each host name to all its addresses (DNS) and balance over them, re-resolved every 30 s. */
  readonly resolveAll: boolean
  /** With `resolveAll`: the most addresses a target uses (a subset, address-subset.ts). */
  readonly maxResolvedAddresses: number
  /** This client's seed for drawing that subset. */
  readonly subsetSeed: number
  /** How host names are resolved (node:dns's `lookup` with `all: true` by default). */
  readonly lookup: HostLookup
  readonly clock: Clock
  /** Calls waiting on a slot's connection now. */
  readonly outstanding: (slot: Slot) => number
  /** Outlier ejection of each target's hosts; null: none. */
  readonly ejection: OutlierEjectionOptions | null
}

/** A target: its balancer over its endpoints' connection slots, and the DNS names it re-resolves. */
export class Target {
  readonly name: string
  readonly balancer: Balancer
  /** Set while the names are resolved for the first time; calls wait on it. */
  resolving: Promise<void> | null = null
  readonly #names: Address[] | null
  readonly #clock: Clock
  readonly #settings: TargetSettings
  #resolvedAt = 0
  #refreshing = false

  constructor (name: string, addresses: Address[], settings: TargetSettings) {
    this.name = name
    this.#clock = settings.clock
    this.#settings = settings
    this.#names = settings.resolveAll ? addresses : null
    this.balancer = new Balancer(settings.resolveAll ? [] : addresses, {
      connectionsPerEndpoint: settings.connectionsPerEndpoint,
      policy: settings.policy,
      clock: settings.clock,
      outstanding: settings.outstanding,
      ejection: settings.ejection === null ? null : new OutlierEjection(settings.clock, settings.ejection)
    })
    if (this.#names !== null) {
      this.resolving = this.#resolve().then(() => { this.resolving = null }, (error: unknown) => {
        this.resolving = null
        throw error
      })
      // A target nobody calls yet must not report an unhandled rejection.
      this.resolving.catch(() => {})
    }
  }

  /** The slot every call takes (one address, one connection, no names to re-resolve), or null. */
  get soleSlot (): Slot | null {
    return this.#names === null ? this.balancer.soleSlot : null
  }

  /** The slot for the next call; re-resolves the names in the background once they are older than 30 s (calls go on with the old addresses meanwhile). */
  pick (): Slot | undefined {
    if (this.#names !== null) this.#refresh()
    return this.balancer.pick()
  }

  #refresh (): void {
    if (this.#refreshing || this.#clock.now() - this.#resolvedAt < RESOLVE_EVERY_MS) return
    this.#refreshing = true
    this.#resolve().catch(() => {}).finally(() => { this.#refreshing = false })
  }

  // Every address of every name, then at most `maxResolvedAddresses` of them
  // (a name with thousands would otherwise open a connection to each, until
  // descriptors run out): the subset is drawn again from each resolution.
  async #resolve (): Promise<void> {
    const addresses: Address[] = []
    const seen = new Set<string>()
    const settings = this.#settings
    for (const { host, port } of this.#names!) {
      try {
        for (const found of await settings.lookup(host)) {
          const key = `${found.address}:${port}`
          if (seen.has(key)) continue
          seen.add(key)
          addresses.push({ host: found.address, port })
        }
      } catch (err) {
        throw new RpcError(ErrorCode.CONNECT_FAILED, `cannot resolve ${host}: ${(err as Error).message}`, { cause: err })
      }
    }
    this.#resolvedAt = this.#clock.now()
    this.balancer.setAddresses(subsetAddresses(addresses, settings.maxResolvedAddresses, settings.subsetSeed))
  }
}

/**
 * A client's targets by name, made on first use (at most 1024 remembered),
 * and the string endpoints they were named by.
 */
export class Targets {
  readonly #settings: TargetSettings
  readonly #byName = new Map<string, Target>()
  readonly #endpoints = new Map<string, Address>()
  // The last string endpoint called and its target: most calls repeat them.
  #lastEndpoint: string | null = null
  #lastTarget: Target | null = null

  constructor (settings: TargetSettings) {
    this.#settings = settings
  }

  /** Outlier ejection summed over the targets (hosts as `host:port`); null when off. */
  ejectionStats (): OutlierEjectionStats | null {
    if (this.#settings.ejection === null) return null
    const sum: OutlierEjectionStats = { ejections: 0, readmissions: 0, ejectionsRefused: 0, probeFailures: 0, ejected: 0, ejectedHosts: [] }
    for (const target of this.#byName.values()) {
      const s = target.balancer.ejectionStats()
      if (s === null) continue
      sum.ejections += s.ejections
      sum.readmissions += s.readmissions
      sum.ejectionsRefused += s.ejectionsRefused
      sum.probeFailures += s.probeFailures
      sum.ejected += s.ejected
      sum.ejectedHosts.push(...s.ejectedHosts)
    }
    return sum
  }

  /** The target of `endpoint` (one, or a list to balance over); throws an RpcError for a bad endpoint. */
  of (endpoint: ClientTarget): Target {
    if (endpoint === this.#lastEndpoint) return this.#lastTarget!
    const list = (Array.isArray(endpoint) ? endpoint : [endpoint]) as readonly ClientEndpoint[]
    if (list.length === 0) throw new RpcError(ErrorCode.INVALID_ARGUMENT, 'no endpoint: the list is empty')
    const name = typeof endpoint === 'string' ? endpoint : list.map((e) => typeof e === 'string' ? e : `${e?.host}:${e?.port}`).join(',')
    let target = this.#byName.get(name)
    if (target === undefined) {
      target = new Target(name, list.map((e) => parseEndpoint(e, this.#endpoints)), this.#settings)
      if (this.#byName.size < MAX_REMEMBERED) this.#byName.set(name, target)
    }
    // Only strings are remembered (an endpoint object could change under us).
    if (typeof endpoint === 'string') {
      this.#lastEndpoint = endpoint
      this.#lastTarget = target
    }
    return target
  }
}
