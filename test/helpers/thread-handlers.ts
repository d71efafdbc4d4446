/**
 * Handlers for the worker-thread tests, loaded inside each thread: the demo
 * handlers, with Echo keyed on its data to misbehave on purpose.
 */
import { threadId } from 'node:worker_threads'
import { ErrorCode, RpcError } from '../../codec/errors.js'
import { KrpcCode, krpcError } from '../../codec/krpc/codes.js'
import type { ServiceHandlers } from '../../reactor/krpc/server.js'
import { CalculatorService, calculatorHandlers, type CalculatorMethods, type EchoResponse } from '../../examples/calculator/index.js'

// The thread finds the ServiceDef among the module's exports by its fullName.
export { CalculatorService }

function untilAborted (signal: AbortSignal): Promise<EchoResponse> {
  return new Promise((resolve) => {
    const done = (): void => resolve({ data: `aborted: ${(signal.reason as RpcError).code}` })
    if (signal.aborted) done()
    else signal.addEventListener('abort', done, { once: true })
  })
}

export const handlers: ServiceHandlers<CalculatorMethods> = {
  ...calculatorHandlers,
  Echo: (request, ctx) => {
    switch (request.data) {
      case 'throw': throw new Error('boom in a thread')
      case 'reject': return Promise.reject(new Error('async boom in a thread'))
      case 'coded': throw krpcError(KrpcCode.ERROR_INVALID_REQUEST, 'ERROR_INVALID_REQUEST: bad x')
      case 'thread': return { data: String(threadId) }
      case 'remaining': return { data: String(ctx.remainingMs()) }
      case 'until-aborted': return untilAborted(ctx.signal)
      // Gives up when its signal aborts (the deadline), rejecting with the signal's reason.
      case 'gives-up': return new Promise<EchoResponse>((_resolve, reject) => {
        ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true })
      })
      case 'crash':
        // An exception outside any promise: the thread dies.
        setImmediate(() => { throw new Error('thread crashed on purpose') })
        return new Promise<EchoResponse>(() => {})
      case 'exit': process.exit(7)
      // eslint-disable-next-line no-fallthrough
      default: return { data: request.data }
    }
  }
}
