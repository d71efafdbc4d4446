/** A handler module for CalculatorService that lacks Echo: loading it in a thread must fail. */
import { CalculatorService, calculatorHandlers } from '../../examples/calculator/index.js'

export { CalculatorService }
export const handlers = { ...calculatorHandlers, Echo: undefined }
