"""SRv6: Segment Routing Header encoding and source-routed paths over a fabric."""

from .srh import IPV6_RECVRTHDR, IPV6_RTHDR, SegmentRoutingHeader, decode_srh, encode_srh

__all__ = ["IPV6_RECVRTHDR", "IPV6_RTHDR", "SegmentRoutingHeader", "decode_srh", "encode_srh"]
