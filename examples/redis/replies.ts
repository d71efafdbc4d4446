/**
 * The replies the commands of several data types share: Redis 7's error
 * replies word for word, made once, and the empty array.
 */
import { error, oneLine, type Reply, type RespRequest } from './resp.js'

/** Redis's error replies that more than one command gives. */
export const Errors = {
  wrongType: error('WRONGTYPE Operation against a key holding the wrong kind of value'),
  notInteger: error('ERR value is not an integer or out of range'),
  notFloat: error('ERR value is not a valid float'),
  syntax: error('ERR syntax error'),
  overflow: error('ERR increment or decrement would overflow'),
  decrementOverflow: error('ERR decrement would overflow'),
  notPositive: error('ERR value is out of range, must be positive'),
  dbIndex: error('ERR DB index is out of range'),
  noProto: error('NOPROTO unsupported protocol version'),
  protoVersion: error('ERR Protocol version is not an integer or out of range'),
  clientName: error('ERR Client names cannot contain spaces, newlines or special characters.')
} as const

const ARITY_ERRORS = new Map<string, Reply>()

/** `-ERR wrong number of arguments for 'name' command` (subcommands as `client|setname`). */
export function arityError (name: string): Reply {
  let reply = ARITY_ERRORS.get(name)
  if (reply === undefined) {
    reply = error(`ERR wrong number of arguments for '${name}' command`)
    ARITY_ERRORS.set(name, reply)
  }
  return reply
}

/** The empty array reply, shared (never written to). */
export const EMPTY_ARRAY: readonly Reply[] = Object.freeze([])

/** Redis's words for a command it does not have: the name and the first arguments, quoted. */
export function unknownCommand (request: RespRequest): Reply {
  // Only the bytes quoted are read (an argument may be 512 MiB).
  let args = ''
  for (let i = 1; i < request.argc && args.length < 128; i++) args += `'${request.prefix(i, 128 - args.length)}' `
  return error(`ERR unknown command '${request.prefix(0, 128)}', with args beginning with: ${args}`)
}

/** Redis's words for a subcommand `command` does not have. */
export function unknownSubcommand (sub: string, command: string): Reply {
  return error(`ERR unknown subcommand '${oneLine(sub).slice(0, 128)}'. Try ${command} HELP.`)
}
