"""The key handshake over the side channel, both roles (mrc/security/handshake.py computes).

With a pre-shared key the set-up becomes four messages instead of two::

    sender   -> receiver   hello, with auth = {nonce Nc, mode}
    receiver -> sender     challenge = {nonce Ns, proof_r}        (nothing allocated yet)
    sender   -> receiver   proof = proof_s                         (sender checked proof_r)
    receiver -> sender     welcome, with a MAC                     (receiver checked proof_s)

Both proofs bind the two nonces and the whole hello, so a recorded exchange replays nowhere
and a hello altered on the way fails. From the proof on, every side-channel message carries a
MAC (:meth:`ControlChannel.authenticate`), or in encrypt mode travels sealed
(:meth:`ControlChannel.seal`), and the QP seals and checks every datagram with keys derived
from the same exchange (:class:`mrc.security.packet.Protection`).

In encrypt mode the hello leaves out its region request (a file's name and size): the sender
sends it sealed, as its first message after the proof (:class:`SealedRequest`).
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
from mrc.transport.messages import (
    AuthOffer,
    Challenge,
    Hello,
    Proof,
    Refusal,
    RegionRequest,
    SealedRequest,
    parse_challenge,
)


def offer(mode: Mode) -> AuthOffer:
    """The ``auth`` part of a keyed sender's hello (a fresh nonce)."""
    return AuthOffer(new_nonce().hex(), mode.value)


def sealed(hello: Hello) -> bool:
    """Whether the side channel after ``hello``'s key exchange is sealed (encrypt mode)."""
    return hello.auth is not None and hello.auth.mode == Mode.ENCRYPT.value


def _protect(control: ControlChannel, key: bytes, t: bytes, hello: Hello, sender: bool) -> None:
    """Authenticate (or, in encrypt mode, seal) the side channel with keys of this exchange."""
    to_receiver, to_sender = control_keys(key, t, sealed=sealed(hello))
    send, receive = (to_receiver, to_sender) if sender else (to_sender, to_receiver)
    if sealed(hello):
        control.seal(send_key=send, receive_key=receive)
    else:
        control.authenticate(send_key=send, receive_key=receive)


async def as_receiver(
    control: ControlChannel,
    key: bytes | None,
    hello: Hello,
    timeout: float | None,
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
    _protect(control, key, t, hello, sender=False)
    data_to_receiver, data_to_sender = session_keys(key, t)
    return Protection(send=data_to_sender, receive=data_to_receiver, mode=mode)


async def request_of(
    control: ControlChannel, hello: Hello, timeout: float | None
) -> RegionRequest | None:
    """The region the sender of ``hello`` asks for: in the hello, or in encrypt mode in its
    first sealed message (``hello`` is authenticated by then)."""
    if not sealed(hello):
        return hello.request
    obj = await control.recv(timeout=timeout)
    if obj is None:
        raise ControlError("the sender closed the side channel during the key exchange")
    return SealedRequest.from_json(obj).request


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
        raise reply.exception()
    t = transcript(bytes.fromhex(hello.auth.nonce), bytes.fromhex(reply.nonce), hello.context())
    if not check_proof(key, "receiver", t, bytes.fromhex(reply.proof)):
        raise MRCError("authentication failed: the receiver does not hold our key")
    await control.send(Proof(proof(key, "sender", t).hex()).to_json())
    _protect(control, key, t, hello, sender=True)
    data_to_receiver, data_to_sender = session_keys(key, t)
    return Protection(send=data_to_receiver, receive=data_to_sender, mode=Mode(hello.auth.mode))


async def send_request(
    control: ControlChannel, hello: Hello, request: RegionRequest | None
) -> None:
    """In encrypt mode, the region request ``hello`` left out, sealed (after :func:`as_sender`)."""
    if sealed(hello):
        await control.send(SealedRequest(request).to_json())
