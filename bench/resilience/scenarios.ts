/**
 * The failures the suite makes, each as timed events against one run's
 * hosts: a `fault` opens a detection window (one deadline long, excluded
 * from the success target), the last `heal` starts the clock of taking
 * the bad host back.
 */
import type { HostProcs, Proc } from './hosts.js'
import type { Topology } from './netns.js'
import { signal } from './hosts.js'

/** What a scenario's events act on. */
export interface ScenarioContext {
  readonly topology: Topology
  readonly hosts: HostProcs[]
  /** The delaying proxy in front of host 0, in the scenario that has one. */
  proxy: Proc | null
  /** Starts host `index` (0-based) again after a crash. */
  readonly restart: (index: number) => Promise<void>
}

/** One timed event of a scenario. */
export interface ScenarioEvent {
  /** ms from the load's start. */
  readonly at: number
  readonly kind: 'fault' | 'heal'
  readonly run: (ctx: ScenarioContext) => Promise<void> | void
}

/** One failure scenario. */
export interface Scenario {
  readonly name: string
  /** Hosts (0-based) the failure hits. */
  readonly bad: readonly number[]
  /** Host 0 is reached through the delaying proxy. */
  readonly proxy?: boolean
  /** The events, given when the fault starts and how long it lasts. */
  readonly events: (faultAt: number, faultMs: number) => ScenarioEvent[]
}

const FLAP_MS = 2000

/** The six scenarios, in the order they run. */
export const SCENARIOS: readonly Scenario[] = [
  {
    name: 'crash',
    bad: [0],
    events: (at, ms) => [
      { at, kind: 'fault', run: (c) => signal(c.hosts[0]!.server, 'SIGKILL') },
      { at: at + ms, kind: 'heal', run: async (c) => await c.restart(0) }
    ]
  },
  {
    name: 'hung host',
    bad: [0],
    events: (at, ms) => [
      { at, kind: 'fault', run: (c) => signal(c.hosts[0]!.server, 'SIGSTOP') },
      { at: at + ms, kind: 'heal', run: (c) => signal(c.hosts[0]!.server, 'SIGCONT') }
    ]
  },
  {
    name: 'silent loss',
    bad: [0],
    events: (at, ms) => [
      { at, kind: 'fault', run: (c) => c.topology.setHostLink(c.hosts[0]!.net, false) },
      { at: at + ms, kind: 'heal', run: (c) => c.topology.setHostLink(c.hosts[0]!.net, true) }
    ]
  },
  {
    name: 'flapping link',
    bad: [0],
    events: (at, ms) => {
      const events: ScenarioEvent[] = []
      for (let t = 0; t < ms; t += 2 * FLAP_MS) {
        events.push({ at: at + t, kind: 'fault', run: (c) => c.topology.setHostLink(c.hosts[0]!.net, false) })
        events.push({ at: at + Math.min(t + FLAP_MS, ms), kind: 'heal', run: (c) => c.topology.setHostLink(c.hosts[0]!.net, true) })
      }
      return events
    }
  },
  {
    name: 'slow host',
    bad: [0],
    proxy: true,
    events: (at, ms) => [
      { at, kind: 'fault', run: (c) => signal(c.proxy!, 'SIGUSR1') },
      { at: at + ms, kind: 'heal', run: (c) => signal(c.proxy!, 'SIGUSR2') }
    ]
  },
  {
    name: 'partition',
    bad: [0, 1],
    events: (at, ms) => [
      { at, kind: 'fault', run: (c) => { c.topology.setClientLink(c.hosts[0]!.net, false); c.topology.setClientLink(c.hosts[1]!.net, false) } },
      { at: at + ms, kind: 'heal', run: (c) => { c.topology.setClientLink(c.hosts[0]!.net, true); c.topology.setClientLink(c.hosts[1]!.net, true) } }
    ]
  }
]
