"""Mutual authentication over the side channel, and per-connection keys.

Both ends hold the same pre-shared key K. The exchange, before the receiver allocates anything:

1. sender -> receiver: hello with a fresh 16-byte nonce Nc;
2. receiver -> sender: a fresh nonce Ns and proof_r = HMAC(K, "mrc-v1 receiver" | T);
3. sender checks proof_r, answers proof_s = HMAC(K, "mrc-v1 sender" | T);
4. receiver checks proof_s; only then does it set up the connection.

T binds the nonces and both QP numbers (and whatever else the caller passes as context), so a
proof is worth nothing in another exchange: every exchange has two fresh nonces, one from each
side, and a recorded answer never matches a new challenge. Neither side learns anything that
helps a third party without K.

Session keys come from HKDF-SHA256(K, salt = Nc | Ns, info = "mrc-v1 keys" | T): per direction
a key id, a header key and a payload key (AES-128). Fresh nonces give fresh keys per connection.
The side channel after the exchange gets keys of its own per direction, from another HKDF info:
"mrc-v1 control" to authenticate its messages, "mrc-v1 sealed control" to seal them (encrypt
mode), so no key serves two algorithms.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mrc.security.packet import DirectionKeys

NONCE_LEN = 16
PROOF_LEN = 32
AES_KEY_LEN = 16


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_LEN)


def transcript(sender_nonce: bytes, receiver_nonce: bytes, context: bytes) -> bytes:
    """What both proofs and the key derivation are bound to (lengths fixed, no ambiguity)."""
    if len(sender_nonce) != NONCE_LEN or len(receiver_nonce) != NONCE_LEN:
        raise ValueError("handshake nonces must be 16 bytes")
    return sender_nonce + receiver_nonce + hashlib.sha256(context).digest()


def proof(key: bytes, role: str, transcript_: bytes) -> bytes:
    """The proof that ``role`` ("sender" or "receiver") holds ``key``."""
    if role not in ("sender", "receiver"):
        raise ValueError(role)
    return hmac.new(key, f"mrc-v1 {role}\0".encode() + transcript_, hashlib.sha256).digest()


def check_proof(key: bytes, role: str, transcript_: bytes, claimed: bytes) -> bool:
    return hmac.compare_digest(proof(key, role, transcript_), claimed)


def session_keys(key: bytes, transcript_: bytes) -> tuple[DirectionKeys, DirectionKeys]:
    """(sender-to-receiver, receiver-to-sender) keys of one connection."""
    per_dir = 4 + 2 * AES_KEY_LEN
    okm = HKDF(
        algorithm=hashes.SHA256(),
        length=2 * per_dir,
        salt=transcript_[: 2 * NONCE_LEN],
        info=b"mrc-v1 keys\0" + transcript_,
    ).derive(key)

    def take(at: int) -> DirectionKeys:
        chunk = okm[at : at + per_dir]
        return DirectionKeys(
            key_id=int.from_bytes(chunk[:4], "big"),
            header_key=chunk[4 : 4 + AES_KEY_LEN],
            payload_key=chunk[4 + AES_KEY_LEN :],
        )

    return take(0), take(per_dir)


CONTROL_KEY_LEN = 32


def control_keys(key: bytes, transcript_: bytes, sealed: bool = False) -> tuple[bytes, bytes]:
    """(sender-to-receiver, receiver-to-sender) keys that protect the side-channel messages
    after the handshake (welcome, verdicts, aborts): HMAC-SHA256 keys that authenticate them
    (a forged "ok" is then refused), or with ``sealed`` AES-256-GCM keys that also encrypt
    them (the hello's mode is ``encrypt``)."""
    label = b"mrc-v1 sealed control\0" if sealed else b"mrc-v1 control\0"
    okm = HKDF(
        algorithm=hashes.SHA256(),
        length=2 * CONTROL_KEY_LEN,
        salt=transcript_[: 2 * NONCE_LEN],
        info=label + transcript_,
    ).derive(key)
    return okm[:CONTROL_KEY_LEN], okm[CONTROL_KEY_LEN:]
