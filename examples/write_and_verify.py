"""Write into a peer's memory and check it landed: the library's whole life cycle.

The receiver registers a buffer and listens; the sender connects (learning the buffer's rkey
and address), WRITEs into it, then WRITE_IMMs a marker whose completion at the receiver is
ordered after every byte before it. Prints one line ending in "ok".
"""

import asyncio
import hashlib
import os

import mrc


async def main() -> None:
    listener = await mrc.listen("::1", 0)
    inbox = bytearray(8 << 20)
    listener.register(inbox, name="inbox")
    conn = await mrc.connect("::1", listener.port, mrc.ConnectConfig(evs=32))
    peer = await listener.accept(timeout=5)
    data = os.urandom(6 << 20)
    region = conn.remote["inbox"]
    await conn.write(data[: 4 << 20], region, offset=0)
    await conn.write(data[4 << 20 :], region, offset=4 << 20, imm=0x600D)
    assert await peer.next_immediate(timeout=5) == 0x600D
    ok = hashlib.sha256(inbox[: len(data)]).digest() == hashlib.sha256(data).digest()
    evs_used = sum(1 for row in conn.ev_report() if row["packets"])
    print(f"wrote {len(data)} bytes over {evs_used} EVs: {'ok' if ok else 'MISMATCH'}")
    await conn.close()
    await listener.close()


if __name__ == "__main__":
    asyncio.run(main())
