/**
 * A chat server on nyala's generic protocol server, to show pushes,
 * groups and filters in a hundred lines:
 *
 *   node dist/examples/chat/main.js [--port 7380] [--host 127.0.0.1] [--rate 10] [--address-rate 100]
 *     [--io auto|io_uring|epoll|node]
 *
 * One command per line: `NICK name`, `JOIN room`, `LEAVE room`,
 * `SAY room text` (answered with how many members received it) and
 * `WHO room`. Members of a room receive `> room nick: text` lines, pushed
 * between the answers of their own commands. A nick belongs to one
 * connection at a time: taking one in use is answered
 * `-ERR nick NAME is in use`, and it is free again once its connection
 * changes it or closes.
 *
 * Two rate limits, both by what a peer cannot choose (a nick it can):
 * each connection may send `--rate` commands a second (default 10), and
 * all the connections from one peer address `--address-rate` a second
 * together (default 100), so opening more connections does not buy more.
 * The rest are answered `-ERR rate limited` (over the connection's limit)
 * or `-ERR rate limited (address)` by a filter, without reaching a
 * handler. Prints `listening on HOST:PORT` once it serves, then `io: BACKEND` (the transport).
 */
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import { ConnectionGroup, ProtocolServer, type CallContext, type ConnectionHandle, type ServerProtocol } from '../../reactor/index.js'
import { rateLimit } from './rate-limit.js'
import { IO_FLAG_OPTIONS, ioFromFlags } from '../../bin/io-flag.js'
import type { IoOption } from '../../transport/io.js'

const NEWLINE = 0x0a
const MAX_LINE = 4096

/** Per connection: the nick, the rooms joined, and whether its close is watched (to free them). */
interface ChatState { nick: string, rooms: Set<string>, watched: boolean }

export const chatProtocol: ServerProtocol<string[], string> = {
  name: 'chat',
  ordering: 'in-order',
  maxFrameBytes: MAX_LINE,
  framing: {
    scanner: () => ({
      scan: (buf, start, end) => { const at = buf.indexOf(NEWLINE, start); return at >= 0 && at < end ? at + 1 - start : 0 },
      reset: () => {}
    })
  },
  connectionState: (): ChatState => ({ nick: '', rooms: new Set(), watched: false }),
  decodeHead (buf, start, end, head) {
    const words = buf.toString('utf8', start, end - 1).trim().split(/\s+/)
    head.service = 'chat'
    head.method = words[0]!.toUpperCase()
    head.data = words.slice(1)
    head.skip = words[0] === ''
    return null
  },
  decodeRequest: (_route, _buf, head) => head.data as string[],
  encode (_call, answer, out) {
    const at = out.reserve(Buffer.byteLength(answer) + 1)
    out.buffer.write(`${answer}\n`, at)
  },
  encodePush (line, out) {
    const text = `> ${String(line)}\n`
    const at = out.reserve(Buffer.byteLength(text))
    out.buffer.write(text, at)
  },
  refusal: (_call, reason, message) => [Buffer.from(`-ERR ${reason}: ${message.split('\n')[0]}\n`)]
}

/** Default commands per connection per second (`--rate`). */
export const DEFAULT_CHAT_RATE = 10
/** Default commands per peer address per second, all its connections together (`--address-rate`). */
export const DEFAULT_CHAT_ADDRESS_RATE = 100

export interface ChatServerOptions {
  /** Commands per connection per second; default 10. */
  rate?: number
  /** Commands per peer address per second, all its connections together; default 100. */
  addressRate?: number
  /** The rate limit's clock (tests); default Date.now. */
  now?: () => number
  /** The transport (`ServerOptions.io`); default auto. */
  io?: IoOption | undefined
}

/** The chat server: rooms, nicks and the two rate limits of the module comment; `listen` to serve. */
export function chatServer (options: ChatServerOptions = {}): ProtocolServer {
  const rooms = new Map<string, ConnectionGroup>()
  // Nick → the connection that holds it: one holder at a time.
  const nicks = new Map<string, ConnectionHandle>()
  const stateOf = (ctx: CallContext): ChatState => ctx.connectionState as ChatState
  const nickOf = (ctx: CallContext): string => stateOf(ctx).nick || ctx.remoteAddress
  // Once per connection that took a nick or joined a room: its close frees them. The groups drop a
  // closed member themselves; rooms left empty by it, and its nick, are forgotten here.
  const watch = (ctx: CallContext): void => {
    const state = stateOf(ctx)
    if (state.watched) return
    state.watched = true
    const connection = ctx.connection
    connection.once('close', () => {
      for (const name of state.rooms) if (rooms.get(name)?.size === 0) rooms.delete(name)
      if (nicks.get(state.nick) === connection) nicks.delete(state.nick)
    })
  }
  const server = new ProtocolServer(chatProtocol, { io: options.io, idleTimeoutMs: 0, pushOutputLimit: { hardBytes: 1024 * 1024, softBytes: 256 * 1024, softMs: 10_000 } })
  server.use(rateLimit({
    callsPerConnection: options.rate ?? DEFAULT_CHAT_RATE,
    callsPerAddress: options.addressRate ?? DEFAULT_CHAT_ADDRESS_RATE,
    windowMs: 1000,
    now: options.now,
    refuse: (by) => by === 'connection' ? '-ERR rate limited' : '-ERR rate limited (address)'
  }))
  server.addRoutes('chat', {
    NICK: ([nick]: string[], ctx: CallContext) => {
      if (nick === undefined || !/^\w{1,32}$/.test(nick)) return '-ERR a nick is 1 to 32 letters, digits or _'
      const holder = nicks.get(nick)
      if (holder !== undefined && holder !== ctx.connection && !holder.isClosed) return `-ERR nick ${nick} is in use`
      const state = stateOf(ctx)
      if (state.nick !== '' && nicks.get(state.nick) === ctx.connection) nicks.delete(state.nick)
      nicks.set(nick, ctx.connection)
      state.nick = nick
      watch(ctx)
      return 'OK'
    },
    JOIN: ([room]: string[], ctx: CallContext) => {
      if (room === undefined) return '-ERR JOIN needs a room'
      let group = rooms.get(room)
      if (group === undefined) rooms.set(room, group = new ConnectionGroup())
      group.add(ctx.connection)
      stateOf(ctx).rooms.add(room)
      watch(ctx)
      return `joined ${room} (${group.size})`
    },
    LEAVE: ([room]: string[], ctx: CallContext) => {
      const group = room === undefined ? undefined : rooms.get(room)
      if (group === undefined || !group.delete(ctx.connection)) return '-ERR not in that room'
      stateOf(ctx).rooms.delete(room!)
      if (group.size === 0) rooms.delete(room!)
      return 'OK'
    },
    SAY: ([room, ...words]: string[], ctx: CallContext) => {
      const group = room === undefined ? undefined : rooms.get(room)
      if (group === undefined || !group.has(ctx.connection)) return '-ERR join the room first'
      return String(group.send(`${room} ${nickOf(ctx)}: ${words.join(' ')}`, member => member !== ctx.connection))
    },
    WHO: ([room]: string[]) => {
      const group = room === undefined ? undefined : rooms.get(room)
      return group === undefined ? '' : [...group].map(member => (member.state as ChatState).nick || member.remoteAddress).join(' ')
    }
  })
  return server
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const { values } = parseArgs({
    options: {
      port: { type: 'string', default: '7380' },
      host: { type: 'string', default: '127.0.0.1' },
      rate: { type: 'string', default: String(DEFAULT_CHAT_RATE) },
      'address-rate': { type: 'string', default: String(DEFAULT_CHAT_ADDRESS_RATE) },
      ...IO_FLAG_OPTIONS
    }
  })
  const positive = (flag: string, text: string): number => {
    const n = Number(text)
    if (Number.isSafeInteger(n) && n >= 1) return n
    console.error(`--${flag} must be a positive integer, got ${text}`)
    process.exit(2)
  }
  let io: IoOption | undefined
  try {
    io = ioFromFlags(values)
  } catch (err) {
    console.error((err as Error).message)
    process.exit(2)
  }
  const server = chatServer({ rate: positive('rate', values.rate), addressRate: positive('address-rate', values['address-rate']), io })
  const address = await server.listen(Number(values.port), values.host)
  console.log(`listening on ${address.address}:${address.port}`)
  console.log(`io: ${server.stats().io}`)
  const stop = (): void => { void server.close({ graceMs: 1000 }).then(() => process.exit(0)) }
  process.once('SIGINT', stop)
  process.once('SIGTERM', stop)
}
