/**
 * The gRPC side of `nyala bench`: @grpc/grpc-js serving and calling the demo
 * calculator.proto, loaded with @grpc/proto-loader. Both are devDependencies,
 * loaded only when `--against` names grpc.
 */
import { CALCULATOR_PROTO } from '../examples/calculator/index.js'

type Grpc = typeof import('@grpc/grpc-js')
type ServiceClientConstructor = import('@grpc/grpc-js').ServiceClientConstructor

/** @grpc/grpc-js and the calculator service definition, loaded with @grpc/proto-loader (devDependencies). */
export async function loadGrpc (): Promise<{ grpc: Grpc, service: import('@grpc/grpc-js').ServiceDefinition, clientConstructor: ServiceClientConstructor }> {
  let grpc: Grpc
  let protoLoader: typeof import('@grpc/proto-loader')
  try {
    grpc = await import('@grpc/grpc-js')
    protoLoader = await import('@grpc/proto-loader')
  } catch (err) {
    throw new Error(`the grpc system needs @grpc/grpc-js and @grpc/proto-loader (devDependencies: npm install --include=dev): ${(err as Error).message}`)
  }
  const definition = protoLoader.loadSync(CALCULATOR_PROTO, { keepCase: true, defaults: false })
  const loaded = grpc.loadPackageDefinition(definition) as unknown as { nyala: { demo: { CalculatorService: ServiceClientConstructor } } }
  const clientConstructor = loaded.nyala.demo.CalculatorService
  return { grpc, service: clientConstructor.service, clientConstructor }
}
