/**
 * The executions of non-idempotent requests on one host, one id a line,
 * appended synchronously before the answer leaves: a process killed with
 * SIGKILL has written every execution whose answer anyone could have seen.
 */
import { appendFileSync, readFileSync } from 'node:fs'

/** The appending side, in a host process. */
export class ExecutionLog {
  readonly #path: string

  constructor (path: string) {
    this.#path = path
  }

  /** The request `id` ran here. */
  executed (id: string): void {
    appendFileSync(this.#path, `${id}\n`)
  }
}

/** Executions per id starting with `prefix`, summed over the hosts' log files (a missing file: none). */
export function countExecutions (paths: readonly string[], prefix = ''): Map<string, number> {
  const counts = new Map<string, number>()
  for (const path of paths) {
    let text = ''
    try {
      text = readFileSync(path, 'utf8')
    } catch {
      continue
    }
    for (const id of text.split('\n')) if (id !== '' && id.startsWith(prefix)) counts.set(id, (counts.get(id) ?? 0) + 1)
  }
  return counts
}
