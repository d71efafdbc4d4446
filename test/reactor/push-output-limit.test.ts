// The push output limit's verdicts, judged directly: hard, soft for too
// long, and (with the server's outbound budget exceeded) soft at once, so
// that N subscribers that do not read cost the budget, not N × the hard limit.
import t from 'tap'
import type { ServerProtocol } from '../../codec/protocol.js'
import { ServerContext } from '../../reactor/server-context.js'
import { PushOutputLimit } from '../../reactor/push-output-limit.js'
import { silentLogger } from '../../reactor/index.js'
import { FakeClock } from '../../reactor/testing.js'

const protocol = { name: 'toy' } as unknown as ServerProtocol
const MiB = 1024 * 1024

t.test('over the soft limit while the outbound budget is exceeded: closed at once (budget); under it, or within budget, as before', async (t) => {
  const clock = new FakeClock()
  const ctx = new ServerContext(protocol, { clock, logger: silentLogger })
  let over = false
  const limit = new PushOutputLimit(ctx, { hardBytes: 32 * MiB, softBytes: 8 * MiB, softMs: 60_000 }, () => over)
  const record = { pushed: true, softSince: -1 }
  t.equal(limit.judge(record, 9 * MiB, 0), null, 'above soft, within budget: it may stay for softMs')
  t.equal(limit.judge(record, 9 * MiB, 1000), null)
  over = true
  t.equal(limit.judge(record, 9 * MiB, 2000), 'budget', 'above soft while the budget is exceeded: closed at once')
  t.equal(limit.judge({ pushed: true, softSince: -1 }, 4 * MiB, 2000), null, 'below soft: never closed for the budget')
  t.equal(limit.judge({ pushed: true, softSince: -1 }, 33 * MiB, 2000), 'hard', 'past hard: hard, whatever the budget')
  over = false
  t.equal(limit.judge(record, 9 * MiB, 61_000), 'soft', 'within budget: soft after softMs, as before')
  const noSoft = new PushOutputLimit(ctx, { hardBytes: 32 * MiB, softBytes: 0 }, () => true)
  t.equal(noSoft.judge({ pushed: true, softSince: -1 }, 20 * MiB, 0), null, 'softBytes 0 turns the budget rule off too')
})
