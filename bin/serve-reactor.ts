/**
 * The script a reactor process of `nyala serve --reactors N` runs (a
 * node:cluster worker): the same command line as the primary's, whose
 * `serveReactors` builds the server and listens in this process instead of
 * forking. A separate entry, because the primary may have been started
 * through the bin/nyala shim, from dist/, or from the TypeScript sources
 * with `--eval` (as the tests do), and none of those is a script to re-run.
 */
import { main } from './cli.js'

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code },
  (err: unknown) => {
    process.stderr.write(`nyala reactor: ${err instanceof Error && err.stack !== undefined ? err.stack : String(err)}\n`)
    process.exitCode = 1
  })
