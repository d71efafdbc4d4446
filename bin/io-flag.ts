import { isIoOption, type IoOption } from '../transport/io.js'

/**
 * The `--io auto|io_uring|epoll|node` flag of the example servers (the
 * transport of plain TCP connections: ServerOptions.io). A bad value is a
 * RangeError with a one-line message (the commands print it and exit 2).
 */
export const IO_FLAG_OPTIONS = {
  io: { type: 'string' }
} as const

/** `--io`'s value, or undefined when it was not given (the server's default, auto). */
export function ioFromFlags (values: { io?: string | undefined }): IoOption | undefined {
  if (values.io === undefined) return undefined
  if (!isIoOption(values.io)) throw new RangeError(`--io must be auto, io_uring, epoll or node, got ${values.io}`)
  return values.io
}
