/**
 * The command table: each command's route name (upper case), Redis's name
 * for it in errors (lower case) and its arity in Redis's convention (the
 * command name counted; negative: at least that many). `commandOf` finds a
 * command from its name's bytes, ignoring ASCII case, without making a
 * string. One internal route has a name no client can send: an unknown
 * command.
 */
export class Command {
  /** The route name: the command in upper case, or `#unknown` for the internal route. */
  readonly method: string
  /** Redis's name in errors (`get`). */
  readonly name: string
  readonly arity: number
  constructor (name: string, arity: number, method = name.toUpperCase()) {
    this.name = name
    this.arity = arity
    this.method = method
  }
}

/** Every command this server knows: name and arity, as Redis's command table has them. */
export const COMMANDS: readonly Command[] = ([
  ['ping', -1], ['echo', 2], ['set', -3], ['get', 2], ['getset', 3], ['del', -2], ['exists', -2],
  ['incr', 2], ['incrby', 3], ['decr', 2], ['decrby', 3], ['append', 3], ['strlen', 2], ['mget', -2], ['mset', -3],
  ['expire', -3], ['pexpire', -3], ['ttl', 2], ['pttl', 2], ['persist', 2], ['keys', 2], ['dbsize', 1],
  ['flushdb', -1], ['flushall', -1], ['type', 2],
  ['lpush', -3], ['rpush', -3], ['lpop', -2], ['rpop', -2], ['lrange', 4], ['llen', 2],
  ['sadd', -3], ['spop', -2], ['smembers', 2], ['scard', 2],
  ['hset', -4], ['hget', 3], ['hdel', -3], ['hgetall', 2],
  ['zadd', -4], ['zpopmin', -2], ['zrange', -4], ['zcard', 2],
  ['info', -1], ['command', -1], ['client', -2], ['select', 2], ['config', -2], ['quit', -1], ['hello', -1],
  ['subscribe', -2], ['unsubscribe', -1], ['psubscribe', -2], ['punsubscribe', -1], ['publish', 3], ['pubsub', -2], ['reset', 1]
] as const).map(([name, arity]) => new Command(name, arity))

export type CommandName = Uppercase<(typeof COMMANDS)[number]['name']>

export const UNKNOWN_COMMAND = new Command('#unknown', -1, '#unknown')

const BY_LENGTH: Command[][] = []
for (const command of COMMANDS) (BY_LENGTH[command.name.length] ??= []).push(command)

/** The command named by buf[start, end), ignoring ASCII case; null when there is none. */
export function commandOf (buf: Uint8Array, start: number, end: number): Command | null {
  const candidates = BY_LENGTH[end - start]
  if (candidates === undefined) return null
  for (let c = 0; c < candidates.length; c++) {
    const name = candidates[c]!.name
    let k = 0
    for (; k < name.length; k++) {
      let b = buf[start + k]!
      if (b >= 0x41 && b <= 0x5a) b |= 0x20
      if (b !== name.charCodeAt(k)) break
    }
    if (k === name.length) return candidates[c]!
  }
  return null
}
