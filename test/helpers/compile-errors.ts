/**
 * The compiler's errors for one TypeScript source, as type tests need:
 * written to a temp file, checked with the project's strict settings, and
 * only that file's diagnostics returned (one message each).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import ts from 'typescript'

/** Compiles `source` alone (imports resolved as NodeNext) and returns its error messages. */
export function compileErrors (source: string): string[] {
  const dir = mkdtempSync(join(tmpdir(), 'nyala-types-'))
  try {
    const file = join(dir, 'case.ts')
    writeFileSync(file, source)
    const program = ts.createProgram([file], {
      target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext,
      strict: true, types: ['node'], skipLibCheck: true, noEmit: true, allowImportingTsExtensions: true
    })
    return ts.getPreEmitDiagnostics(program).filter(d => d.file?.fileName === file).map(d => ts.flattenDiagnosticMessageText(d.messageText, '\n'))
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
