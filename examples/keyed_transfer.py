"""Keys keep strangers out: authenticated, encrypted WRITEs, and a stranger refused.

Both ends hold the same 32-byte key (``mrc-keygen FILE`` writes one; here it is made in
memory). They prove it to each other before the receiver allocates anything, and every packet
is then sealed. A sender with another key is refused with one line. Prints two lines.
"""

import asyncio
import hashlib
import os

import mrc
from mrc.security.keys import generate_key


async def main() -> None:
    key = generate_key()
    listener = await mrc.listen("::1", 0, mrc.ListenerConfig(key=key))
    inbox = bytearray(1 << 20)
    listener.register(inbox, name="inbox")
    try:
        await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=8, key=generate_key()))
    except mrc.MRCError as exc:
        print(f"stranger refused: {exc}")
    conn = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=8, key=key, encrypt=True))
    await listener.accept(timeout=5)
    data = os.urandom(1 << 20)
    await conn.write(data, conn.remote["inbox"])
    ok = hashlib.sha256(inbox).digest() == hashlib.sha256(data).digest()
    print(f"encrypted write of {len(data)} bytes: {'ok' if ok else 'MISMATCH'}")
    await conn.close()
    await listener.close()


if __name__ == "__main__":
    asyncio.run(main())
