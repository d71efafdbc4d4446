// Server side: episodes of raw connections, checked against the model.
import { connect, type Socket } from 'node:net'
import { RpcError } from '../../codec/errors.js'
import { FrameDecoder } from '../../codec/frame-decoder.js'
import { krpcFraming } from '../../codec/krpc/frames.js'
import { parseResponseFrame } from '../../codec/krpc/parsed-frame.js'
import { CLEAN_HANDSHAKE_BYTES, handshakeMutant } from './handshake-mutator.js'
import { type Expect, ServerModel, hex } from './model.js'
import { BATCH_TIMEOUT_MS, type FoundBug, type FuzzFailure, HOST } from './options.js'
import { RequestGen } from './request-mutator.js'
import { Rng, mix } from './rng.js'

/** One raw connection to the server: writes bytes, reads frames, matches them to what the model expects. */
class RawConn {
  readonly socket: Socket
  readonly written: Buffer[] = []
  writtenBytes = 0
  closed = false
  /** Predicted frames not received yet, by call id. */
  readonly pending = new Map<number, Expect[]>()
  pendingCount = 0
  /** Calls (not negotiation frames) answered as predicted, once each. */
  callsAnsweredOnce = 0
  readonly problems: string[] = []
  readonly #decoder = new FrameDecoder(krpcFraming, 64 * 1024 * 1024)
  #wake: (() => void) | null = null

  constructor (port: number, sockets: Set<Socket>) {
    this.socket = connect({ host: HOST, port, noDelay: true })
    sockets.add(this.socket)
    this.socket.on('error', () => {})
    this.socket.on('data', (chunk: Buffer) => {
      const error = this.#decoder.pushRanges(chunk, (buf, start, end) => { this.#frame(buf.subarray(start, end)) })
      if (error !== null) this.problems.push(`server sent an undecodable stream: ${error.message}`)
      this.#poke()
    })
    this.socket.on('close', () => {
      this.closed = true
      sockets.delete(this.socket)
      this.#poke()
    })
  }

  expect (items: readonly Expect[]): void {
    for (const e of items) {
      let list = this.pending.get(e.callId)
      if (list === undefined) this.pending.set(e.callId, list = [])
      list.push(e)
      this.pendingCount++
    }
  }

  write (bytes: Buffer): void {
    this.written.push(bytes)
    this.writtenBytes += bytes.length
    if (!this.closed) this.socket.write(bytes)
  }

  /** Resolves once `done()` holds or the connection closed, or false after `ms`. */
  async until (done: () => boolean, ms: number): Promise<boolean> {
    const deadline = Date.now() + ms
    while (!done() && !this.closed) {
      const left = deadline - Date.now()
      if (left <= 0) return false
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => { this.#wake = null; resolve() }, Math.min(left, 1000))
        this.#wake = () => { clearTimeout(timer); this.#wake = null; resolve() }
      })
    }
    return true
  }

  #poke (): void {
    this.#wake?.()
  }

  #frame (frame: Buffer): void {
    const parsed = parseResponseFrame(frame)
    if (parsed instanceof RpcError) {
      this.problems.push(`server sent a malformed frame: ${parsed.message}: ${hex(frame, 64)}`)
      return
    }
    const list = this.pending.get(parsed.header.call_id)
    const expected = list?.shift()
    if (expected === undefined) {
      this.problems.push(`unexpected frame for call id ${parsed.header.call_id} (${parsed.header.is_error === true ? 'error' : 'success'}): ${hex(frame, 64)}`)
      return
    }
    if (list!.length === 0) this.pending.delete(parsed.header.call_id)
    this.pendingCount--
    if (expected.callId >= 0) this.callsAnsweredOnce++
    const wrong = expected.check(parsed)
    if (wrong !== null) this.problems.push(wrong)
  }
}

/** The server side of a run: episodes, probes, and the tallies. */
export class ServerSide {
  readonly #seed: number
  readonly #port: number
  readonly #pool: Buffer
  readonly #foundBugs: ReadonlySet<FoundBug>
  readonly #fail: (f: FuzzFailure) => void
  readonly sockets = new Set<Socket>()
  mutantsFrames = 0
  mutantsNegotiation = 0
  episodes = 0
  batches = 0
  callsPredicted = 0
  callsAnsweredOnce = 0
  answersDroppedAtClose = 0
  closedAsPredicted = 0
  closedWhileWaiting = 0
  badFramesModel = 0
  callsAccepted = 0
  stopped = false
  /** Episodes running now (the suspects when the server crashes). */
  readonly inFlight = new Set<number>()
  /** Episodes that sent calls behind a refused SASL step (`refused-auth-pipelining`). */
  readonly refusalEpisodes: number[] = []

  constructor (seed: number, port: number, pool: Buffer, foundBugs: ReadonlySet<FoundBug>, fail: (f: FuzzFailure) => void) {
    this.#seed = seed
    this.#port = port
    this.#pool = pool
    this.#foundBugs = foundBugs
    this.#fail = fail
  }

  get mutants (): number {
    return this.mutantsFrames + this.mutantsNegotiation
  }

  /** Runs episodes `concurrency` at a time until `target` mutants were sent (or `stop()`). */
  async run (target: number, concurrency: number): Promise<void> {
    let next = 0
    const worker = async (): Promise<void> => {
      while (!this.stopped && this.mutants < target) {
        const index = next++
        try {
          await this.episode(index)
        } catch (err) {
          this.#fail({ kind: 'fuzzer error', detail: (err as Error).stack ?? String(err), seed: this.#seed, episode: index })
        }
      }
    }
    await Promise.all(Array.from({ length: concurrency }, worker))
  }

  stop (): void {
    this.stopped = true
  }

  /** Runs episode `index` (one connection: a handshake, then batches of frames, each checked against the model); resolves with the bytes it wrote. */
  async episode (index: number, trace?: (line: string) => void): Promise<Buffer> {
    this.inFlight.add(index)
    try {
      return await this.#episode(index, trace)
    } finally {
      this.inFlight.delete(index)
    }
  }

  async #episode (index: number, trace?: (line: string) => void): Promise<Buffer> {
    this.episodes++
    const rng = new Rng(mix(this.#seed, 0x5e7, index))
    const gen = new RequestGen(rng, this.#pool, this.#foundBugs)
    const model = new ServerModel()
    const conn = new RawConn(this.#port, this.sockets)
    const fail = (kind: string, detail: string, batch: number): void => {
      this.#fail({ kind, detail, seed: this.#seed, episode: index, batch, bytesHex: hex(Buffer.concat(conn.written)) })
    }
    let handshake: Buffer = CLEAN_HANDSHAKE_BYTES
    let pipelinedRefusal = false
    if (rng.chance(0.15)) {
      const mutant = handshakeMutant(gen, this.#foundBugs)
      handshake = mutant.bytes
      pipelinedRefusal = mutant.pipelinedRefusal
      // The calls that ride behind the refusal: the model ignores them, as the server must.
      if (pipelinedRefusal && this.refusalEpisodes.length < 20) this.refusalEpisodes.push(index)
      if (pipelinedRefusal) handshake = Buffer.concat([handshake, ...Array.from({ length: rng.range(1, 4) }, (_, i) => gen.clean(1000 + i))])
      this.mutantsNegotiation++
    }
    let pieces: Buffer[] = [handshake]
    // With known bugs on, calls may ride in the read of a refused SASL step (see ServerModel.feedUntilAuthenticated).
    const authAt = pipelinedRefusal ? -1 : model.feedUntilAuthenticated(handshake)
    if (authAt < 0) {
      if (pipelinedRefusal) model.feed(handshake)
    } else {
      conn.write(handshake.subarray(0, authAt))
      const answers = model.takeExpected()
      conn.expect(answers)
      await conn.until(() => conn.pendingCount === 0, BATCH_TIMEOUT_MS)
      for (const p of conn.problems.splice(0)) fail('wrong answer', p, -1)
      if (conn.pendingCount > 0 && !conn.closed) {
        fail('missing answers', `negotiation answers not received in ${BATCH_TIMEOUT_MS} ms`, -1)
        conn.socket.destroy()
        return Buffer.concat(conn.written)
      }
      model.feed(handshake.subarray(authAt))
      pieces = [handshake.subarray(authAt)]
    }
    const batches = rng.range(1, 4)
    // Most episodes mutate most frames; some few, so that connections live long with many calls on them.
    const mutationRate = rng.pick([0.75, 0.75, 0.75, 0.4, 0.1])
    let callId = 0
    let pieceExpect = model.takeExpected()
    batches: for (let batch = 0; batch < batches; batch++) {
      this.batches++
      // Each piece with the frames the server must send for it.
      const parts: Array<{ bytes: Buffer[], expect: Expect[], waiting: boolean, closes: boolean }> = [{ bytes: [], expect: [], waiting: false, closes: false }]
      const add = (bytes: Buffer, expect: Expect[]): void => {
        const part = parts[parts.length - 1]!
        part.bytes.push(bytes)
        part.expect.push(...expect)
      }
      for (const piece of pieces) add(piece, pieceExpect)
      pieces = []
      pieceExpect = []
      // Most of the time the piece that breaks the connection goes in a write of its own, once the
      // answers before it have come back: answers of the read that carries a bad frame are dropped
      // with the connection (which the server may do), and would go unchecked.
      const splitFatal = rng.chance(0.7)
      const frames = rng.range(1, 24)
      for (let k = 0; k < frames && !model.closed; k++) {
        let bytes: Buffer
        if (rng.chance(mutationRate)) {
          bytes = gen.mutant(callId++)
          this.mutantsFrames++
        } else {
          bytes = gen.clean(callId++)
        }
        const waiting = model.waiting
        model.feed(bytes)
        if (model.closed && splitFatal && parts[0]!.bytes.length > 0) {
          parts[0]!.waiting = waiting
          parts.push({ bytes: [], expect: [], waiting: false, closes: true })
        }
        add(bytes, model.takeExpected())
      }
      const last = parts[parts.length - 1]!
      last.closes = model.closed
      last.waiting = model.waiting
      last.expect.push(...model.takeExpected())
      for (const part of parts) {
        const verdict = await this.#sendPart(conn, part.bytes, part.expect, part.closes, part.waiting, rng, (kind, detail) => fail(kind, detail, batch), trace)
        if (verdict === 'stop') break batches
      }
      if (model.closed) break
    }
    this.callsAnsweredOnce += conn.callsAnsweredOnce
    this.badFramesModel += model.badFrames
    this.callsAccepted += model.accepted
    if (!conn.closed) {
      if (!model.closed && !model.waiting && rng.chance(0.03)) {
        // A graceful end: the server must close its side too.
        conn.socket.end()
        if (!await conn.until(() => false, BATCH_TIMEOUT_MS)) fail('not closed', 'the server kept a connection its peer ended', batches)
      }
      conn.socket.destroy()
    }
    trace?.(`episode ${index}: ${conn.writtenBytes} bytes written; model ${model.phase}${model.closeReason === '' ? '' : ` (${model.closeReason})`}`)
    return Buffer.concat(conn.written)
  }

  // Writes one part (in pieces, now and then), waits for its answers (and the close it must
  // cause), and judges: 'stop' when the connection is gone or a failure was found.
  async #sendPart (conn: RawConn, bytes: Buffer[], expected: Expect[], mustClose: boolean, waiting: boolean, rng: Rng,
    fail: (kind: string, detail: string) => void, trace?: (line: string) => void): Promise<'go' | 'stop'> {
    const data = Buffer.concat(bytes)
    if (data.length === 0 && expected.length === 0 && !mustClose) return 'go'
    // Expected before written: answers may come back between the pieces of a split write.
    this.callsPredicted += expected.filter(e => e.callId >= 0).length
    conn.expect(expected)
    if (rng.chance(0.1) && data.length > 1) {
      // In pieces, each in its own event-loop turn: frames and preambles split anywhere.
      const cuts = Array.from({ length: rng.range(1, 5) }, () => rng.range(1, data.length - 1)).sort((a, b) => a - b)
      let at = 0
      for (const cut of [...cuts, data.length]) {
        if (cut <= at) continue
        conn.write(data.subarray(at, cut))
        at = cut
        await new Promise<void>((resolve) => setImmediate(resolve))
      }
    } else {
      conn.write(data)
    }
    const settled = await conn.until(() => conn.pendingCount === 0 && (!mustClose || conn.closed), BATCH_TIMEOUT_MS)
    trace?.(`wrote ${data.length} bytes: ${expected.length} frames expected, ${conn.pendingCount} missing; must close ${mustClose}, model waiting ${waiting}; ` +
      `${conn.closed ? 'closed by the server' : 'open'}`)
    for (const p of conn.problems.splice(0)) fail('wrong answer', p)
    if (!settled) {
      if (conn.pendingCount > 0) fail('missing answers', `${conn.pendingCount} predicted frames not received in ${BATCH_TIMEOUT_MS} ms: ${whatPending(conn)}`)
      else fail('not closed', 'the server kept a connection that must be closed')
      return 'stop'
    }
    if (!conn.closed) return 'go'
    const pending = [...conn.pending.values()].reduce((n, l) => n + l.filter(e => e.callId >= 0).length, 0)
    if (mustClose) {
      this.closedAsPredicted++
      // Answers of the read that carried the bad frame may be dropped with the connection (as in Kudu).
      this.answersDroppedAtClose += pending
    } else if (waiting) {
      this.closedWhileWaiting++
      this.answersDroppedAtClose += pending
    } else {
      fail('unexpected close', `the server closed a connection the model keeps open (${conn.pendingCount} answers missing: ${whatPending(conn)})`)
    }
    return 'stop'
  }
}

function whatPending (conn: RawConn): string {
  return [...conn.pending.values()].flat().slice(0, 3).map(e => e.what).join('; ')
}
