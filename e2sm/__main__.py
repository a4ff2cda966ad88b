"""`python -m e2sm`: read and write E2 payloads in the JSON form of `tests/vectors/README.md`.

    python -m e2sm decode KIND HEX        # JSON on stdout
    python -m e2sm encode KIND < JSON     # APER hex on stdout
    python -m e2sm kinds                  # every KIND

Errors go to stderr with exit status 1 (bad input) or 2 (bad usage).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from e2sm.errors import E2DecodeError, E2EncodeError
from e2sm.jsonform import decode_json, encode_json, kinds

# A hex argument or JSON document larger than this is refused before parsing (2x the payload cap).
MAX_TEXT = 512 * 1024


def main(argv: list[str] | None = None, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    parser = argparse.ArgumentParser(prog="python -m e2sm", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="decode APER hex of KIND, print JSON")
    d.add_argument("kind")
    d.add_argument("hex", help="the payload in hex ('-' reads it from stdin); spaces and a 0x prefix are ignored")
    e = sub.add_parser("encode", help="encode the JSON value of KIND read from stdin, print APER hex")
    e.add_argument("kind")
    sub.add_parser("kinds", help="list every supported KIND")
    args = parser.parse_args(argv)

    if args.command == "kinds":
        stdout.write("\n".join(kinds()) + "\n")
        return 0
    try:
        if args.command == "decode":
            text = stdin.read(MAX_TEXT + 1) if args.hex == "-" else args.hex
            value = decode_json(args.kind, _parse_hex(text))
            stdout.write(json.dumps(value, indent=2) + "\n")
        else:
            text = stdin.read(MAX_TEXT + 1)
            if len(text) > MAX_TEXT:
                raise E2EncodeError(f"input over {MAX_TEXT} characters")
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise E2EncodeError(f"stdin is not JSON: {exc}") from None
            stdout.write(encode_json(args.kind, value).hex() + "\n")
    except (E2DecodeError, E2EncodeError) as exc:
        print(f"e2sm {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


def _parse_hex(text: str) -> bytes:
    if len(text) > MAX_TEXT:
        raise E2DecodeError(f"input over {MAX_TEXT} characters")
    clean = "".join(text.split())
    if clean[:2].lower() == "0x":
        clean = clean[2:]
    try:
        return bytes.fromhex(clean)
    except ValueError:
        raise E2DecodeError(f"not hex: {clean[:40]!r}") from None


if __name__ == "__main__":
    sys.exit(main())
