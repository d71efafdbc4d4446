// A run's result as text.
import type { FuzzResult } from './options.js'

/** KiB as MiB with one decimal. */
export function mib (kib: number): string {
  return `${(kib / 1024).toFixed(1)} MiB`
}

/** The report of a run, as the CLI prints it. */
export function formatResult (r: FuzzResult): string {
  const n = (x: number): string => x.toLocaleString('en-US')
  const lines = [
    `nyala fuzz: seed ${r.seed}, ${n(r.mutants.total)} mutants (server: ${n(r.mutants.serverFrames)} frames + ${n(r.mutants.negotiation)} handshakes; client: ${n(r.mutants.client)} answers), ${(r.wallMs / 1000).toFixed(1)} s${r.stoppedEarly ? ' (stopped early)' : ''}`,
    `crashes: ${r.crashes.count}${r.crashes.details.map(d => `\n  ${d}`).join('')}`,
    `server (${r.server.mode}): ${n(r.server.episodes)} connections, ${n(r.server.batches)} batches; calls answered exactly once ${n(r.server.callsAnsweredOnce)} of ${n(r.server.callsPredicted)} predicted ` +
      `(${n(r.server.answersDroppedAtClose)} dropped with a connection closed for a bad frame of the same read); a normal Add answered after the run: ${r.server.answersAfterRun ? 'yes' : 'NO'}`,
    `  closed as predicted ${n(r.server.closedAsPredicted)}, closed while waiting for bytes ${n(r.server.closedWhileWaiting)}; bad frames closed ${n(r.server.badFramesClosed)} (model ${n(r.server.badFramesModel)}); ` +
      `calls received ${n(r.server.callsReceived)} (model ${n(r.server.callsReceivedModel)}); unauthenticated calls ${n(r.server.unauthenticatedCalls)}`,
    `  normal Add probes ${n(r.server.probes.ok)} ok, ${n(r.server.probes.failed)} failed; at the end ${r.server.connectionsOpenAtEnd} connections open, ${r.server.callsInFlightAtEnd} calls in flight`,
    `client: ${n(r.client.calls)} calls over ${n(r.client.fakeConnections)} fake-server connections (${n(r.client.stalledClosed)} closed on a stalled frame), ` +
      `${n(r.client.clientsClosed)} clients closed mid-run; settled exactly once ${n(r.client.settledOnce)}, twice ${n(r.client.settledTwice)}, ` +
      `before returning ${n(r.client.settledBeforeReturn)}, never ${n(r.client.neverSettled)}; still work ${r.client.stillWork ? 'yes' : 'NO'}`,
    `  outcomes: ${Object.entries(r.client.outcomes).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${n(v)}`).join(', ')}`,
    `peak RSS: server ${mib(r.rss.serverPeakKiB)}${r.server.mode === 'in-process' ? ' (same process)' : ''}, fuzzer ${mib(r.rss.fuzzerPeakKiB)}; server RSS at the end ${mib(r.rss.serverEndBytes / 1024)}`,
    `CPU: server ${(r.cpuMs.server / 1000).toFixed(1)} s, fuzzer ${(r.cpuMs.fuzzer / 1000).toFixed(1)} s${r.server.mode === 'in-process' ? ' (one process)' : ''}`,
    `sockets open at the end: ${r.openSocketsAtEnd}`,
    `failures: ${r.failureCount}`
  ]
  for (const f of r.failures) {
    const where = f.episode !== undefined ? ` [seed ${f.seed} episode ${f.episode} batch ${f.batch}: --replay-episode ${f.episode} --seed ${f.seed}]` : f.connection !== undefined ? ` [seed ${f.seed} fake connection ${f.connection}]` : ''
    lines.push(`  ${f.kind}: ${f.detail}${where}`)
    if (f.bytesHex !== undefined) lines.push(`    bytes: ${f.bytesHex.slice(0, 600)}${f.bytesHex.length > 600 ? '…' : ''}`)
  }
  return lines.join('\n')
}
