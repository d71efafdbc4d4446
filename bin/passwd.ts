import { parseArgs } from 'node:util'
import { hashPassword } from '../reactor/krpc/password-file.js'

export const PASSWD_USAGE = `  nyala passwd USER
      Reads USER's password from stdin (one line; typed, it is not hidden)
      and prints USER:HASH, a scrypt hash, the line for the password file
      of nyala serve. Example: nyala passwd alice >> users.txt
`

/** The first line of `stream` without its line end, or null when it ends with nothing. */
async function readLine (stream: NodeJS.ReadStream): Promise<string | null> {
  return await new Promise<string | null>((resolve, reject) => {
    let text = ''
    const done = (line: string | null): void => {
      stream.off('data', onData)
      stream.off('end', onEnd)
      stream.off('error', onError)
      stream.pause()
      resolve(line === null ? null : line.replace(/\r$/, ''))
    }
    const onData = (chunk: Buffer | string): void => {
      text += chunk.toString()
      const end = text.indexOf('\n')
      if (end >= 0) done(text.slice(0, end))
    }
    const onEnd = (): void => { done(text === '' ? null : text) }
    const onError = (err: Error): void => { stream.off('data', onData); stream.off('end', onEnd); reject(err) }
    stream.on('data', onData)
    stream.once('end', onEnd)
    stream.once('error', onError)
  })
}

export async function passwd (args: string[]): Promise<number> {
  const { positionals } = parseArgs({ args, options: {}, allowPositionals: true, strict: true })
  if (positionals.length !== 1) {
    process.stderr.write('nyala passwd: expected one USER\n')
    return 2
  }
  const user = positionals[0]!
  // The password file's syntax: USER:HASH per line, '#' starts a comment, lines are trimmed.
  if (user === '' || user.includes(':') || /[\s\p{Cc}]/u.test(user) || user.startsWith('#')) {
    process.stderr.write(`nyala passwd: a user name may not be empty, hold ':', spaces or control characters, or start with '#': ${JSON.stringify(user)}\n`)
    return 2
  }
  if (process.stdin.isTTY === true) process.stderr.write(`password for ${user} (shown as typed): `)
  const password = await readLine(process.stdin)
  if (password === null || password === '') {
    process.stderr.write('nyala passwd: no password on stdin (one line)\n')
    return 2
  }
  process.stdout.write(`${user}:${await hashPassword(password)}\n`)
  return 0
}
