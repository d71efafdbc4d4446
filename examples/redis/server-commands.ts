/**
 * The server and connection commands (server.c, networking.c): PING, ECHO,
 * INFO, COMMAND, CLIENT, SELECT, CONFIG GET, QUIT, HELLO.
 */
import { COMMANDS, type Command } from './commands.js'
import { globMatch } from './glob.js'
import type { HandlerTable, RedisHandler } from './handler.js'
import { asNumber } from './arguments.js'
import { subscribedPing } from './pubsub.js'
import { EMPTY_ARRAY, Errors, arityError, unknownSubcommand } from './replies.js'
import { NIL_ARRAY, OK, PONG, error, oneLine, type ConnectionState, type Reply } from './resp.js'
import type { RedisStore } from './store.js'

/** The server and connection commands' route names. */
export type ServerCommandName = 'PING' | 'ECHO' | 'INFO' | 'COMMAND' | 'CLIENT' | 'SELECT' | 'CONFIG' | 'QUIT' | 'HELLO'

/** What INFO, CONFIG GET and HELLO tell of the server (`RedisHandlerOptions`' part for them). */
export interface ServerCommandOptions {
  /** INFO's redis_version and HELLO's version; default 7.0.0. */
  version?: string
  /** The port, for INFO. */
  port?: () => number
  /** Connections open, for INFO (connected_clients). */
  connectedClients?: () => number
  /** CONFIG GET's proto-max-bulk-len. */
  protoMaxBulkLen?: number
}

/** Redis's rule for a client name (CLIENT SETNAME, HELLO SETNAME): printable ASCII, no space. */
function validClientName (name: string): boolean {
  for (let k = 0; k < name.length; k++) {
    const c = name.charCodeAt(k)
    if (c < 0x21 || c > 0x7e) return false
  }
  return true
}

/** The server and connection commands' handlers over `store`. */
export function serverHandlers (store: RedisStore, options: ServerCommandOptions = {}): HandlerTable<ServerCommandName> {
  const version = options.version ?? '7.0.0'
  const startedAt = Date.now()

  const info: RedisHandler = request => {
    const wanted = request.argc === 0 ? null : new Set(Array.from({ length: request.argc }, (_, i) => request.str(i).toLowerCase()))
    const all = wanted === null || wanted.has('all') || wanted.has('everything') || wanted.has('default')
    const sections: [string, [string, string | number][]][] = [
      ['Server', [
        ['redis_version', version], ['redis_mode', 'standalone'], ['os', `${process.platform} ${process.arch}`],
        ['arch_bits', 64], ['multiplexing_api', 'epoll'], ['process_id', process.pid],
        ['tcp_port', options.port?.() ?? 0], ['uptime_in_seconds', Math.floor((Date.now() - startedAt) / 1000)],
        ['executable', 'nyala examples/redis']
      ]],
      ['Clients', [['connected_clients', options.connectedClients?.() ?? 0]]],
      ['Memory', [
        ['used_memory', store.usedBytes], ['maxmemory', store.maxMemoryBytes], ['maxmemory_policy', 'allkeys-lru']
      ]],
      ['Persistence', [['loading', 0], ['rdb_changes_since_last_save', 0], ['aof_enabled', 0]]],
      ['Stats', [
        ['expired_keys', store.stats.expiredKeys], ['evicted_keys', store.stats.evictedKeys],
        ['keyspace_hits', store.stats.keyspaceHits], ['keyspace_misses', store.stats.keyspaceMisses]
      ]],
      ['Replication', [['role', 'master'], ['connected_slaves', 0]]],
      ['Keyspace', store.size > 0 ? [['db0', `keys=${store.size},expires=${store.volatileCount},avg_ttl=0`]] : []]
    ]
    const lines: string[] = []
    for (const [name, fields] of sections) {
      if (!all && !wanted!.has(name.toLowerCase())) continue
      if (lines.length > 0) lines.push('')
      lines.push(`# ${name}`)
      for (const [field, value] of fields) lines.push(`${field}:${value}`)
    }
    return lines.length === 0 ? '' : lines.join('\r\n') + '\r\n'
  }

  // COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS: enough for redis-cli (which asks COMMAND DOCS for its hints).
  const commandInfo = (command: Command): Reply => {
    const keyed = !['ping', 'echo', 'dbsize', 'flushdb', 'flushall', 'keys', 'info', 'command', 'client', 'select', 'config', 'quit', 'hello',
      'subscribe', 'unsubscribe', 'psubscribe', 'punsubscribe', 'publish', 'pubsub', 'reset'].includes(command.name)
    const step = command.name === 'mset' ? 2 : 1
    const last = ['del', 'exists', 'mget', 'mset'].includes(command.name) ? -1 : keyed ? 1 : 0
    return [command.name, command.arity, EMPTY_ARRAY, keyed ? 1 : 0, last, keyed ? step : 0, EMPTY_ARRAY, EMPTY_ARRAY, EMPTY_ARRAY, EMPTY_ARRAY]
  }
  const command: RedisHandler = request => {
    if (request.argc === 0) return COMMANDS.map(commandInfo)
    if (request.is(0, 'count')) return COMMANDS.length
    if (request.is(0, 'docs')) return EMPTY_ARRAY
    if (request.is(0, 'info')) {
      const out: Reply[] = []
      for (let i = 1; i < request.argc; i++) {
        const name = request.str(i).toLowerCase()
        const found = COMMANDS.find(c => c.name === name)
        out.push(found === undefined ? NIL_ARRAY : commandInfo(found))
      }
      return out
    }
    return unknownSubcommand(request.prefix(0, 128), 'COMMAND')
  }

  const client: RedisHandler = (request, ctx) => {
    const state = ctx.connectionState as ConnectionState
    if (request.is(0, 'setname')) {
      if (request.argc !== 2) return arityError('client|setname')
      const name = request.str(1)
      if (!validClientName(name)) return Errors.clientName
      state.name = name
      return OK
    }
    if (request.is(0, 'getname')) {
      if (request.argc !== 1) return arityError('client|getname')
      return state.name === '' ? null : state.name
    }
    if (request.is(0, 'id')) {
      if (request.argc !== 1) return arityError('client|id')
      return state.id
    }
    if (request.is(0, 'setinfo')) {
      if (request.argc !== 3) return arityError('client|setinfo')
      return OK
    }
    return unknownSubcommand(request.prefix(0, 128), 'CLIENT')
  }

  const select: RedisHandler = request => {
    const n = request.int(0)
    if (n === null) return Errors.notInteger
    return n === 0 ? OK : Errors.dbIndex
  }

  const configValues: [string, string][] = [
    ['save', ''], ['appendonly', 'no'], ['databases', '1'], ['maxmemory', String(store.maxMemoryBytes)],
    ['maxmemory-policy', 'allkeys-lru'], ['proto-max-bulk-len', String(options.protoMaxBulkLen ?? 512 * 1024 * 1024)],
    ['timeout', '0'], ['port', String(options.port?.() ?? 0)], ['bind', '127.0.0.1']
  ]
  const config: RedisHandler = request => {
    if (request.is(0, 'get')) {
      if (request.argc < 2) return arityError('config|get')
      const out: string[] = []
      for (const [name, value] of configValues) {
        for (let i = 1; i < request.argc; i++) {
          const pattern = request.str(i)
          // As Redis: a name without glob characters is looked up, and answered as it was asked.
          const literal = !/[[*?]/.test(pattern)
          if (literal ? pattern.toLowerCase() === name : globMatch(pattern, name, true)) {
            out.push(literal ? pattern : name, value)
            break
          }
        }
      }
      return out
    }
    return unknownSubcommand(request.prefix(0, 128), 'CONFIG')
  }

  const hello: RedisHandler = (request, ctx) => {
    const state = ctx.connectionState as ConnectionState
    let proto = 2
    if (request.argc > 0) {
      const n = asNumber(request.int(0))
      if (n === null) return Errors.protoVersion
      if (n !== 2) return Errors.noProto
      proto = n
      let name: string | null = null
      for (let i = 1; i < request.argc; i++) {
        if (request.is(i, 'setname') && i + 1 < request.argc) name = request.str(++i)
        else if (request.is(i, 'auth') && i + 2 < request.argc) i += 2
        else return error(`ERR Syntax error in HELLO option '${oneLine(request.prefix(i, 128))}'`)
      }
      // Checked as CLIENT SETNAME checks it, once every option is known good (as Redis does).
      if (name !== null) {
        if (!validClientName(name)) return Errors.clientName
        state.name = name
      }
    }
    return ['server', 'redis', 'version', version, 'proto', proto, 'id', state.id, 'mode', 'standalone', 'role', 'master', 'modules', EMPTY_ARRAY]
  }

  return {
    PING: (request, ctx) => request.argc > 1
      ? arityError('ping')
      : (ctx.connectionState as ConnectionState).subscriptions !== null ? subscribedPing(request, ctx) : request.argc === 0 ? PONG : request.bytes(0),
    ECHO: request => request.bytes(0),
    INFO: info,
    COMMAND: command,
    CLIENT: client,
    SELECT: select,
    CONFIG: config,
    QUIT: (_request, ctx) => {
      ctx.closeConnection()
      return OK
    },
    HELLO: hello
  }
}
