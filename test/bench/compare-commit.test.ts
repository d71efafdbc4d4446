/**
 * The hot-path guard's arithmetic: per-pair ratios of server CPU per call,
 * their median, and the pairs the working tree won.
 */
import t from 'tap'
import { summarise, type PairResult } from '../../bench/compare-commit.js'

const sample = (serverCpuUs: number, reqsPerSec = 100, clientCpuUs = 1): PairResult['work'] =>
  ({ serverCpuUs, serverUserUs: serverCpuUs / 2, reqsPerSec, clientCpuUs })
const pair = (work: number, base: number, first: 'work' | 'base' = 'work'): PairResult =>
  ({ first, work: sample(work, 100 / work, work), base: sample(base, 100 / base, base), ratio: work / base })

t.test('median of per-pair ratios, pairs won, and the other medians', async t => {
  // Ratios 0.9, 1.1, 1.2, 2.0 (a pair spoiled by a slow phase): median 1.15, one pair won.
  const s = summarise('abc', [pair(0.9, 1), pair(1.1, 1, 'base'), pair(1.2, 1), pair(4, 2, 'base')])
  t.equal(s.base, 'abc')
  t.equal(s.pairs.length, 4)
  t.equal(s.won, 1)
  t.ok(Math.abs(s.medianRatio - 1.15) < 1e-12)
  t.ok(Math.abs(s.medianUserRatio - 1.15) < 1e-12, 'user CPU halves on both sides: same ratios')
  t.ok(Math.abs(s.medianClientRatio - 1.15) < 1e-12)
  t.ok(Math.abs(s.medianReqsRatio - 1 / 1.15) < 0.01, 'calls/s moves the other way')
})

t.test('an odd number of pairs takes the middle one', async t => {
  const s = summarise('x', [pair(1.3, 1), pair(0.8, 1), pair(1, 1)])
  t.equal(s.medianRatio, 1)
  t.equal(s.won, 1, 'a tie is not a win')
})
