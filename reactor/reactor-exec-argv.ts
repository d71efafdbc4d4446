/**
 * The Node options a reactor process inherits from the primary (node:cluster
 * forks run a script, not the primary's `--eval` code).
 */

/** True for `-e`, `--eval`, `-p`, `--print` and their `=` forms. */
export function isEvalFlag (arg: string): boolean {
  return arg === '-e' || arg === '--eval' || arg === '-p' || arg === '--print' || arg.startsWith('--eval=') || arg.startsWith('--print=')
}

/** This process's Node options for a reactor that runs a script: the loaders stay, `--eval CODE` and `--input-type` go. */
export function reactorExecArgv (execArgv: readonly string[]): string[] {
  const out: string[] = []
  for (let i = 0; i < execArgv.length; i++) {
    const arg = execArgv[i]!
    if (arg === '-e' || arg === '--eval' || arg === '-p' || arg === '--print' || arg === '--input-type') {
      i++
      continue
    }
    if (isEvalFlag(arg) || arg.startsWith('--input-type=')) continue
    out.push(arg)
  }
  return out
}
