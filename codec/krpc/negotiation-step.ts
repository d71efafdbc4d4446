/**
 * The vocabulary both sides of KRPC negotiation share: the NegotiatePB
 * steps and feature flags, what a finished negotiation agreed on, the step
 * a state machine returns, and the frames and errors both sides build.
 * The state machines themselves are ServerNegotiation (server-negotiation.ts)
 * and ClientNegotiation (client-negotiation.ts).
 */
import { ErrorCode, RpcError } from '../errors.js'
import type { HandshakeStep } from '../protocol.js'
import { krpcStatus } from './codes.js'
import { encodeRequestFrame, encodeResponseFrame } from './encode-frame.js'
import { NEGOTIATE_CALL_ID, headerSchema } from './frames.js'

/**
 * KRPC connection negotiation as two pure state machines:
 * they take frames and return what to send and whether negotiation is done.
 * The connection that drives them owns the socket and the deadline.
 *
 *   client                         server
 *   preamble, NEGOTIATE(1)   ──▶
 *                            ◀──   NEGOTIATE(1): common features, the authentication chosen (SASL: PLAIN)
 *   TLS_HANDSHAKE(5)         ◀─▶   (both offered TLS) the TLS handshake's records, as tokens,
 *                                  until both sides are done; then TLS on the socket, unless both
 *                                  offered TLS_AUTHENTICATION_ONLY (loopback): then plain again
 *   SASL_INITIATE(2) PLAIN   ──▶   (SASL authentication; none with CERTIFICATE: the client's
 *                            ◀──   SASL_SUCCESS(0)   certificate authenticated it in the handshake)
 *   ConnectionContext (-3)   ──▶   (no reply)
 *
 * Any refusal is an error frame (FATAL_UNAUTHORIZED, ...) and the close.
 * With TLS 1.3 the server's last handshake bytes (session tickets) are not
 * sent as a token: they go out raw just before its first encrypted bytes.
 */

/** `RpcFeatureFlag` values. */
export const RpcFeature = {
  APPLICATION_FEATURE_FLAGS: 1,
  TLS: 2,
  TLS_AUTHENTICATION_ONLY: 3
} as const

/** `NegotiatePB.NegotiateStep` values. */
export const NegotiateStep = {
  SASL_SUCCESS: 0,
  NEGOTIATE: 1,
  SASL_INITIATE: 2,
  SASL_CHALLENGE: 3,
  SASL_RESPONSE: 4,
  TLS_HANDSHAKE: 5,
  TOKEN_EXCHANGE: 6,
  JWT_EXCHANGE: 7
} as const

/** The NegotiatePB message, as decoded. */
export interface NegotiatePB {
  supported_features?: number[]
  step: number
  token?: Uint8Array
  tls_handshake?: Uint8Array
  sasl_mechanisms?: Array<{ mechanism: string }>
  authn_types?: Array<{ sasl?: Record<string, never>, token?: object, certificate?: object, jwt?: object }>
}

/** The ConnectionContextPB message, as decoded. */
export interface ConnectionContextPB {
  DEPRECATED_user_info?: { effective_user?: string, real_user: string }
  encoded_nonce?: Uint8Array
}

/** Encodes and decodes NegotiatePB. */
export const NegotiateType = headerSchema.type<NegotiatePB>('kudu.rpc.NegotiatePB')
/** Encodes and decodes ConnectionContextPB. */
export const ConnectionContextType = headerSchema.type<ConnectionContextPB>('kudu.rpc.ConnectionContextPB')

/** What a finished negotiation agreed on. */
export interface Negotiated {
  /** Features both sides support. */
  features: ReadonlySet<number>
  /** The SASL PLAIN user (authcid), or the client certificate's CN under certificate authentication. */
  user: string
  /** How the client authenticated. */
  authentication: 'sasl' | 'certificate'
  /** The TLS version when the connection is encrypted ('TLSv1.3'); null in plain text (also after TLS that only authenticated). */
  tls: string | null
}

/**
 * One step of a negotiation: frames to send (each a list of slices), then
 * either nothing more (wait for the next frame), `done`, or `error`. With an
 * error the connection is closed after `send` is written. With `upgrade`
 * the connection switches to TLS after `send` (see HandshakeStep).
 */
export type NegotiationStep = HandshakeStep<Negotiated>

/** The features both sides know, in the order Kudu lists them. */
export function featuresOf (tls: boolean, authOnly: boolean): number[] {
  const features: number[] = [RpcFeature.APPLICATION_FEATURE_FLAGS]
  if (tls) features.push(RpcFeature.TLS)
  if (tls && authOnly) features.push(RpcFeature.TLS_AUTHENTICATION_ONLY)
  return features
}

/** A NegotiatePB frame: a response from the server, a request from the client. */
export function negotiateFrame (body: NegotiatePB, fromServer: boolean): Buffer[] {
  const bytes = NegotiateType.encode(body)
  return fromServer ? encodeResponseFrame(NEGOTIATE_CALL_ID, undefined, bytes) : encodeRequestFrame({ callId: NEGOTIATE_CALL_ID }, bytes)
}

/** A TLS_HANDSHAKE frame carrying one token of the TLS handshake. */
export function tlsFrame (token: Buffer, fromServer: boolean): Buffer[] {
  return negotiateFrame({ step: NegotiateStep.TLS_HANDSHAKE, tls_handshake: token }, fromServer)
}

/** A NEGOTIATION_FAILED error, with the KRPC code the peer sent or is sent. */
export function negotiationError (message: string, krpcCode?: number): RpcError {
  return new RpcError(ErrorCode.NEGOTIATION_FAILED, message, krpcCode === undefined ? undefined : { remote: krpcStatus(krpcCode) })
}

/** A host that is this machine: Kudu's loopback rule (TLS there may only authenticate). */
export function isLoopbackHost (host: string): boolean {
  const h = host.toLowerCase()
  return h === 'localhost' || h === '::1' || h === '[::1]' || /^127\./.test(h) || /^::ffff:127\./.test(h)
}
