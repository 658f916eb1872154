"""The security sublayer: pre-shared keys, mutual authentication, protected datagrams.

MRC itself specifies no security; this follows the shape of UET's TSS (a key id and an AEAD tag
per packet, a nonce per packet, keys per connection and direction). Without a key mrc behaves
as plain MRC, and anyone who can send to the receiver's port can write into registered memory.
See docs/PROTOCOL.md section 11 for the layout and the threat model.

This package needs ``cryptography``; the sans-IO core does not import it.
"""
