/**
 * Run as a child process by `largeRequestsCrash()`: one call whose request
 * sidecars are too big to be copied inline (> 16 KiB), so the transfer
 * queue writes them as separate slices with a completion callback. Prints
 * the outcome and exits 0; an uncaught exception exits non-zero.
 */
import { Client } from '../../reactor/client.js'
import { Server } from '../../reactor/server.js'
import { CalculatorService, calculatorDef, calculatorHandlers } from './reactor-harness.js'

const server = new Server().addService(CalculatorService, calculatorHandlers)
const { port } = await server.listen(0)
const endpoint = `127.0.0.1:${port}`
const client = new Client({ endpoint })
try {
  const { response } = await client.call(endpoint, calculatorDef, 'PushStrings', { sidecar_indexes: [0] }, { sidecars: [Buffer.alloc(64 * 1024, 1)], timeoutMs: 5000 })
  process.stdout.write(`ok ${JSON.stringify(response)}\n`)
} finally {
  client.close()
  await server.close({ graceMs: 0 })
}
