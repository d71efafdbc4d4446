/**
 * A tiny test service for the cluster tests: `Pid` answers with the pid of
 * the reactor process that ran the call, so a test can tell reactors apart
 * without changing the demo service.
 */
import { ProtoSchema } from '../../codec/protobuf/schema.js'
import type { ServiceHandlers } from '../../reactor/krpc/server.js'

export type ReactorMethods = {
  Pid: { request: Record<string, never>, response: { pid: number } }
}

export const reactorSchema = ProtoSchema.parse(`
syntax = "proto2";
package nyala.test;
message PidRequest {}
message PidResponse { required uint32 pid = 1; }
service ReactorService { rpc Pid (PidRequest) returns (PidResponse); }
`)

export const ReactorService = reactorSchema.service<ReactorMethods>('nyala.test.ReactorService')

export const reactorHandlers: ServiceHandlers<ReactorMethods> = {
  Pid: () => ({ pid: process.pid })
}
