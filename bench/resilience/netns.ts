/**
 * The suite's network: a client namespace and one namespace per server
 * host, each host joined to the client by a veth pair of its own
 * (10.201.N.1 on the client's side, 10.201.N.2 on the host's), so that a
 * host's link can be cut without a FIN or an RST by setting its end down.
 * Names carry the runner's PID: a second run, or a stale one's leftovers,
 * never collide, and `removeStale` deletes what a killed run left.
 */
import { execFileSync } from 'node:child_process'

/** `ip` with `args`; throws with its stderr on failure. */
export function ip (args: readonly string[]): string {
  return execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
}

/** One server host: its namespace, its address, and the interfaces of its link. */
export interface HostNet {
  readonly index: number
  readonly ns: string
  readonly address: string
  /** The link's end inside the host's namespace. */
  readonly hostIf: string
  /** The link's end inside the client's namespace. */
  readonly clientIf: string
}

/** The namespaces and links of one run. */
export class Topology {
  readonly prefix: string
  readonly clientNs: string
  readonly hosts: HostNet[]
  #made: string[] = []

  constructor (hostCount: number, pid = process.pid) {
    this.prefix = `nyr${pid}`
    this.clientNs = `${this.prefix}c`
    this.hosts = Array.from({ length: hostCount }, (_, i) => ({
      index: i + 1,
      ns: `${this.prefix}h${i + 1}`,
      address: `10.201.${i + 1}.2`,
      hostIf: 'link0',
      clientIf: `h${i + 1}`
    }))
  }

  /** Makes the namespaces and links; on any failure undoes what it made and rethrows. */
  create (): void {
    try {
      this.#ns(this.clientNs)
      for (const h of this.hosts) {
        this.#ns(h.ns)
        ip(['link', 'add', h.clientIf, 'netns', this.clientNs, 'type', 'veth', 'peer', 'name', h.hostIf, 'netns', h.ns])
        ip(['-n', this.clientNs, 'addr', 'add', `10.201.${h.index}.1/24`, 'dev', h.clientIf])
        ip(['-n', h.ns, 'addr', 'add', `${h.address}/24`, 'dev', h.hostIf])
        ip(['-n', this.clientNs, 'link', 'set', h.clientIf, 'up'])
        ip(['-n', h.ns, 'link', 'set', h.hostIf, 'up'])
      }
    } catch (err) {
      this.destroy()
      throw err
    }
  }

  /** Sets the host's end of its link down (`up` false) or up: packets are dropped silently meanwhile. */
  setHostLink (host: HostNet, up: boolean): void {
    ip(['-n', host.ns, 'link', 'set', host.hostIf, up ? 'up' : 'down'])
  }

  /** Sets the client's end of the link to `host` down or up (a partition seen from the client's side). */
  setClientLink (host: HostNet, up: boolean): void {
    ip(['-n', this.clientNs, 'link', 'set', host.clientIf, up ? 'up' : 'down'])
  }

  /** Deletes every namespace made (their veths go with them); never throws. */
  destroy (): void {
    for (const ns of this.#made.reverse()) {
      try { ip(['netns', 'del', ns]) } catch {}
    }
    this.#made = []
  }

  #ns (name: string): void {
    ip(['netns', 'add', name])
    this.#made.push(name)
    ip(['-n', name, 'link', 'set', 'lo', 'up'])
  }
}

/** Deletes the namespaces of earlier runs whose runner is no longer alive. */
export function removeStale (): string[] {
  const removed: string[] = []
  let list = ''
  try { list = ip(['netns', 'list']) } catch { return removed }
  for (const line of list.split('\n')) {
    const name = line.split(' ')[0] ?? ''
    const m = /^nyr(\d+)[ch]\d*$/.exec(name)
    if (m === null) continue
    const pid = Number(m[1])
    let alive = true
    try { process.kill(pid, 0) } catch { alive = false }
    if (alive && pid !== process.pid) continue
    try { ip(['netns', 'del', name]); removed.push(name) } catch {}
  }
  return removed
}

/** Why namespaces cannot be made here, or null when they can (tries one and deletes it). */
export function netnsUnavailable (): string | null {
  if (process.platform !== 'linux') return `network namespaces need Linux (this is ${process.platform})`
  if (process.getuid?.() !== 0) return 'network namespaces need root'
  const probe = `nyr${process.pid}probe`
  try {
    ip(['netns', 'add', probe])
  } catch (err) {
    return `ip netns add failed: ${((err as { stderr?: string }).stderr ?? (err as Error).message).trim()}`
  }
  try {
    ip(['link', 'add', `${probe}a`, 'netns', probe, 'type', 'veth', 'peer', 'name', `${probe}b`, 'netns', probe])
  } catch (err) {
    return `cannot make a veth pair: ${((err as { stderr?: string }).stderr ?? (err as Error).message).trim()}`
  } finally {
    try { ip(['netns', 'del', probe]) } catch {}
  }
  return null
}
