"""mrc: Multipath Reliable Connection in userspace Python."""
