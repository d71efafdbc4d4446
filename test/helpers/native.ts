import { NativeReactor, type NativeBackend } from '../../transport/native/reactor.js'

/** The native backends to test: each with its reactor, or the reason it is skipped (not built, io_uring denied). */
export function nativeBackends (): Array<{ backend: NativeBackend, reactor: NativeReactor | null, skip: string | false }> {
  return (['epoll', 'io_uring'] as NativeBackend[]).map((backend) => {
    const reactor = NativeReactor.open(backend)
    return typeof reactor === 'string'
      ? { backend, reactor: null, skip: `${backend} is not available: ${reactor}` }
      : { backend, reactor, skip: false }
  })
}
