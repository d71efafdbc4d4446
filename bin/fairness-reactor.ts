/**
 * A reactor process of `nyala fairness --reactors N` (a node:cluster
 * worker): builds the fairness server from the options the primary passed
 * as its one argument and serves until the primary closes it.
 */
import { serveFairness, type FairnessServerOptions } from './fairness-cluster.js'

const options = JSON.parse(process.argv[2] ?? '{}') as FairnessServerOptions
serveFairness(options).catch((err: unknown) => {
  process.stderr.write(`nyala fairness reactor: ${err instanceof Error ? err.message : String(err)}\n`)
  process.exitCode = 1
})
