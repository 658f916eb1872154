"""The key handshake over the side channel, both roles (mrc/security/handshake.py computes).

With a pre-shared key the set-up becomes four messages instead of two::

    sender   -> receiver   hello, with auth = {nonce Nc, mode}
    receiver -> sender     challenge = {nonce Ns, proof_r}        (nothing allocated yet)
    sender   -> receiver   proof = proof_s                         (sender checked proof_r)
    receiver -> sender     welcome, with a MAC                     (receiver checked proof_s)

Both proofs bind the two nonces and the whole hello, so a recorded exchange replays nowhere
and a hello altered on the way fails. From the proof on, every side-channel message carries a
MAC (:meth:`ControlChannel.authenticate`), and the QP seals and checks every datagram with
keys derived from the same exchange (:class:`mrc.security.packet.Protection`).
"""

from __future__ import annotations

from mrc.errors import MRCError
from mrc.security.handshake import (
    check_proof,
    control_keys,
    new_nonce,
    proof,
    session_keys,
    transcript,
)
from mrc.security.packet import Mode, Protection
from mrc.transport.control import ControlChannel, ControlError
from mrc.transport.messages import AuthOffer, Challenge, Hello, Proof, Refusal, parse_challenge


def offer(mode: Mode) -> AuthOffer:
    """The ``auth`` part of a keyed sender's hello (a fresh nonce)."""
    return AuthOffer(new_nonce().hex(), mode.value)


async def as_receiver(
    control: ControlChannel,
    key: bytes | None,
    hello: Hello,
    timeout: float,
    require_encrypt: bool = False,
) -> Protection | None:
    """Authenticate the sender of ``hello`` (or check that neither side uses a key).

    Returns the connection's protection (None without a key). Raises :class:`MRCError` with
    the one line the listener refuses the sender with.
    """
    if key is None:
        if hello.auth is not None:
            raise MRCError(
                "this receiver uses no key, the sender does (give both the same --key-file)"
            )
        return None
    if hello.auth is None:
        raise MRCError("this receiver requires a key (mrc-send --key-file with the same key)")
    mode = Mode(hello.auth.mode)
    if require_encrypt and mode is not Mode.ENCRYPT:
        raise MRCError("this receiver requires encryption (mrc-send --encrypt)")
    sender_nonce = bytes.fromhex(hello.auth.nonce)
    receiver_nonce = new_nonce()
    t = transcript(sender_nonce, receiver_nonce, hello.context())
    await control.send(Challenge(receiver_nonce.hex(), proof(key, "receiver", t).hex()).to_json())
    obj = await control.recv(timeout=timeout)
    if obj is None:
        raise ControlError("the sender closed the side channel during the key exchange")
    answer = Proof.from_json(obj)
    if not check_proof(key, "sender", t, bytes.fromhex(answer.proof)):
        raise MRCError("authentication failed: the sender does not hold this receiver's key")
    to_receiver, to_sender = control_keys(key, t)
    control.authenticate(send_key=to_sender, receive_key=to_receiver)
    data_to_receiver, data_to_sender = session_keys(key, t)
    return Protection(send=data_to_sender, receive=data_to_receiver, mode=mode)


async def as_sender(
    control: ControlChannel, key: bytes, hello: Hello, timeout: float
) -> Protection:
    """Answer the receiver's challenge to ``hello`` (already sent, with ``auth``)."""
    assert hello.auth is not None
    obj = await control.recv(timeout=timeout)
    if obj is None:
        raise ControlError("the receiver closed the side channel during the key exchange")
    reply = parse_challenge(obj)
    if isinstance(reply, Refusal):
        raise MRCError(f"connection refused by the receiver: {reply.error}")
    t = transcript(bytes.fromhex(hello.auth.nonce), bytes.fromhex(reply.nonce), hello.context())
    if not check_proof(key, "receiver", t, bytes.fromhex(reply.proof)):
        raise MRCError("authentication failed: the receiver does not hold our key")
    await control.send(Proof(proof(key, "sender", t).hex()).to_json())
    to_receiver, to_sender = control_keys(key, t)
    control.authenticate(send_key=to_receiver, receive_key=to_sender)
    data_to_receiver, data_to_sender = session_keys(key, t)
    return Protection(send=data_to_receiver, receive=data_to_sender, mode=Mode(hello.auth.mode))
