"""mrc-keygen: write a new pre-shared key file for authenticated (and encrypted) MRC.

Both ends of a connection need the same file (copy it over a channel you trust). The file is
created with mode 0600 and never replaces an existing file or follows a link.
"""

from __future__ import annotations

import argparse

from mrc.cli.common import Parser, emit_json, run_main
from mrc.security.keys import fingerprint, write_key_file

PROG = "mrc-keygen"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Write a new 32-byte pre-shared key to FILE (mode 0600; an existing file "
        "or a symbolic link is refused). Both ends of a connection need the same file: "
        "give it to mrc-recv and mrc-send as --key-file (docs/PROTOCOL.md section 11).",
    )
    p.add_argument("file", metavar="FILE", help="where to write the key")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        key = write_key_file(args.file)
        if args.json:
            emit_json({"file": args.file, "fingerprint": fingerprint(key)})
        else:
            print(f"wrote {args.file} (fingerprint {fingerprint(key)})")
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())
