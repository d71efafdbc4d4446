/**
 * `nyala/testing`: what tests of code built on nyala need. `FakeClock`
 * drives every timer of a server or client (deadlines, idle and frame
 * timeouts, retries) by hand: `advance(ms)` fires what falls due.
 *
 * @module nyala/testing
 */
export { FakeClock } from '../scheduling/clock.js'
