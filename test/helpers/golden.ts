/**
 * A byte-exact KRPC transcript: negotiation, then `Add` on Kudu's sample
 * service kudu.rpc.GenericCalculatorService, its answer, a TOO_BUSY error
 * and a response with two sidecars (docs/wire-format.md annotates them).
 */
import { hex } from './bytes.js'

export const PREAMBLE = hex('68 72 70 63 09 00 00')
export const C_NEGOTIATE = hex('00 00 00 15 0b 18 df ff ff ff ff ff ff ff ff 01 08 08 01 10 01 3a 02 0a 00')
export const S_NEGOTIATE = hex('00 00 00 1e 0b 08 df ff ff ff ff ff ff ff ff 01 11 08 01 10 01 22 07 12 05 50 4c 41 49 4e 3a 02 0a 00')
export const C_SASL_INITIATE = hex('00 00 00 20 0b 18 df ff ff ff ff ff ff ff ff 01 13 10 02 1a 06 00 75 73 65 72 00 22 07 12 05 50 4c 41 49 4e')
export const S_SASL_SUCCESS = hex('00 00 00 0f 0b 08 df ff ff ff ff ff ff ff ff 01 02 10 00')
export const C_CONNECTION_CONTEXT = hex('00 00 00 15 0b 18 fd ff ff ff ff ff ff ff ff 01 08 12 06 12 04 75 73 65 72')
export const C_ADD = hex('00 00 00 35 | 2f 18 00 32 28 0a 21 "kudu.rpc.GenericCalculatorService" 12 03 "Add" 50 90 4e | 04 08 01 10 02')
export const S_ADD_RESPONSE = hex('00 00 00 08 04 08 00 10 00 02 08 03')
export const S_TOO_BUSY = hex('00 00 00 0e 04 08 00 10 01 08 0a 04 62 75 73 79 10 04')
export const S_TWO_SIDECARS = hex('00 00 00 13 08 08 07 10 00 18 04 18 07 09 08 00 10 01 61 62 63 64 65')

/** Client→server frames of the transcript, in order. */
export const CLIENT_FRAMES: readonly Buffer[] = [C_NEGOTIATE, C_SASL_INITIATE, C_CONNECTION_CONTEXT, C_ADD]
/** Server→client frames of the transcript, in order. */
export const SERVER_FRAMES: readonly Buffer[] = [S_NEGOTIATE, S_SASL_SUCCESS, S_ADD_RESPONSE, S_TOO_BUSY, S_TWO_SIDECARS]
