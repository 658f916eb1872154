-- mrc.lua: a Wireshark / tshark post-dissector for the parts of an MRC datagram that the
-- stock InfiniBand (RoCEv2) dissector leaves undecoded.
--
-- Layouts: docs/PROTOCOL.md sections 3.1-3.5 and 11 (mrc/wire.py, mrc/security/packet.py).
-- Load it with  tshark -X lua_script:/path/to/mrc.lua ...  or copy it into Wireshark's
-- personal Lua plugins folder (Help > About Wireshark > Folders).
--
-- Why a post-dissector: it runs after the stock dissector on every frame and only adds an
-- "MRC" tree, so everything the InfiniBand dissector shows (infiniband.*) stays as it is,
-- and it reads the UDP payload itself, so it also works on a port the stock dissector does
-- not claim (preference mrc.udp_port, e.g. -o mrc.udp_port:18515).
--
-- Plain Lua arithmetic only (no bit32 / bit operators): it runs on Wireshark's Lua 5.1/5.2
-- and 5.4 builds alike.

local mrc = Proto("mrc", "MRC (Multipath Reliable Connection)")

local OP_WRITE_ONLY = 0x0A
local OP_WRITE_ONLY_IMM = 0x0B
local OP_ACK = 0x11
local OP_PROBE = 0xC0
local OP_PROBE_REPLY = 0xC1

local BTH_LEN = 12
local DATA_HDR_LEN = 28
local DATA_IMM_HDR_LEN = 32
local ACK_LEN = 40
local PROBE_LEN = 28
local SEC_BLOCK_LEN = 28
local ICV_LEN = 16

local kinds = {
    [OP_WRITE_ONLY] = "RDMA_WRITE_ONLY",
    [OP_WRITE_ONLY_IMM] = "RDMA_WRITE_ONLY_IMM",
    [OP_ACK] = "ACKNOWLEDGE",
    [OP_PROBE] = "PROBE",
    [OP_PROBE_REPLY] = "PROBE_REPLY",
}

-- wire.NackCode: InfiniBand's codes 0-3, MRC's trim codes 16 and 17
local nak_names = {
    [0] = "PSN_SEQUENCE_ERROR",
    [1] = "INVALID_REQUEST",
    [2] = "REMOTE_ACCESS_ERROR",
    [3] = "REMOTE_OPERATIONAL_ERROR",
    [16] = "TRIMMED",
    [17] = "TRIMMED_LASTHOP",
}

local f = {
    opcode = ProtoField.uint8("mrc.opcode", "OpCode", base.HEX, kinds),
    kind = ProtoField.string("mrc.kind", "Packet kind"),
    -- BTH byte 4 (section 3.1)
    fecn = ProtoField.bool("mrc.fecn", "FECN (F, CE mark)", 8, nil, 0x80),
    becn = ProtoField.bool("mrc.becn", "BECN (B, receiver's ECN echo)", 8, nil, 0x40),
    trimmed = ProtoField.bool("mrc.trimmed", "TRIMMED mark (T)", 8, nil, 0x20),
    lasthop = ProtoField.bool("mrc.lasthop", "LASTHOP mark (L)", 8, nil, 0x10),
    -- BTH byte 8
    ackreq = ProtoField.bool("mrc.ackreq", "AckReq (A)", 8, nil, 0x80),
    secure = ProtoField.bool("mrc.secure", "Security block present (S)", 8, nil, 0x40),
    tlp = ProtoField.bool("mrc.tlp", "Tail loss probe (P)", 8, nil, 0x20),
    qpn = ProtoField.uint24("mrc.qpn", "Destination QP", base.HEX),
    psn = ProtoField.uint24("mrc.psn", "PSN", base.DEC),
    -- data packets (3.2, 3.3, 9)
    dma_len = ProtoField.uint32("mrc.dma_len", "RETH DMA Length", base.DEC),
    payload_len = ProtoField.uint32("mrc.payload_len", "Payload bytes present", base.DEC),
    is_trimmed = ProtoField.bool("mrc.is_trimmed", "Trimmed (payload shorter than DMA Length)"),
    -- ACK / NAK (3.4)
    ack_psn = ProtoField.uint24("mrc.ack.psn", "ACK PSN (cumulative)", base.DEC),
    syndrome = ProtoField.uint8("mrc.ack.syndrome", "AETH syndrome", base.HEX),
    is_nak = ProtoField.bool("mrc.ack.is_nak", "NAK"),
    nak_code = ProtoField.uint8("mrc.ack.nak_code", "NAK code", base.DEC, nak_names),
    nak_name = ProtoField.string("mrc.ack.nak_name", "NAK code name"),
    subject_psn = ProtoField.uint32("mrc.ack.subject_psn", "Subject PSN", base.DEC, nil, 0x00FFFFFF),
    subject_dup = ProtoField.bool("mrc.ack.subject_dup", "Subject arrived before (D)", 32, nil, 0x80000000),
    sack_base = ProtoField.uint32("mrc.ack.sack_base", "SACK base PSN", base.DEC, nil, 0x00FFFFFF),
    bitmap = ProtoField.uint64("mrc.ack.bitmap", "SACK bitmap", base.HEX),
    sack_count = ProtoField.uint8("mrc.ack.sack_count", "SACKed PSNs", base.DEC),
    sacked_psn = ProtoField.uint24("mrc.ack.sacked_psn", "SACKed PSN", base.DEC),
    ack_ev = ProtoField.uint32("mrc.ack.ev",
        "Echoed EV (32 bits: UDP source port << 16 | flow label bits)", base.HEX),
    ack_ev_port = ProtoField.uint32("mrc.ack.ev_port", "EV UDP source port", base.DEC, nil,
        0xFFFF0000),
    ack_ev_label = ProtoField.uint32("mrc.ack.ev_label", "EV flow label bits", base.HEX, nil,
        0x0000FFFF),
    port_state = ProtoField.uint16("mrc.ack.port_state", "Port state (bit p: plane p up)", base.HEX),
    ack_delay = ProtoField.uint16("mrc.ack.ack_delay", "ACK Delay (units of 8 us, 0: unknown)",
        base.DEC),
    ack_delay_us = ProtoField.uint32("mrc.ack.ack_delay_us", "ACK Delay (us)", base.DEC),
    -- probes (3.5)
    probe_seq = ProtoField.uint24("mrc.probe.seq", "Probe Seq (BTH PSN)", base.DEC),
    probe_ev = ProtoField.uint32("mrc.probe.ev",
        "Probed EV (32 bits: UDP source port << 16 | flow label bits)", base.HEX),
    probe_ev_port = ProtoField.uint32("mrc.probe.ev_port", "EV UDP source port", base.DEC, nil,
        0xFFFF0000),
    probe_ev_label = ProtoField.uint32("mrc.probe.ev_label", "EV flow label bits", base.HEX, nil,
        0x0000FFFF),
    probe_flags = ProtoField.uint16("mrc.probe.flags", "Flags", base.HEX),
    probe_reserved = ProtoField.uint16("mrc.probe.reserved", "Reserved", base.HEX),
    token = ProtoField.uint64("mrc.probe.token", "Token", base.HEX),
    token_tag = ProtoField.uint24("mrc.probe.tag", "Token tag (24 bits)", base.HEX),
    token_time = ProtoField.uint64("mrc.probe.time_us", "Token send time (us, 40 bits)", base.DEC),
    -- security block (11)
    key_id = ProtoField.uint32("mrc.sec.key_id", "Key ID", base.HEX),
    counter = ProtoField.uint64("mrc.sec.counter", "Counter", base.DEC),
    header_icv = ProtoField.bytes("mrc.sec.header_icv", "Header ICV"),
    icv_integrity = ProtoField.bytes("mrc.sec.payload_icv_integrity",
        "Payload ICV if integrity mode (after the block)"),
    icv_encrypt = ProtoField.bytes("mrc.sec.payload_icv_encrypt",
        "Payload ICV if encrypt mode (last 16 bytes)"),
}
mrc.fields = {
    f.opcode, f.kind, f.fecn, f.becn, f.trimmed, f.lasthop, f.ackreq, f.secure, f.tlp,
    f.qpn, f.psn,
    f.dma_len, f.payload_len, f.is_trimmed,
    f.ack_psn, f.syndrome, f.is_nak, f.nak_code, f.nak_name, f.subject_psn, f.subject_dup,
    f.sack_base, f.bitmap, f.sack_count, f.sacked_psn, f.ack_ev, f.ack_ev_port, f.ack_ev_label,
    f.port_state, f.ack_delay, f.ack_delay_us,
    f.probe_seq, f.probe_ev, f.probe_ev_port, f.probe_ev_label, f.probe_flags, f.probe_reserved,
    f.token, f.token_tag, f.token_time,
    f.key_id, f.counter, f.header_icv, f.icv_integrity, f.icv_encrypt,
}

local ex_trimmed = ProtoExpert.new("mrc.expert.trimmed", "Trimmed data packet",
    expert.group.SEQUENCE, expert.severity.NOTE)
local ex_short = ProtoExpert.new("mrc.expert.short", "Shorter than its MRC headers",
    expert.group.MALFORMED, expert.severity.WARN)
mrc.experts = { ex_trimmed, ex_short }

mrc.prefs.udp_port = Pref.uint("UDP port", 4791,
    "Destination UDP port of MRC datagrams (the peer's listen port; 4791 by default)")

local udp_dstport = Field.new("udp.dstport")
local udp_payload = Field.new("udp.payload")

-- bit k (0 = least significant) of a non-negative integer, without bit operators
local function bit_set(v, k)
    return math.floor(v / 2 ^ k) % 2 == 1
end

-- A 32-bit EV (4 bytes at `at`) as a subtree with its two parts, and its Info column text
-- "port/0xlabel" (wire.ev_value: UDP source port << 16 | low 16 bits of the flow label)
local function add_ev(t, buf, at, f_ev, f_port, f_label)
    local range = buf(at, 4)
    local et = t:add(f_ev, range)
    et:add(f_port, range)
    et:add(f_label, range)
    return string.format("%d/0x%04x", buf(at, 2):uint(), buf(at + 2, 2):uint())
end

local function add_bth_marks(t, buf)
    local b4 = buf(4, 1)
    local b8 = buf(8, 1)
    t:add(f.fecn, b4)
    t:add(f.becn, b4)
    t:add(f.trimmed, b4)
    t:add(f.lasthop, b4)
    t:add(f.ackreq, b8)
    t:add(f.secure, b8)
    t:add(f.tlp, b8)
    t:add(f.qpn, buf(5, 3))
end

-- The security block at `at`, and (data packets) where the payload ICV would be in each mode.
-- The mode is agreed in the hello on the side channel, not carried in the datagram, so both
-- candidates are shown; `payload_part` is the length after the block (ICV + payload), or nil.
local function add_security(t, buf, at, payload_part)
    local len = buf:len()
    if len < at + SEC_BLOCK_LEN then
        t:add_proto_expert_info(ex_short, "S set but the 28-byte security block is cut")
        return
    end
    local st = t:add(buf(at, SEC_BLOCK_LEN), "Security block")
    st:add(f.key_id, buf(at, 4))
    st:add(f.counter, buf(at + 4, 8))
    st:add(f.header_icv, buf(at + 12, 16))
    if payload_part ~= nil and payload_part >= ICV_LEN then
        local pay = at + SEC_BLOCK_LEN
        st:add(f.icv_integrity, buf(pay, ICV_LEN))
        st:add(f.icv_encrypt, buf(len - ICV_LEN, ICV_LEN))
    end
end

local function dissect_data(t, buf, pinfo, opcode, secure)
    local hdr = (opcode == OP_WRITE_ONLY_IMM) and DATA_IMM_HDR_LEN or DATA_HDR_LEN
    local len = buf:len()
    if len < hdr then
        t:add_proto_expert_info(ex_short)
        return
    end
    local dma = buf(24, 4):uint()
    local overhead = secure and (SEC_BLOCK_LEN + ICV_LEN) or 0
    local present = len - hdr - overhead
    if present < 0 then
        present = 0
    end
    local trimmed = len < hdr + overhead + dma
    t:add(f.psn, buf(9, 3))
    t:add(f.dma_len, buf(24, 4))
    local pl_range = (len > hdr) and buf(hdr) or buf(24, 4)
    t:add(f.payload_len, pl_range, present)
    local it = t:add(f.is_trimmed, pl_range, trimmed)
    if trimmed then
        it:add_proto_expert_info(ex_trimmed,
            string.format("Trimmed: %d of %d payload bytes present", present, dma))
        pinfo.cols.info:append(" [MRC trimmed]")
    end
    if secure then
        local part = nil
        if not trimmed then
            part = len - hdr - SEC_BLOCK_LEN
        end
        add_security(t, buf, hdr, part)
    end
end

local function dissect_ack(t, buf, pinfo, secure)
    if buf:len() < ACK_LEN then
        t:add_proto_expert_info(ex_short)
        return
    end
    local syn = buf(12, 1):uint()
    local is_nak = math.floor(syn / 32) % 4 == 3 -- bits 6-5 = 0b11
    t:add(f.ack_psn, buf(9, 3))
    t:add(f.syndrome, buf(12, 1))
    t:add(f.is_nak, buf(12, 1), is_nak)
    local label = "MRC ACK"
    if is_nak then
        local code = syn % 32
        local name = nak_names[code] or string.format("UNKNOWN_%d", code)
        t:add(f.nak_code, buf(12, 1), code)
        t:add(f.nak_name, buf(12, 1), name)
        label = "MRC NAK " .. name
    end
    t:add(f.subject_psn, buf(16, 4))
    t:add(f.subject_dup, buf(16, 4))
    local base_psn = buf(21, 3):uint()
    t:add(f.sack_base, buf(20, 4))
    t:add(f.bitmap, buf(24, 8))
    -- bit i of the big-endian 64-bit bitmap = PSN base + i; bit 0 is the low bit of byte 31
    local psns = {}
    for i = 0, 63 do
        local byte = buf(31 - math.floor(i / 8), 1):uint()
        if bit_set(byte, i % 8) then
            psns[#psns + 1] = (base_psn + i) % 0x1000000
        end
    end
    t:add(f.sack_count, buf(24, 8), #psns)
    if #psns > 0 then
        local lt = t:add(buf(24, 8), string.format("SACKed PSNs (%d)", #psns))
        for _, p in ipairs(psns) do
            lt:add(f.sacked_psn, buf(24, 8), p)
        end
    end
    local ev = add_ev(t, buf, 32, f.ack_ev, f.ack_ev_port, f.ack_ev_label)
    t:add(f.port_state, buf(36, 2))
    t:add(f.ack_delay, buf(38, 2))
    t:add(f.ack_delay_us, buf(38, 2), buf(38, 2):uint() * 8)
    pinfo.cols.info:append(string.format(" [%s subject=%d ev=%s]", label,
        buf(17, 3):uint(), ev))
    if secure then
        add_security(t, buf, ACK_LEN, nil)
    end
end

local function dissect_probe(t, buf, pinfo, opcode, secure)
    if buf:len() < PROBE_LEN then
        t:add_proto_expert_info(ex_short)
        return
    end
    t:add(f.probe_seq, buf(9, 3))
    local ev = add_ev(t, buf, 12, f.probe_ev, f.probe_ev_port, f.probe_ev_label)
    t:add(f.probe_flags, buf(16, 2))
    t:add(f.probe_reserved, buf(18, 2))
    local tok = t:add(f.token, buf(20, 8))
    tok:add(f.token_tag, buf(20, 3))
    tok:add(f.token_time, buf(23, 5))
    pinfo.cols.info:append(string.format(" [MRC %s ev=%s]", kinds[opcode], ev))
    if secure then
        add_security(t, buf, PROBE_LEN, nil)
    end
end

local function dissect_one(buf, pinfo, tree)
    if buf:len() < BTH_LEN then
        return
    end
    local opcode = buf(0, 1):uint()
    local t = tree:add(mrc, buf(), "MRC (Multipath Reliable Connection)")
    t:add(f.opcode, buf(0, 1))
    t:add(f.kind, buf(0, 1), kinds[opcode] or "other")
    add_bth_marks(t, buf)
    local secure = bit_set(buf(8, 1):uint(), 6)
    if opcode == OP_WRITE_ONLY or opcode == OP_WRITE_ONLY_IMM then
        dissect_data(t, buf, pinfo, opcode, secure)
    elseif opcode == OP_ACK then
        dissect_ack(t, buf, pinfo, secure)
    elseif opcode == OP_PROBE or opcode == OP_PROBE_REPLY then
        dissect_probe(t, buf, pinfo, opcode, secure)
    end
end

function mrc.dissector(_tvb, pinfo, tree)
    local dports = { udp_dstport() }
    if #dports == 0 then
        return
    end
    local payloads = { udp_payload() }
    local port = mrc.prefs.udp_port
    -- one UDP header per datagram normally; an ICMP error quoting one adds a second, whose
    -- payload may be absent: then the pairs cannot be matched and only the outer one is read
    if #payloads ~= #dports then
        dports = { dports[1] }
    end
    for i, dp in ipairs(dports) do
        local pl = payloads[i]
        if dp.value == port and pl ~= nil then
            dissect_one(pl.range:tvb(), pinfo, tree)
        end
    end
end

register_postdissector(mrc)
