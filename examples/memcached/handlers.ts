import { ResponseStatus, MemcachedResponse, OK, errorResponse, type CommandName, type MemcachedRequest, type StatEntry } from './protocol.js'
import type { Item, MemcachedStore, Status, StoreMode } from './store.js'

/**
 * The memcached commands, one synchronous handler per command name (the
 * route names `decodeHead` gives), over one `MemcachedStore`. The answers
 * are memcached's (proto_bin.c): which extras, key and CAS each carries.
 * Quiet commands are handled as their loud twins; the encoder leaves out
 * what the protocol says they do not send, so here a quiet success or miss
 * returns a shared object rather than one made to be dropped.
 */

/**
 * What a handler needs of its call: closing the connection once this
 * call's answer (or non-answer) is written, and sending the parts of a
 * streamed answer before it (the server's `ctx.write`: STAT sends a packet
 * per statistic). A context without `write` (a test driving the handlers
 * directly) gets STAT's packets in its one answer instead.
 */
export interface MemcachedCallContext {
  closeConnection (): void
  write? (part: StatEntry): boolean
}

export type MemcachedHandler = (request: MemcachedRequest, ctx: MemcachedCallContext) => MemcachedResponse

export interface MemcachedHandlerOptions {
  /**
   * VERSION's answer; default `1.6.0-nyala`. Clients read the leading
   * `major.minor.patch` to pick features, so keep those numbers first.
   */
  version?: string
  /**
   * The server's connection counts, for STAT's `curr_connections` and
   * `total_connections` (the store cannot know them); without it, STAT
   * leaves them out.
   */
  connections?: () => { open: number, accepted: number }
}

const NOT_FOUND = errorResponse(ResponseStatus.KEY_ENOENT)
const EMPTY = Buffer.alloc(0)

/** The handlers of every command in `Opcode`, by name. */
export function memcachedHandlers (store: MemcachedStore, options: MemcachedHandlerOptions = {}): Record<CommandName, MemcachedHandler> {
  const version = options.version ?? '1.6.0-nyala'
  const versionAnswer = new MemcachedResponse(ResponseStatus.SUCCESS, 0, -1, EMPTY, Buffer.from(version, 'latin1'))
  const startedAt = store.now()

  // GET family. A hit carries the flags as extras, the CAS, the value, and
  // (GETK) the key; a miss is "Not found", except that GETK's miss carries
  // the key instead of a text.
  const get = (withKey: boolean, quiet: boolean): MemcachedHandler => request => {
    const item = store.get(request.keyBuffer, request.keyStart, request.keyEnd)
    return item === null ? miss(request, withKey, quiet) : hit(item, withKey, true)
  }

  // TOUCH answers like a GET hit without the value (memcached sends the flags); GAT and GATK as GET and GETK.
  const touch = (withKey: boolean, withValue: boolean, quiet: boolean): MemcachedHandler => request => {
    const item = store.touch(request.key, request.exptime)
    return item === null ? miss(request, withKey, quiet) : hit(item, withKey, withValue)
  }

  // SET, ADD, REPLACE: success carries the new CAS.
  const update = (mode: StoreMode, quiet: boolean): MemcachedHandler => request =>
    stored(store.store(mode, request.keyBuffer, request.value, request.flags, request.exptime, request.cas, request.keyStart, request.keyEnd), quiet)

  const concat = (prepend: boolean, quiet: boolean): MemcachedHandler => request =>
    stored(store.concat(request.key, request.value, prepend, request.cas), quiet)

  // INCREMENT, DECREMENT: success carries the new CAS and the number as 8 bytes, big-endian.
  const arithmetic = (increment: boolean, quiet: boolean): MemcachedHandler => request => {
    const result = store.arithmetic(request.key, increment, request.delta, request.initial, request.exptime,
      request.exptime !== 0xffffffff, request.cas)
    if (typeof result === 'number') return errorResponse(result)
    if (quiet) return OK
    const number = Buffer.allocUnsafe(8)
    number.writeBigUInt64BE(BigInt(result.value.toString('latin1')))
    return new MemcachedResponse(ResponseStatus.SUCCESS, result.cas, -1, EMPTY, number)
  }

  const remove: MemcachedHandler = request => {
    const status = store.delete(request.key, request.cas)
    return status === ResponseStatus.SUCCESS ? OK : errorResponse(status)
  }

  const flush: MemcachedHandler = request => {
    store.flush(request.exptime)
    return OK
  }

  const quit: MemcachedHandler = (_request, ctx) => {
    ctx.closeConnection()
    return OK
  }

  // STAT: no key for the general statistics, `reset` to zero the counters
  // (its answer is the end packet alone), `settings`; anything else is
  // "Not found", as memcached answers a sub-command it does not know.
  // Each statistic is a part of the streamed answer (a packet of its own,
  // sent as it is written), and the final answer is the empty packet that
  // ends them: `OK`, encoded with the STAT opcode and the request's opaque.
  const stat: MemcachedHandler = (request, ctx) => {
    switch (request.key.toString('latin1')) {
      case '':
        return statsAnswer(ctx, generalStats(store, version, startedAt, options.connections?.()))
      case 'reset':
        store.resetStats()
        return OK
      case 'settings':
        return statsAnswer(ctx, [
          ['maxbytes', String(store.memoryBytes)],
          ['item_size_max', String(store.maxItemBytes)],
          ['evictions', 'on'],
          ['cas_enabled', 'yes'],
          ['flush_enabled', 'yes'],
          ['binding_protocol', 'binary']
        ])
      default:
        return NOT_FOUND
    }
  }

  return {
    GET: get(false, false),
    GETQ: get(false, true),
    GETK: get(true, false),
    GETKQ: get(true, true),
    SET: update('set', false),
    SETQ: update('set', true),
    ADD: update('add', false),
    ADDQ: update('add', true),
    REPLACE: update('replace', false),
    REPLACEQ: update('replace', true),
    DELETE: remove,
    DELETEQ: remove,
    INCREMENT: arithmetic(true, false),
    INCREMENTQ: arithmetic(true, true),
    DECREMENT: arithmetic(false, false),
    DECREMENTQ: arithmetic(false, true),
    APPEND: concat(false, false),
    APPENDQ: concat(false, true),
    PREPEND: concat(true, false),
    PREPENDQ: concat(true, true),
    FLUSH: flush,
    FLUSHQ: flush,
    NOOP: () => OK,
    VERSION: () => versionAnswer,
    QUIT: quit,
    QUITQ: quit,
    STAT: stat,
    // memcached 1.6 answers VERBOSITY "Unknown command"; the protocol
    // defines it (4 bytes of extras: the level) and this server has no
    // log level to set, so it is accepted and does nothing.
    VERBOSITY: () => OK,
    TOUCH: touch(false, false, false),
    GAT: touch(false, true, false),
    GATQ: touch(false, true, true),
    GATK: touch(true, true, false),
    GATKQ: touch(true, true, true)
  }
}

function hit (item: Item, withKey: boolean, withValue: boolean): MemcachedResponse {
  return new MemcachedResponse(ResponseStatus.SUCCESS, item.cas, item.flags, withKey ? item.key : EMPTY, withValue ? item.valueBytes : EMPTY)
}

function miss (request: MemcachedRequest, withKey: boolean, quiet: boolean): MemcachedResponse {
  // A quiet miss is not sent: any miss object will do.
  return withKey && !quiet ? new MemcachedResponse(ResponseStatus.KEY_ENOENT, 0, -1, request.key) : NOT_FOUND
}

function stored (result: Item | Status, quiet: boolean): MemcachedResponse {
  if (typeof result === 'number') return errorResponse(result)
  return quiet ? OK : new MemcachedResponse(ResponseStatus.SUCCESS, result.cas)
}

// Writes each entry as a part, and answers the end packet; without `ctx.write`, every packet in one answer.
function statsAnswer (ctx: MemcachedCallContext, entries: readonly StatEntry[]): MemcachedResponse {
  if (ctx.write === undefined) return new MemcachedResponse(ResponseStatus.SUCCESS, 0, -1, EMPTY, EMPTY, entries)
  for (const entry of entries) {
    // False: the connection has closed, and nothing more will be sent.
    if (!ctx.write(entry)) break
  }
  return OK
}

// memcached's general statistics that this server can know, under its
// names and in its order (connections are the server's, not the store's:
// given when the server tells them).
function generalStats (store: MemcachedStore, version: string, startedAt: number, connections?: { open: number, accepted: number }): StatEntry[] {
  const now = store.now()
  const cpu = process.cpuUsage()
  const s = store.stats
  const entries: [string, number | string][] = [
    ['pid', process.pid],
    ['uptime', Math.floor((now - startedAt) / 1000)],
    ['time', Math.floor(now / 1000)],
    ['version', version],
    ['pointer_size', 64],
    ['rusage_user', seconds(cpu.user)],
    ['rusage_system', seconds(cpu.system)],
    ...(connections === undefined ? [] : [['curr_connections', connections.open], ['total_connections', connections.accepted]] as [string, number][]),
    ['cmd_get', s.cmd_get],
    ['cmd_set', s.cmd_set],
    ['cmd_flush', s.cmd_flush],
    ['cmd_touch', s.cmd_touch],
    ['get_hits', s.get_hits],
    ['get_misses', s.get_misses],
    ['get_expired', s.get_expired],
    ['delete_misses', s.delete_misses],
    ['delete_hits', s.delete_hits],
    ['incr_misses', s.incr_misses],
    ['incr_hits', s.incr_hits],
    ['decr_misses', s.decr_misses],
    ['decr_hits', s.decr_hits],
    ['cas_misses', s.cas_misses],
    ['cas_hits', s.cas_hits],
    ['cas_badval', s.cas_badval],
    ['touch_hits', s.touch_hits],
    ['touch_misses', s.touch_misses],
    ['threads', 1],
    ['limit_maxbytes', store.memoryBytes],
    ['bytes', store.usedBytes],
    ['curr_items', store.size],
    ['total_items', s.total_items],
    ['evictions', s.evictions],
    ['reclaimed', s.reclaimed]
  ]
  return entries.map(([name, value]) => [name, String(value)])
}

// Microseconds as memcached prints rusage: seconds with six decimals.
function seconds (micros: number): string {
  return `${Math.floor(micros / 1e6)}.${String(micros % 1e6).padStart(6, '0')}`
}
