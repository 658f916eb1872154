// SPDX-License-Identifier: GPL-2.0
/*
 * mrc packet trimming: a tc (cls_bpf, direct action) program for the *ingress* ports of a
 * fabric router.  See docs/FABRIC.md, "Trimming".
 *
 * For every IPv6 packet the router is about to forward it finds the egress port with
 * bpf_fib_lookup() and charges the packet to that port's *virtual queue*: a byte counter
 * drained at the port's configured rate (the rate tbf shapes the real queue with).  When a
 * packet would push the virtual queue over its limit (set below the real tbf queue's limit)
 * and the packet is an MRC data packet (UDP, possibly behind an SRv6 routing header or inside
 * an outer IPv6 header to a uSID container, whose payload starts with a BTH of opcode 0x0A
 * RDMA WRITE ONLY or 0x0B WRITE ONLY with immediate),
 * its payload is cut off: the packet keeps the Ethernet/IPv6(/SRH)/UDP headers and the first
 * 28 (0x0A) or 32 (0x0B) bytes of UDP payload, i.e. BTH + RETH (+ ImmDt), plus the 28-byte
 * security block when BTH byte 8 has S (0x40) set: its header ICV must survive the cut so the
 * receiver can authenticate the trimmed header (docs/PROTOCOL.md section 11).  The IPv6 payload
 * length (both headers' with IPv6-in-IPv6), UDP length and UDP checksum are rewritten and
 * BTH byte 4 gets TRIMMED (0x20), plus
 * LASTHOP (0x10) when the egress port faces the destination host.  Everything else passes
 * untouched (and may be tail-dropped by tbf).  The program never drops a packet.
 *
 * ECN: a packet that joins the virtual queue above the port's ECN threshold (ecn_limit) and
 * carries ECT(0) or ECT(1) in the IPv6 traffic class gets CE instead (no checksum covers the
 * traffic class; the UDP pseudo-header does not include it), except on a port that faces the
 * destination host: congestion there says nothing about the path (EGRESS_LASTHOP).  In
 * IPv6-in-IPv6 the inner header is marked as well: the receiving host's decapsulation
 * (seg6local End.DT6) hands the socket the inner header only.  Trimmed
 * headers and MRC control packets are never marked: they do not wait in the data queue.
 *
 * Priority band: on ports whose egress qdisc is an htb with a priority class (EGRESS_PRIO),
 * every packet charged to the port gets skb->priority = the htb class it belongs to:
 * PRIO_CLASS for trimmed headers and MRC control packets (ACK/NACK, probes), DATA_CLASS for
 * everything else.  htb takes skb->priority as the class id before any filter, and IPv6
 * forwarding keeps it (tests/fabric/test_fabric_signals.py checks that on this kernel).
 *
 * uSID routes (docs/FABRIC.md, "SRv6 uSID routes"): a packet whose outer destination starts
 * with this router's own micro-SID is not forwarded on that address but on the address the
 * kernel's End (next-csid) makes of it, the micro-SIDs after the 32-bit block shifted left by
 * 16 bits: the program looks that one up.
 *
 * One program instance (with its own maps) is loaded per router and attached to all of its
 * ports, so every port into one egress link charges the same virtual queue.  Ports run on
 * several CPUs at once: the queue state is protected by a bpf_spin_lock.
 *
 * Keep struct egress / struct rstats in step with mrc/lab/fabric/trim/maps.py.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define AF_INET6 10
#define NEXTHDR_ROUTING 43
#define NEXTHDR_IPV6 41
#define SRH_TYPE 4
#define NSEC_PER_SEC 1000000000ULL

#define OP_WRITE_ONLY 0x0A
#define OP_WRITE_ONLY_IMM 0x0B
#define BTH_TRIMMED 0x20
#define BTH_LASTHOP 0x10
#define KEEP_WRITE 28     /* BTH(12) + RETH(16) */
#define KEEP_WRITE_IMM 32 /* BTH(12) + RETH(16) + ImmDt(4) */
#define BTH_SECURE 0x40   /* BTH byte 8: a security block follows the headers */
#define SEC_BLOCK 28      /* key id (4) + counter (8) + header ICV (16) */
#define SEC_ICV 16        /* payload ICV at the end of a protected data packet */
#define KEEP_MAX (KEEP_WRITE_IMM + SEC_BLOCK)

#define EGRESS_LASTHOP 0x1 /* egress port faces the destination host */
#define EGRESS_TRIM 0x2    /* trim MRC data packets over the limit */
#define EGRESS_PRIO 0x4    /* the port's htb has a priority band: classify into it */

/* htb classes of a router port (mrc/lab/fabric/kernel.py, prio_band): TC_H_MAKE(1:, minor) */
#define PRIO_CLASS 0x00010010
#define DATA_CLASS 0x00010020

#define OP_ACK 0x11
#define OP_PROBE 0xC0
#define OP_PROBE_REPLY 0xC1
#define BTH_LEN 12
#define ACK_LEN 36   /* BTH + AETH + MRC ACK extension */
#define PROBE_LEN 24 /* BTH + probe extension */

/* IPv6 byte 1: the low four bits of the traffic class, then the flow label's top four; the
 * ECN field is the traffic class's low two bits */
#define IP6_ECN_SHIFT 4
#define ECN_MASK 0x3
#define ECN_CE 0x3

/* Per egress port (key: its ifindex in the router's namespace).  Written once by userspace
 * (rate, limits, flags; the rest zero), then updated under the lock by the program. */
struct egress {
	struct bpf_spin_lock lock;
	__u32 flags;        /* EGRESS_* */
	__u64 rate;         /* drain rate, bytes/s of L2 frames (as tbf counts them) */
	__u64 limit;        /* virtual queue limit, bytes: over it, MRC data packets are trimmed */
	__u64 hard_limit;   /* estimate of what the real (tbf) queue holds: over it, tbf drops */
	__u64 ecn_limit;    /* ECN threshold, bytes: over it, ECT packets are marked CE */
	__u64 backlog;      /* virtual queue, bytes, as of last_ns */
	__u64 last_ns;
	/* counters */
	__u64 pkts;         /* packets towards this port */
	__u64 bytes;        /* their bytes (as they arrived) */
	__u64 data_pkts;    /* of which trimmable MRC data packets */
	__u64 trimmed;      /* packets trimmed */
	__u64 trimmed_bytes;/* bytes cut off */
	__u64 over;         /* over the virtual limit, not trimmable, charged (tbf had room) */
	__u64 tail_drops;   /* over the hard limit, not trimmable: tbf will drop them (estimate) */
	__u64 errors;       /* trims that failed in a helper (packet passed whole) */
	__u64 max_backlog;  /* high-water mark of the virtual queue, bytes */
	__u64 ce_marked;    /* packets whose ECT was rewritten to CE */
	__u64 ect_pkts;     /* packets that arrived ECT(0)/ECT(1) (or CE) */
	__u64 prio_pkts;    /* packets put in the priority band */
};

/* Per router, per CPU (key 0). */
struct rstats {
	__u64 seen;        /* IPv6 packets inspected */
	__u64 not_fwd;     /* not forwarded (local, no route): ignored */
	__u64 no_port;     /* egress port without a virtual queue: ignored */
	__u64 gso;         /* GSO super-packets (charged whole, never trimmed) */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct egress);
} egress SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rstats);
} rstats SEC(".maps");

struct srh_fixed {
	__u8 nexthdr;
	__u8 hdrlen;     /* in 8-octet units, not counting the first 8 */
	__u8 type;
	__u8 segments_left;
	__u8 last_entry;
	__u8 flags;
	__u16 tag;
};

static __always_inline __u32 fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

static __always_inline __u32 sum_addr(const struct in6_addr *a)
{
	__u32 s = 0;
#pragma unroll
	for (int i = 0; i < 8; i++)
		s += a->in6_u.u6_addr16[i];
	return s;
}

/* What a uSID End with the next-csid flavour (32-bit block, 16-bit micro-SIDs) does to the
 * destination: the first micro-SID is consumed, the rest move up, zeros fill the end. */
static __always_inline void usid_shift(struct in6_addr *a)
{
#pragma unroll
	for (int i = 2; i < 7; i++)
		a->in6_u.u6_addr16[i] = a->in6_u.u6_addr16[i + 1];
	a->in6_u.u6_addr16[7] = 0;
}

/* A helper failed on a packet the program meant to change: it passes as it was. */
static __always_inline void count_error(struct egress *eg)
{
	bpf_spin_lock(&eg->lock);
	eg->errors++;
	bpf_spin_unlock(&eg->lock);
}

/* The kernel's route for a packet from ``src`` to ``dst`` arriving on this port. */
static __always_inline int egress_lookup(struct __sk_buff *skb, struct bpf_fib_lookup *fib,
					 const struct in6_addr *src, const struct in6_addr *dst,
					 __u8 l4)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET6;
	fib->l4_protocol = l4;
	fib->ifindex = skb->ingress_ifindex;
	__builtin_memcpy(fib->ipv6_src, src, 16);
	__builtin_memcpy(fib->ipv6_dst, dst, 16);
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

SEC("tc")
int mrc_trim(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct rstats *rs = bpf_map_lookup_elem(&rstats, &zero);
	struct ipv6hdr ip6;
	__u8 in6[8] = {}; /* IPv6-in-IPv6: the inner header's first 8 bytes */
	struct srh_fixed rh;
	struct in6_addr final, eff;
	struct udphdr udp;
	__u16 hdr[KEEP_MAX / 2]; /* BTH + RETH (+ ImmDt) (+ security block), as 16-bit words */
	__u8 *hb = (__u8 *)hdr;
	__u32 l4off = ETH_HLEN + sizeof(struct ipv6hdr);
	__u8 proto;
	int has_srh = 0, srh_ok = 0, encap = 0;
	__u32 keep = 0;
	int ctrl = 0; /* an MRC ACK/NACK or probe */

	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)))
		return TC_ACT_OK;
	if (rs)
		rs->seen++;
	proto = ip6.nexthdr;
	final = ip6.daddr;
	eff = ip6.daddr;

	if (proto == NEXTHDR_IPV6) {
		/* uSID routes: the outer destination is a container, the inner header is the
		 * datagram's own (its addresses are the UDP checksum's) */
		if (bpf_skb_load_bytes(skb, l4off, in6, sizeof(in6)) ||
		    bpf_skb_load_bytes(skb, l4off + 24, &final, sizeof(final)))
			return TC_ACT_OK;
		encap = 1;
		proto = in6[6]; /* next header */
		l4off += sizeof(struct ipv6hdr);
	}

	if (proto == NEXTHDR_ROUTING) {
		if (bpf_skb_load_bytes(skb, l4off, &rh, sizeof(rh)))
			return TC_ACT_OK;
		has_srh = 1;
		if (rh.type == SRH_TYPE && rh.segments_left <= rh.last_entry &&
		    ((__u32)rh.last_entry + 1) * 2 <= rh.hdrlen) {
			/* Segment List[0] is the final destination (RFC 8754, reversed order) */
			if (bpf_skb_load_bytes(skb, l4off + 8, &final, sizeof(final)))
				return TC_ACT_OK;
			srh_ok = 1;
		}
		proto = rh.nexthdr;
		l4off += ((__u32)rh.hdrlen + 1) * 8;
	}

	/* Which port will the kernel forward this packet out of? */
	struct bpf_fib_lookup fib;
	__u8 l4 = encap ? NEXTHDR_IPV6 : proto;
	int rc = egress_lookup(skb, &fib, &ip6.saddr, &eff, l4);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED && srh_ok && rh.segments_left > 0) {
		/* Addressed to this router's SID: the kernel will advance the SRH and forward
		 * towards Segment List[Segments Left - 1]. */
		__u32 off = l4off - ((__u32)rh.hdrlen + 1) * 8 + 8 +
			    ((__u32)rh.segments_left - 1) * 16;
		if (bpf_skb_load_bytes(skb, off, &eff, sizeof(eff)))
			return TC_ACT_OK;
		rc = egress_lookup(skb, &fib, &ip6.saddr, &eff, l4);
	}
	if (encap && rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* Addressed to this router's own micro-SID (a seg6local route): the kernel will
		 * shift the container and forward on what it becomes */
		usid_shift(&eff);
		rc = egress_lookup(skb, &fib, &ip6.saddr, &eff, l4);
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		if (rs)
			rs->not_fwd++;
		return TC_ACT_OK;
	}
	__u32 oif = fib.ifindex;
	struct egress *eg = bpf_map_lookup_elem(&egress, &oif);
	if (!eg) {
		if (rs)
			rs->no_port++;
		return TC_ACT_OK;
	}

	__u32 len = skb->len; /* at tc ingress: from the Ethernet header on, as tbf counts */
	if (skb->gso_segs > 1) {
		if (rs)
			rs->gso++;
	} else if (proto == IPPROTO_UDP && (!has_srh || srh_ok) &&
		   !bpf_skb_load_bytes(skb, l4off, &udp, sizeof(udp)) &&
		   !bpf_skb_load_bytes(skb, l4off + sizeof(udp), hdr, BTH_LEN)) {
		__u32 ulen = bpf_ntohs(udp.len);
		__u32 plen_udp = ulen - sizeof(udp);
		__u8 op = hb[0];
		__u32 want = 0;

		if (op == OP_WRITE_ONLY)
			want = KEEP_WRITE;
		else if (op == OP_WRITE_ONLY_IMM)
			want = KEEP_WRITE_IMM;
		/* TVer 0, not trimmed before, RETH DMA Length == the payload actually present */
		if (want && (hb[1] & 0x0f) == 0 && !(hb[4] & BTH_TRIMMED) &&
		    l4off + ulen == len &&
		    !bpf_skb_load_bytes(skb, l4off + sizeof(udp) + BTH_LEN, &hb[BTH_LEN],
					KEEP_WRITE - BTH_LEN)) {
			__u32 dma = ((__u32)hb[24] << 24) | ((__u32)hb[25] << 16) |
				    ((__u32)hb[26] << 8) | hb[27];
			__u32 sec = (hb[8] & BTH_SECURE) ? SEC_BLOCK : 0;
			__u32 icv = sec ? SEC_ICV : 0;
			if (dma > 0 && dma < 65536 && ulen == sizeof(udp) + want + sec + dma + icv)
				keep = want + sec;
		}
		/* small MRC control packets: ACK/NACK and probes (with or without security block),
		 * and headers trimmed by an earlier hop: all go in the priority band */
		if ((hb[1] & 0x0f) == 0 && l4off + ulen == len &&
		    ((want && (hb[4] & BTH_TRIMMED)) ||
		     (op == OP_ACK && (plen_udp == ACK_LEN || plen_udp == ACK_LEN + SEC_BLOCK)) ||
		     ((op == OP_PROBE || op == OP_PROBE_REPLY) &&
		      (plen_udp == PROBE_LEN || plen_udp == PROBE_LEN + SEC_BLOCK))))
			ctrl = 1;
		/* the bytes kept beyond BTH + RETH feed the checksum: load them (constant sizes) */
		__u32 more = l4off + sizeof(udp) + KEEP_WRITE;
		if (keep == KEEP_WRITE_IMM) {
			if (bpf_skb_load_bytes(skb, more, &hb[KEEP_WRITE], 4))
				keep = 0;
		} else if (keep == KEEP_WRITE + SEC_BLOCK) {
			if (bpf_skb_load_bytes(skb, more, &hb[KEEP_WRITE], SEC_BLOCK))
				keep = 0;
		} else if (keep == KEEP_WRITE_IMM + SEC_BLOCK) {
			if (bpf_skb_load_bytes(skb, more, &hb[KEEP_WRITE], 4 + SEC_BLOCK))
				keep = 0;
		}
	}

	/* --- the virtual queue ------------------------------------------------------------ */
	__u32 tlen = l4off + sizeof(udp) + keep; /* length after a trim */
	__u64 now = bpf_ktime_get_ns();
	int trim = 0, mark = 0;
	__u32 flags;
	__u8 ecn = (((__u8 *)&ip6)[1] >> IP6_ECN_SHIFT) & ECN_MASK;

	bpf_spin_lock(&eg->lock);
	if (now > eg->last_ns) {
		__u64 dt = now - eg->last_ns;
		if (dt > NSEC_PER_SEC)
			dt = NSEC_PER_SEC;
		__u64 drained = dt * eg->rate / NSEC_PER_SEC;
		if (drained >= eg->backlog) {
			eg->backlog = 0;
			eg->last_ns = now;
		} else if (drained) {
			/* advance by exactly the time those bytes took: no rounding loss */
			eg->backlog -= drained;
			eg->last_ns += drained * NSEC_PER_SEC / eg->rate;
		}
	}
	eg->pkts++;
	eg->bytes += len;
	if (keep)
		eg->data_pkts++;
	if (ecn)
		eg->ect_pkts++;
	flags = eg->flags;
	if (eg->backlog + len > eg->limit && keep && (flags & EGRESS_TRIM)) {
		trim = 1;
		eg->backlog += tlen;
		eg->trimmed++;
		eg->trimmed_bytes += len - tlen;
	} else if (eg->backlog + len > eg->hard_limit) {
		eg->tail_drops++;
	} else {
		if (eg->backlog + len > eg->limit)
			eg->over++;
		/* joins the data queue above the ECN threshold: CE, if it is ECN-capable */
		if (eg->backlog + len > eg->ecn_limit && !ctrl && ecn && ecn != ECN_CE &&
		    !(flags & EGRESS_LASTHOP)) {
			mark = 1;
			eg->ce_marked++;
		}
		eg->backlog += len;
	}
	if ((flags & EGRESS_PRIO) && (trim || ctrl))
		eg->prio_pkts++;
	if (eg->backlog > eg->max_backlog)
		eg->max_backlog = eg->backlog;
	bpf_spin_unlock(&eg->lock);

	if (flags & EGRESS_PRIO)
		skb->priority = (trim || ctrl) ? PRIO_CLASS : DATA_CLASS;
	if (mark) {
		__u8 b1 = ((__u8 *)&ip6)[1] | (ECN_CE << IP6_ECN_SHIFT);
		__u8 i1 = in6[1];
		int err = bpf_skb_store_bytes(skb, ETH_HLEN + 1, &b1, 1, BPF_F_RECOMPUTE_CSUM);
		if (!err && encap && ((i1 >> IP6_ECN_SHIFT) & ECN_MASK)) {
			i1 |= ECN_CE << IP6_ECN_SHIFT;
			err = bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr) + 1, &i1, 1,
						  BPF_F_RECOMPUTE_CSUM);
		}
		if (err)
			count_error(eg);
	}
	if (!trim)
		return TC_ACT_OK;

	/* --- cut the payload, fix lengths and checksum, mark -------------------------------- */
	__u16 plen = bpf_htons((__u16)(tlen - ETH_HLEN - sizeof(struct ipv6hdr)));
	__u16 nulen = bpf_htons((__u16)(sizeof(udp) + keep));
	hb[4] |= BTH_TRIMMED | ((flags & EGRESS_LASTHOP) ? BTH_LASTHOP : 0);

	/* UDP checksum over the IPv6 pseudo-header (the datagram's own source, its final
	 * destination), UDP header, kept bytes.  In IPv6-in-IPv6 the source is the inner
	 * header's: read into ip6.saddr, whose outer value only the route lookups needed. */
	if (encap && bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr) + 8, &ip6.saddr,
					sizeof(ip6.saddr)))
		return TC_ACT_OK;
	__u32 sum = sum_addr(&ip6.saddr) + sum_addr(&final);
	sum += nulen + bpf_htons(IPPROTO_UDP);
	sum += udp.source + udp.dest + nulen;
#pragma unroll
	for (int i = 0; i < KEEP_MAX / 2; i++)
		if (i < keep / 2)
			sum += hdr[i];
	__u16 csum = ~fold(sum) & 0xffff;
	if (csum == 0)
		csum = 0xffff;

	__u16 lc[2] = {nulen, csum}; /* UDP length and checksum are adjacent */

	/* change_tail is the expensive step: it makes the whole skb private and linear first */
	if (bpf_skb_change_tail(skb, tlen, 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + 4, &plen, 2, BPF_F_RECOMPUTE_CSUM) ||
	    /* the inner header's payload is the UDP datagram: its new length, lc[0] */
	    (encap && bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr) + 4, lc, 2,
					  BPF_F_RECOMPUTE_CSUM)) ||
	    bpf_skb_store_bytes(skb, l4off + 4, lc, 4, BPF_F_RECOMPUTE_CSUM) ||
	    bpf_skb_store_bytes(skb, l4off + sizeof(udp) + 4, &hb[4], 1, BPF_F_RECOMPUTE_CSUM))
		count_error(eg);
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
